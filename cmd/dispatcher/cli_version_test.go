package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

var goPlatform = runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH

func TestDescribeVersion(t *testing.T) {
	vcs := func(mainVersion string, kv ...string) *debug.BuildInfo {
		info := &debug.BuildInfo{Main: debug.Module{Path: "github.com/dispatcher/dispatcher", Version: mainVersion}}
		for i := 0; i+1 < len(kv); i += 2 {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return info
	}
	const rev = "14d1be79531f79bfbb1593ba7f0e5f9397363a6e"
	checkout := vcs("v0.0.0-20261124211128-14d1be79531f", "vcs.revision", rev, "vcs.time", "2026-11-24T21:11:28Z", "vcs.modified", "false")
	for _, c := range []struct {
		name              string
		ver, commit, date string
		info              *debug.BuildInfo
		want              string
	}{
		{"release build", "v0.2.0", rev, "2026-12-01T10:00:00Z", checkout,
			"v0.2.0 (commit 14d1be79531f of 2026-12-01T10:00:00Z, " + goPlatform + ")"},
		{"snapshot build of a dirty tree", "v0.2.0-snapshot.14d1be7", rev + "+dirty", "2026-12-01T10:00:00Z", nil,
			"v0.2.0-snapshot.14d1be7 (commit 14d1be79531f+dirty of 2026-12-01T10:00:00Z, " + goPlatform + ")"},
		{"go build in a checkout", "", "", "", checkout,
			"devel (commit 14d1be79531f of 2026-11-24T21:11:28Z, " + goPlatform + ")"},
		{"go build with uncommitted changes", "", "", "",
			vcs("v0.0.0-20261124211128-14d1be79531f+dirty", "vcs.revision", rev, "vcs.time", "2026-11-24T21:11:28Z", "vcs.modified", "true"),
			"devel (commit 14d1be79531f+dirty of 2026-11-24T21:11:28Z, " + goPlatform + ")"},
		{"go build after a tag", "", "", "", vcs("v0.1.1-0.20261124211128-14d1be79531f", "vcs.revision", rev),
			"devel (commit 14d1be79531f, " + goPlatform + ")"},
		{"go build on a tag", "", "", "", vcs("v0.1.0", "vcs.revision", rev, "vcs.modified", "false"),
			"v0.1.0 (commit 14d1be79531f, " + goPlatform + ")"},
		{"go install module@version", "", "", "", vcs("v0.2.0"),
			"v0.2.0 (commit unknown, " + goPlatform + ")"},
		{"no VCS stamp", "", "", "", vcs("(devel)"),
			"devel (commit unknown, " + goPlatform + ")"},
		{"no build info", "", "", "", nil,
			"devel (commit unknown, " + goPlatform + ")"},
		{"commit only at link time", "", "abc123", "", nil,
			"devel (commit abc123, " + goPlatform + ")"},
	} {
		if got := describeVersion(c.ver, c.commit, c.date, c.info); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}

// buildDispatcher builds ./cmd/dispatcher into dir with extra go build
// arguments; GOFLAGS is set so that a -buildvcs=false of the machine's go
// env does not decide the test.
func buildDispatcher(t *testing.T, name string, args ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", append(append([]string{"build", "-o", bin}, args...), ".")...)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=auto")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, out)
	}
	return bin
}

func versionOf(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	return string(out)
}

// TestVersionOfReleaseBuild: the release build's -ldflags (see
// .goreleaser.yaml) name the version, commit and date.
func TestVersionOfReleaseBuild(t *testing.T) {
	bin := buildDispatcher(t, "dispatcher-release", "-ldflags",
		"-X main.buildVersion=v1.2.3 -X main.buildCommit=0123456789abcdef0123456789abcdef01234567 -X main.buildDate=2026-12-01T10:00:00Z")
	want := "dispatcher v1.2.3 (commit 0123456789ab of 2026-12-01T10:00:00Z, " + goPlatform + ")\n"
	if got := versionOf(t, bin); got != want {
		t.Errorf("--version of a release build:\n got %q\nwant %q", got, want)
	}
}

// TestVersionOfDevelopmentBuild: a plain go build says devel, with the
// checkout's commit when the go command stamped it. In a clone (not a git
// worktree, which the go command does not stamp) it must have: the commit
// is git's HEAD, with +dirty if git status shows changes.
func TestVersionOfDevelopmentBuild(t *testing.T) {
	bin := buildDispatcher(t, "dispatcher-devel")
	got := versionOf(t, bin)
	if !strings.HasPrefix(got, "dispatcher devel (commit ") || !strings.HasSuffix(got, goPlatform+")\n") {
		t.Fatalf("--version of a development build: %q, want dispatcher devel (commit ...)", got)
	}
	git := func(args ...string) (string, bool) {
		out, err := exec.Command("git", args...).Output()
		return strings.TrimSpace(string(out)), err == nil
	}
	head, inGit := git("rev-parse", "HEAD")
	gitDir, _ := git("rev-parse", "--absolute-git-dir")
	commonDir, _ := git("rev-parse", "--path-format=absolute", "--git-common-dir")
	if !inGit || gitDir != commonDir {
		t.Logf("not a plain git clone (a worktree or no git): %q", got)
		return
	}
	status, _ := git("status", "--porcelain")
	want := "dispatcher devel (commit " + head[:12]
	if status != "" {
		want += "+dirty"
	}
	if !strings.HasPrefix(got, want+" of ") {
		t.Errorf("--version of a development build in a clone at %s: %q, want it to begin %q", head, got, want)
	}
	t.Logf("%s", strings.TrimSpace(got))
}
