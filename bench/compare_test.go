package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

func TestSpreadOf(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		in   []float64
		want *Spread
	}{
		{[]float64{3, 1, 2}, &Spread{Median: 2, Min: 1, Max: 3, N: 3}},
		{[]float64{4, 1, 2, 10}, &Spread{Median: 3, Min: 1, Max: 10, N: 4}},
		{[]float64{5}, &Spread{Median: 5, Min: 5, Max: 5, N: 1}},
		{[]float64{nan, 7, nan, 1}, &Spread{Median: 4, Min: 1, Max: 7, N: 2}},
		{[]float64{nan, nan}, nil},
		{nil, nil},
	} {
		got := spreadOf(tc.in)
		if (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("spreadOf(%v) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestRatioOf(t *testing.T) {
	nan := math.NaN()
	ref, cur := []float64{2, 4, 3}, []float64{1, 4, 6}
	got := ratioOf(spreadOf(ref), spreadOf(cur), ref, cur)
	// Medians 3 and 4; per pair 0.5, 1, 2.
	if want := (Ratio{OfMedians: 4.0 / 3, PairMin: 0.5, PairMax: 2, Pairs: 3}); got == nil || *got != want {
		t.Errorf("ratio = %+v, want %+v", got, want)
	}
	// A pair that lacks a side, or whose REF is 0, gives no per-pair ratio.
	ref, cur = []float64{2, nan, 0}, []float64{3, 5, 1}
	got = ratioOf(spreadOf(ref), spreadOf(cur), ref, cur)
	if want := (Ratio{OfMedians: 3.0, PairMin: 1.5, PairMax: 1.5, Pairs: 1}); got == nil || *got != want {
		t.Errorf("ratio with gaps = %+v, want %+v", got, want)
	}
	// No pair in which both sides gave it: the ratio of medians alone.
	ref, cur = []float64{2, nan}, []float64{nan, 4}
	got = ratioOf(spreadOf(ref), spreadOf(cur), ref, cur)
	if want := (Ratio{OfMedians: 2}); got == nil || *got != want {
		t.Errorf("ratio without a full pair = %+v, want %+v", got, want)
	}
	if got := ratioOf(nil, spreadOf(cur), nil, cur); got != nil {
		t.Errorf("ratio without REF = %+v, want nil", got)
	}
	if got := ratioOf(&Spread{Median: 0, N: 1}, &Spread{Median: 1, N: 1}, []float64{0}, []float64{1}); got != nil {
		t.Errorf("ratio over a REF median of 0 = %+v, want nil", got)
	}
}

func TestCompareCells(t *testing.T) {
	for _, tc := range []struct {
		s    *Spread
		runs int
		want string
	}{
		{&Spread{Median: 1.5, Min: 1.25, Max: 2, N: 3}, 3, "1.50 (1.25–2.00)"},
		{&Spread{Median: 1.5, Min: 1.5, Max: 1.5, N: 1}, 1, "1.50"},
		{&Spread{Median: 1.5, Min: 1, Max: 2, N: 2}, 3, "1.50 (1.00–2.00) [2 of 3]"},
		{nil, 3, "-"},
	} {
		if got := spreadCell(tc.s, tc.runs, f2); got != tc.want {
			t.Errorf("spreadCell(%+v, %d) = %q, want %q", tc.s, tc.runs, got, tc.want)
		}
	}
	if got := ratioCell(&Ratio{OfMedians: 0.91, PairMin: 0.85, PairMax: 0.97, Pairs: 3}); got != "0.91 (0.85–0.97)" {
		t.Errorf("ratioCell = %q", got)
	}
	if got := ratioCell(&Ratio{OfMedians: 0.91, PairMin: 0.91, PairMax: 0.91, Pairs: 1}); got != "0.91" {
		t.Errorf("ratioCell of one pair = %q", got)
	}
	if got := ratioCell(nil); got != "-" {
		t.Errorf("ratioCell(nil) = %q", got)
	}
	// A ratio far below 1 keeps two significant digits rather than
	// reading 0.00 (the reference's idle window on a shared Redis that
	// others were busy with: 38 against 24,936 commands a second).
	if got := ratioCell(&Ratio{OfMedians: 38.0 / 24936, PairMin: 0.0009, PairMax: 0.004, Pairs: 3}); got != "0.0015 (0.00090–0.0040)" {
		t.Errorf("ratioCell of a small ratio = %q", got)
	}
	if got := ratioCell(&Ratio{OfMedians: 0, Pairs: 1}); got != "0.00" {
		t.Errorf("ratioCell of 0 = %q", got)
	}
}

// compareRows reads each figure per side and pair: REF without the
// dispatch view gives "-" there and no ratio; the idle background point
// (no instance) is not the dispatcher's and has no row.
func TestCompareRows(t *testing.T) {
	rate := Point{Mode: modeRate, Rate: 100, Instances: 1, Shards: 4, Batch: 500, Size: 200}
	background := Point{Mode: modeIdle, Shards: 4, Queues: 1}
	idle := Point{Mode: modeIdle, Instances: 1, Shards: 4, Queues: 1}
	cpu := func(v float64) *float64 { return &v }
	run := func(side string, pair int, perTask, cpu10k float64, disp *Dist, idleCmds float64) *CompareRun {
		return &CompareRun{Side: side, Pair: pair, Report: &Report{
			Results: []*Result{{Point: rate, CmdsPerTask: perTask, CPUPer10k: cpu10k, RedisCPUPer10k: cpu(1),
				Lateness: Dist{Count: 10, P50: 2, P99: 8}, DispatchLateness: disp}},
			Idle: []*IdleResult{{Point: background, CmdsPerSec: 1}, {Point: idle, CmdsPerSec: idleCmds, RedisCPUPercent: cpu(0.5), CPUPercent: 0.2}},
		}}
	}
	disp := &Dist{Count: 10, P50: 1, P99: 4}
	runs := []*CompareRun{
		run(sideRef, 1, 6, 2, nil, 100), run(sideCurrent, 1, 3, 3, disp, 50),
		run(sideRef, 2, 8, 2, nil, 100), run(sideCurrent, 2, 5, 1, disp, 60),
	}
	rows := compareRows([]Point{rate, background, idle}, runs)
	byName := map[string]CompareRow{}
	for _, r := range rows {
		if r.Point == background.String() {
			t.Errorf("a row for the background point: %+v", r)
		}
		byName[r.Point+" / "+r.Figure] = r
	}
	if len(rows) != 7+3 {
		t.Errorf("%d rows, want 7 rate figures and 3 idle ones: %+v", len(rows), rows)
	}
	perTask := byName[rate.String()+" / Redis cmds/task"]
	if *perTask.Ref != (Spread{Median: 7, Min: 6, Max: 8, N: 2}) || *perTask.Current != (Spread{Median: 4, Min: 3, Max: 5, N: 2}) ||
		*perTask.Ratio != (Ratio{OfMedians: 4.0 / 7, PairMin: 0.5, PairMax: 5.0 / 8, Pairs: 2}) {
		t.Errorf("Redis cmds/task row: ref %+v current %+v ratio %+v", perTask.Ref, perTask.Current, perTask.Ratio)
	}
	d := byName[rate.String()+" / dispatch lateness p99 ms"]
	if d.Ref != nil || d.Current == nil || d.Current.Median != 4 || d.Ratio != nil {
		t.Errorf("dispatch p99 row: ref %+v current %+v ratio %+v, want no REF, current 4, no ratio", d.Ref, d.Current, d.Ratio)
	}
	ic := byName[idle.String()+" / Redis cmds/s"]
	if ic.Ratio == nil || ic.Ratio.OfMedians != 0.55 {
		t.Errorf("idle Redis cmds/s row: %+v ratio %+v, want 0.55", ic, ic.Ratio)
	}
	if _, ok := byName[rate.String()+" / tasks/s"]; ok {
		t.Error("a rate point has a tasks/s row (only backlog points are measured by it)")
	}
}

func TestCompareOptions(t *testing.T) {
	o, err := parseOptions([]string{"-compare", "v0.1.0", "-mode", "rate"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Compare != "v0.1.0" || o.ComparePairs != 3 {
		t.Errorf("-compare v0.1.0: Compare %q, ComparePairs %d; want v0.1.0 and the default 3", o.Compare, o.ComparePairs)
	}
	if o, err := parseOptions([]string{"-mode", "rate"}, io.Discard); err != nil || o.ComparePairs != 0 {
		t.Errorf("without -compare: ComparePairs %d (%v), want 0 (left out of the report)", o.ComparePairs, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-compare-pairs", "2"}, "-compare-pairs 2 without -compare"},
		{[]string{"-compare", "HEAD", "-compare-pairs", "0"}, "-compare-pairs 0: must be 1 to 100"},
		{[]string{"-compare", "HEAD", "-compare-pairs", "101"}, "-compare-pairs 101: must be 1 to 100"},
		{[]string{"-compare", "-x"}, `-compare "-x": want a git ref or a dispatcher binary's path`},
		{[]string{"-compare", "HEAD", "-mode", "rate,memory"}, "-mode rate,memory with -compare"},
		{[]string{"-compare", "HEAD", "-mode", "scale"}, "-mode scale with -compare"},
		{[]string{"-compare", "HEAD", "-svg", "x.svg"}, "-svg x.svg with -compare"},
	} {
		_, err := parseOptions(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
}

// git runs git in dir for a test, with an identity of its own.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// fakeRepo makes a git repository holding a tiny "dispatcher" module
// whose --version prints what the build stamped, which otherwise fails
// at once, or with FAKE_WAIT set waits (never ready); RELEASES lists
// v9.9.9 as its first commit and v9.9.8 as a commit it does not hold.
func fakeRepo(t *testing.T) (dir, commit string) {
	t.Helper()
	dir = t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/fake\n\ngo 1.22\n",
		"cmd/dispatcher/main.go": `package main

import (
	"fmt"
	"os"
	"time"
)

var buildVersion, buildCommit string

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--version" {
		fmt.Printf("fake %s %s\n", buildVersion, buildCommit)
		return
	}
	if len(os.Args) > 1 || os.Getenv("FAKE_WAIT") == "" {
		os.Exit(1)
	}
	time.Sleep(time.Hour)
}
`,
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, dir, "init", "-q", "-b", "main")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-qm", "fake")
	commit = git(t, dir, "rev-parse", "HEAD")
	releases := "# version commit date\nv9.9.9 " + commit + " 2026-11-24\nv9.9.8 " + strings.Repeat("ab", 20) + " 2026-11-01\n"
	if err := os.WriteFile(filepath.Join(dir, "RELEASES"), []byte(releases), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "add", "RELEASES")
	git(t, dir, "commit", "-qm", "releases")
	git(t, dir, "branch", "side", commit)
	git(t, dir, "branch", "cmd", commit)
	return dir, commit
}

// -compare names a binary when such a file exists, else a commit, branch
// or tag of the repository around the working directory, else a version
// RELEASES lists; each error names the value.
func TestResolveCompare(t *testing.T) {
	repo, commit := fakeRepo(t)
	sub := filepath.Join(repo, "cmd")
	ctx := t.Context()

	tgt, err := resolveCompare(ctx, binary, sub)
	if err != nil || tgt.binary != binary || tgt.commit != "" {
		t.Errorf("the built binary %s: %+v, %v; want it run as it is", binary, tgt, err)
	}
	// A relative path is taken from the working directory.
	tgt, err = resolveCompare(ctx, filepath.Base(binary), filepath.Dir(binary))
	if err != nil || tgt.binary != binary {
		t.Errorf("%s in %s: %+v, %v; want %s", filepath.Base(binary), filepath.Dir(binary), tgt, err, binary)
	}
	head := git(t, repo, "rev-parse", "HEAD")
	for _, tc := range []struct{ ref, dir, commit, release string }{
		{"HEAD", sub, head, ""},
		{"side", sub, commit, "v9.9.9"},
		{commit[:10], sub, commit, "v9.9.9"},
		// The directory cmd does not hide the branch cmd.
		{"cmd", repo, commit, "v9.9.9"},
		{"v9.9.9", sub, commit, "v9.9.9"},
	} {
		tgt, err := resolveCompare(ctx, tc.ref, tc.dir)
		if err != nil {
			t.Errorf("%s: %v", tc.ref, err)
			continue
		}
		if tgt.binary != "" || tgt.commit != tc.commit || tgt.release != tc.release || tgt.repo != repo {
			t.Errorf("%s: binary %q commit %q release %q repo %q; want commit %s release %q in %s",
				tc.ref, tgt.binary, tgt.commit, tgt.release, tgt.repo, tc.commit, tc.release, repo)
		}
	}

	plain := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(plain, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ given, dir, want string }{
		{"nosuchref", sub, `-compare "nosuchref": no such file, and not a commit, branch or tag of ` + repo},
		{"v9.9.8", sub, `-compare "v9.9.8": RELEASES gives commit abababab`},
		{repo, sub, `-compare "` + repo + `": a directory, not a dispatcher binary, and not a commit`},
		{plain, sub, `-compare "` + plain + `": not executable`},
		{"HEAD", t.TempDir(), `-compare "HEAD": no such file, and no git repository here`},
	} {
		_, err := resolveCompare(ctx, tc.given, tc.dir)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s in %s: error %v, want one containing %q", tc.given, tc.dir, err, tc.want)
		}
	}
}

// A ref is built from git archive of its commit, stamped as the release
// build stamps it, the repository's work tree untouched.
func TestBuildCompareTarget(t *testing.T) {
	repo, commit := fakeRepo(t)
	if err := os.WriteFile(filepath.Join(repo, "cmd", "dispatcher", "main.go"), []byte("not Go"), 0o644); err != nil {
		t.Fatal(err)
	}
	tgt, err := resolveCompare(t.Context(), "v9.9.9", repo)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := buildTarget(t.Context(), tgt, t.TempDir())
	if err != nil {
		t.Fatalf("build of the committed tree (the work tree's main.go is broken, and must not be used): %v", err)
	}
	if got, want := binaryVersion(t.Context(), bin), "fake v9.9.9 "+commit; got != want {
		t.Errorf("--version %q, want %q", got, want)
	}
	if got := git(t, repo, "status", "--porcelain"); got != "M cmd/dispatcher/main.go" {
		t.Errorf("work tree changed by the build: git status %q", got)
	}
	// A commit that does not build says which and why.
	git(t, repo, "commit", "-qam", "broken")
	tgt, err = resolveCompare(t.Context(), "HEAD", repo)
	if err != nil {
		t.Fatal(err)
	}
	_, err = buildTarget(t.Context(), tgt, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "build HEAD: go build ./cmd/dispatcher of commit "+tgt.commit) ||
		!strings.Contains(err.Error(), "main.go") {
		t.Errorf("a broken commit: %v; want the ref, commit and the compiler's complaint", err)
	}
}

// The directory a ref is built in is removed at the end: after a failed
// run (the fake exits at once), and after Ctrl-C (the fake waits).
func TestCompareRemovesBuild(t *testing.T) {
	repo, _ := fakeRepo(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	t.Chdir(repo)
	run := func(stderr io.Writer) int {
		return Main([]string{"-redis", testenv.RedisURL(t), "-amqp", testenv.AMQPURL(t), "-dispatcher", binary,
			"-compare", "v9.9.9", "-compare-pairs", "1", "-mode", "rate", "-rate", "100", "-duration", "1s", "-shards", "2", "-stall", "3s"},
			io.Discard, stderr)
	}
	leftovers := func(when string) {
		t.Helper()
		ents, err := os.ReadDir(tmp)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "dispatcher-bench-compare-") {
				t.Errorf("%s: %s left in TMPDIR", when, e.Name())
			}
		}
	}

	var stderr lockedBuffer
	if code := run(&stderr); code != exitFailure {
		t.Errorf("a REF that never gets ready: exit %d, want %d; stderr:\n%s", code, exitFailure, stderr.String())
	}
	if !strings.Contains(stderr.String(), "building v9.9.9") {
		t.Errorf("stderr does not say it built v9.9.9:\n%s", stderr.String())
	}
	leftovers("after a failed run")

	t.Setenv("FAKE_WAIT", "1")
	var stderr2 lockedBuffer
	done := make(chan int)
	go func() { done <- run(&stderr2) }()
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr2.String(), "[1/1]") {
		if time.Now().After(deadline) {
			t.Fatalf("the point did not start:\n%s", stderr2.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != exitFailure {
			t.Errorf("interrupted: exit %d, want %d", code, exitFailure)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the comparison did not stop on SIGINT")
	}
	leftovers("after Ctrl-C")
}

// A tiny comparison end to end, the built binary against itself: the
// table has both sides and a ratio for every figure, and the JSON the
// same. The figures are not judged (the machine is shared), only that
// they are there and above 0.
func TestBenchCompare(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "compare.json")
	code, stdout, stderr := runBench(t, "-dispatcher", binary, "-compare", binary, "-compare-pairs", "1",
		"-mode", "rate,idle", "-rate", "200", "-duration", "2s", "-idle-duration", "1s", "-shards", "4",
		"-queue-type", "transient", "-stall", "20s", "-json", jsonPath)
	t.Logf("stdout:\n%s", stdout)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"REF: " + binary + " (--version: dispatcher ", "| point | figure | " + binary + " | current | current / " + binary + " |",
		"Against " + binary + ": 1 pair(s) of runs"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	// Every figure of the rate point has a number on both sides and a
	// ratio; idle ones may round to 0 in a second, so only cmds/s is.
	positive := map[string]bool{}
	for _, f := range compareFigures {
		if f.modes[0] == modeRate || f.modes[0] == modeBacklog {
			positive[f.name] = f.name != "tasks/s" && f.name != "ratio to ceiling"
		}
	}
	positive["Redis cmds/s"] = true
	seen := map[string]bool{}
	for line := range strings.SplitSeq(stdout, "\n") {
		cells := strings.Split(strings.TrimSuffix(strings.TrimPrefix(line, "| "), " |"), " | ")
		if len(cells) != 5 || !positive[cells[1]] {
			continue
		}
		seen[cells[1]] = true
		for i, c := range cells[2:] {
			var v float64
			if _, err := fmt.Sscan(strings.ReplaceAll(c, ",", ""), &v); err != nil || v <= 0 {
				t.Errorf("%s: cell %d is %q, want a number above 0", cells[1], i+2, c)
			}
		}
	}
	for name, want := range positive {
		if want && !seen[name] {
			t.Errorf("no row for %q", name)
		}
	}

	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	c := rep.Compare
	if c == nil {
		t.Fatalf("the JSON has no comparison:\n%.2000s", b)
	}
	if c.Ref != binary || c.Pairs != 1 || len(c.Runs) != 2 || c.Runs[0].Side != sideRef || c.Runs[1].Side != sideCurrent {
		t.Errorf("comparison: ref %q pairs %d runs %d (%+v)", c.Ref, c.Pairs, len(c.Runs), c.Runs)
	}
	for _, run := range c.Runs {
		if len(run.Report.Results) != 1 || len(run.Report.Idle) != 2 {
			t.Errorf("%s run: %d results, %d idle; want the rate point and the idle ones", run.Side, len(run.Report.Results), len(run.Report.Idle))
		}
	}
	if len(c.Rows) != 7+3 {
		t.Errorf("%d rows, want 10", len(c.Rows))
	}
	for _, row := range c.Rows {
		if !positive[row.Figure] {
			continue
		}
		if row.Ref == nil || row.Current == nil || row.Ratio == nil || row.Ref.Median <= 0 || row.Current.Median <= 0 || row.Ratio.OfMedians <= 0 {
			t.Errorf("%s / %s: ref %+v current %+v ratio %+v, want all above 0", row.Point, row.Figure, row.Ref, row.Current, row.Ratio)
		}
	}
}
