package main

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
)

// Set at link time by the release build (.goreleaser.yaml):
//
//	go build -ldflags "-X main.buildVersion=v0.2.0 -X main.buildCommit=<hash>
//	  -X main.buildDate=2026-11-24T21:11:28Z" ./cmd/dispatcher
//
// buildDate is the commit's date, not the time of the build, so that
// building a release again gives the same binary.
//
// A build without them is a development build: "devel", with the commit
// and its time from the build's VCS stamp when there is one (go build in a
// git checkout, unless -buildvcs=false), "+dirty" for uncommitted changes.
// go install of a published version names that version.
var buildVersion, buildCommit, buildDate string

// pseudoVersion matches the versions the go command makes up for a commit
// that is no release: v0.0.0-20261124211128-14d1be795316 and the like,
// with +dirty for uncommitted changes.
var pseudoVersion = regexp.MustCompile(`\d{14}-[0-9a-f]{12}|\+dirty`)

// version is what dispatcher --version prints after "dispatcher ":
//
//	v0.2.0 (commit 14d1be795316 of 2026-11-24T21:11:28Z, go1.26.8 linux/amd64)
//	devel (commit 14d1be795316+dirty of 2026-11-24T21:11:28Z, go1.26.8 linux/amd64)
func version() string {
	info, _ := debug.ReadBuildInfo()
	return describeVersion(buildVersion, buildCommit, buildDate, info)
}

// describeVersion makes version's text from the link-time values and the
// build info (nil when there is none). The commit is shortened to 12
// digits, keeping a "+dirty".
func describeVersion(ver, commit, date string, info *debug.BuildInfo) string {
	var rev, modified, vcsTime string
	if info != nil {
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = "+dirty"
				}
			case "vcs.time":
				vcsTime = s.Value
			}
		}
		// A release's module version, as go install module@v0.2.0 gives it;
		// not the pseudo-version go build makes up in a checkout.
		if mv := info.Main.Version; ver == "" && strings.HasPrefix(mv, "v") && !pseudoVersion.MatchString(mv) {
			ver = mv
		}
	}
	if ver == "" {
		ver = "devel"
	}
	if commit == "" && rev != "" {
		commit, date = rev+modified, vcsTime
	}
	if commit == "" {
		commit, date = "unknown", ""
	}
	if i := strings.IndexByte(commit, '+'); i > 12 {
		commit = commit[:12] + commit[i:]
	} else if i < 0 && len(commit) > 12 {
		commit = commit[:12]
	}
	if date != "" {
		commit += " of " + date
	}
	return ver + " (commit " + commit + ", " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH + ")"
}
