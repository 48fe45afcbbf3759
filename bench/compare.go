package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// maxComparePairs bounds -compare-pairs: each pair runs every point twice.
const maxComparePairs = 100

// Sides of a comparison.
const (
	sideRef     = "ref"
	sideCurrent = "current"
)

// Comparison is what -compare measured: every run of both sides and,
// per point and figure, each side's median and spread and their ratio.
type Comparison struct {
	// Ref is -compare as given; RefCommit the commit built for it (none
	// for a binary's path), RefRelease the version RELEASES gives that
	// commit, RefVersion what its binary's --version says.
	Ref        string `json:"ref"`
	RefCommit  string `json:"ref_commit,omitempty"`
	RefRelease string `json:"ref_release,omitempty"`
	RefVersion string `json:"ref_version"`
	// CurrentVersion is what -dispatcher's --version says.
	CurrentVersion string `json:"current_version"`
	// Pairs is -compare-pairs; each pair ran REF first, then current.
	Pairs int           `json:"pairs"`
	Rows  []CompareRow  `json:"rows"`
	Runs  []*CompareRun `json:"runs"`
}

// CompareRun is one side's run of every point, as the bench without
// -compare runs them.
type CompareRun struct {
	Side   string  `json:"side"` // ref or current
	Pair   int     `json:"pair"` // from 1
	Report *Report `json:"report"`
}

// CompareRow is one figure of one point on both sides. Ref or Current is
// null when no run of that side gave the figure (dispatch lateness of a
// dispatcher that does not stamp x-published-us, say); Ratio then too.
type CompareRow struct {
	Point   string  `json:"point"`
	Figure  string  `json:"figure"`
	Ref     *Spread `json:"ref"`
	Current *Spread `json:"current"`
	Ratio   *Ratio  `json:"ratio"`
}

// Spread is one side's runs of a figure: their median, least and most,
// over the N runs that gave it.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Ratio is current / REF: OfMedians of the two medians; PairMin and
// PairMax the least and most of the per-pair ratios, over the Pairs
// pairs in which both sides gave the figure (REF's above 0).
type Ratio struct {
	OfMedians float64 `json:"of_medians"`
	PairMin   float64 `json:"pair_min"`
	PairMax   float64 `json:"pair_max"`
	Pairs     int     `json:"pairs"`
}

// compareFigure is one figure the comparison gives: how to read it from
// a backlog or rate result, or from an idle one, and how to write it.
type compareFigure struct {
	name   string
	modes  []string
	result func(*Result) (float64, bool)
	idle   func(*IdleResult) (float64, bool)
	format func(float64) string
}

func some(v float64) (float64, bool) { return v, true }

func optVal(v *float64) (float64, bool) {
	if v == nil {
		return 0, false
	}
	return *v, true
}

func distVal(d *Dist, p func(*Dist) float64) (float64, bool) {
	if d == nil || d.Count == 0 {
		return 0, false
	}
	return p(d), true
}

// ingressVal is an ingress figure, when the point measured it (above 0).
func ingressVal(r *Result, f func(*IngressResult) float64) (float64, bool) {
	if r.Ingress == nil {
		return 0, false
	}
	v := f(r.Ingress)
	return v, v > 0
}

func p50(d *Dist) float64 { return d.P50 }
func p99(d *Dist) float64 { return d.P99 }

func f2(v float64) string { return fmt.Sprintf("%.2f", v) }
func f3(v float64) string { return fmt.Sprintf("%.3f", v) }

// compareFigures are the figures that matter when weighing a change: what
// the dispatcher and Redis spend per task, how fast a backlog drains, how
// late tasks are, and what an idle fleet costs.
var compareFigures = []compareFigure{
	{name: "tasks/s", modes: []string{modeBacklog}, result: func(r *Result) (float64, bool) { return some(r.PerSec) },
		format: func(v float64) string { return thousands(int(v + 0.5)) }},
	{name: "ingest/s", modes: []string{modeIngress}, result: func(r *Result) (float64, bool) {
		return ingressVal(r, func(g *IngressResult) float64 { return g.IngestPerSec })
	},
		format: func(v float64) string { return thousands(int(v + 0.5)) }},
	{name: "ratio to ceiling", modes: []string{modeBacklog, modeIngress}, result: func(r *Result) (float64, bool) { return r.Ratio, r.Ratio > 0 }, format: f2},
	{name: "publish to Redis p99 ms", modes: []string{modeIngress}, result: func(r *Result) (float64, bool) {
		if r.Ingress == nil {
			return 0, false
		}
		return distVal(r.Ingress.ToRedis, p99)
	}, format: fmtMs},
	{name: "dispatcher CPU s/10k tasks", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return some(r.CPUPer10k) }, format: f3},
	{name: "Redis cmds/task", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return some(r.CmdsPerTask) }, format: f2},
	{name: "Redis CPU s/10k tasks", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return optVal(r.RedisCPUPer10k) }, format: f3},
	{name: "dispatch lateness p50 ms", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return distVal(r.DispatchLateness, p50) }, format: fmtMs},
	{name: "dispatch lateness p99 ms", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return distVal(r.DispatchLateness, p99) }, format: fmtMs},
	{name: "consumer lateness p50 ms", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return distVal(&r.Lateness, p50) }, format: fmtMs},
	{name: "consumer lateness p99 ms", modes: []string{modeBacklog, modeRate, modeIngress}, result: func(r *Result) (float64, bool) { return distVal(&r.Lateness, p99) }, format: fmtMs},
	{name: "Redis cmds/s", modes: []string{modeIdle}, idle: func(r *IdleResult) (float64, bool) { return some(r.CmdsPerSec) },
		format: func(v float64) string { return fmt.Sprintf("%.0f", v) }},
	{name: "Redis CPU % of a core", modes: []string{modeIdle}, idle: func(r *IdleResult) (float64, bool) { return optVal(r.RedisCPUPercent) }, format: f2},
	{name: "dispatcher CPU % per instance", modes: []string{modeIdle}, idle: func(r *IdleResult) (float64, bool) { return some(r.CPUPercent) }, format: f2},
}

// checkCompare checks -compare and -compare-pairs; without -compare,
// ComparePairs is left 0 so that reports of plain runs do not change.
func (o *Options) checkCompare(fs *flag.FlagSet, modes string) error {
	pairsSet := false
	fs.Visit(func(f *flag.Flag) { pairsSet = pairsSet || f.Name == "compare-pairs" })
	if o.Compare == "" {
		if pairsSet {
			return fmt.Errorf("-compare-pairs %d without -compare: give -compare REF", o.ComparePairs)
		}
		o.ComparePairs = 0
		return nil
	}
	switch {
	case strings.HasPrefix(o.Compare, "-"):
		return fmt.Errorf("-compare %q: want a git ref or a dispatcher binary's path, not a flag", o.Compare)
	case o.ComparePairs < 1 || o.ComparePairs > maxComparePairs:
		return fmt.Errorf("-compare-pairs %d: must be 1 to %d", o.ComparePairs, maxComparePairs)
	case o.SVGPath != "":
		return fmt.Errorf("-svg %s with -compare: the chart is of one run; run the bench without -compare for it", o.SVGPath)
	}
	for _, m := range o.Modes {
		if m != modeBacklog && m != modeRate && m != modeIdle && m != modeIngress {
			return fmt.Errorf("-mode %s with -compare: the comparison covers backlog, rate, idle and ingress modes", modes)
		}
	}
	return nil
}

// compareTarget is -compare resolved: a binary to run as it is, or a
// commit of repo to build.
type compareTarget struct {
	given   string
	binary  string // an existing binary (absolute), or "" to build commit
	repo    string // the git repository's top directory
	commit  string
	release string // RELEASES' version of commit, if any
}

// label is how tables name REF: as given (a binary's base name alone,
// "dispatcher" say, would not tell which).
func (t *compareTarget) label() string { return t.given }

// resolveCompare finds what -compare names, relative to dir (the working
// directory). An existing file is a binary; anything else is looked up in
// the git repository around dir: a commit, branch or tag (git rev-parse),
// else a version RELEASES lists.
func resolveCompare(ctx context.Context, given, dir string) (*compareTarget, error) {
	t := &compareTarget{given: given}
	path := given
	if !filepath.IsAbs(path) {
		path = filepath.Join(dir, path)
	}
	st, err := os.Stat(path)
	switch {
	case err == nil && !st.IsDir():
		if st.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("-compare %q: not executable", given)
		}
		t.binary = path
		return t, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("-compare %q: %w", given, err)
	}
	// A directory of the same name as a branch (docs, bench) does not
	// hide the branch.
	what := "no such file"
	if err == nil {
		what = "a directory, not a dispatcher binary"
	}
	top, err := gitOutput(ctx, dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, fmt.Errorf("-compare %q: %s, and no git repository here to build it from (%v)", given, what, err)
	}
	t.repo = top
	releases, relErr := readReleases(filepath.Join(top, "RELEASES"))
	if c, err := gitOutput(ctx, top, "rev-parse", "--verify", "--quiet", "--end-of-options", given+"^{commit}"); err == nil {
		t.commit = c
	} else if c, ok := releases[given]; ok {
		if _, err := gitOutput(ctx, top, "cat-file", "-e", c+"^{commit}"); err != nil {
			return nil, fmt.Errorf("-compare %q: RELEASES gives commit %s, which is not in this clone (a shallow clone? git fetch --unshallow)", given, c)
		}
		t.commit = c
	} else {
		why := ""
		if relErr != nil {
			why = " (" + relErr.Error() + ")"
		}
		return nil, fmt.Errorf("-compare %q: %s, and not a commit, branch or tag of %s, nor a version its RELEASES lists%s", given, what, top, why)
	}
	for v, c := range releases {
		if c == t.commit {
			t.release = v
		}
	}
	return t, nil
}

var releaseLine = regexp.MustCompile(`^(v\d+\.\d+\.\d+\S*)\s+([0-9a-f]{40})\s`)

// readReleases maps each version RELEASES lists to its commit.
func readReleases(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := releaseLine.FindStringSubmatch(sc.Text() + " "); m != nil {
			out[m[1]] = m[2]
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

// gitOutput runs git in dir and returns its trimmed output.
func gitOutput(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", append([]string{"-C", dir}, args...)...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(errOut.String()); msg != "" {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, msg)
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// buildTarget builds t's commit into dir: git archive of the commit
// unpacked in dir/src (the repository and its work tree are left alone),
// then go build of ./cmd/dispatcher with the go on PATH, stamped with the
// commit (and the release's version) as the release build stamps it.
func buildTarget(ctx context.Context, t *compareTarget, dir string) (string, error) {
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", fmt.Errorf("build %s: %w", t.given, err)
	}
	archive := exec.CommandContext(ctx, "git", "-C", t.repo, "archive", "--format=tar", t.commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := archive.StdoutPipe()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", t.given, err)
	}
	untar.Stdin = pipe
	var archiveErr, untarErr strings.Builder
	archive.Stderr, untar.Stderr = &archiveErr, &untarErr
	if err := untar.Start(); err != nil {
		return "", fmt.Errorf("build %s: tar: %w", t.given, err)
	}
	if err := archive.Run(); err != nil {
		_ = untar.Wait()
		return "", fmt.Errorf("build %s: git archive %s: %w %s", t.given, t.commit, err, strings.TrimSpace(archiveErr.String()))
	}
	if err := untar.Wait(); err != nil {
		return "", fmt.Errorf("build %s: tar -x: %w %s", t.given, err, strings.TrimSpace(untarErr.String()))
	}
	bin := filepath.Join(dir, "dispatcher-"+strings.NewReplacer("/", "-", "^", "-", "~", "-", ":", "-").Replace(t.given))
	ldflags := "-X main.buildCommit=" + t.commit
	if t.release != "" {
		ldflags += " -X main.buildVersion=" + t.release
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "-ldflags", ldflags, "./cmd/dispatcher")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: go build ./cmd/dispatcher of commit %s: %w\n%s", t.given, t.commit, err, lastLines(string(out), 20))
	}
	return bin, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// binaryVersion is the first line of bin --version, or "" when it does
// not tell.
func binaryVersion(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// runComparison is `dispatcher bench -compare REF`: it resolves (and
// builds) REF, runs the points for REF and for opt.Dispatcher in turn,
// -compare-pairs times each, and reports both and their ratios. The
// temporary directory of a build is removed at the end, on Ctrl-C too
// (Main's context ends on the first one; the deferred removal runs).
func runComparison(ctx context.Context, opt *Options, args []string, points []Point, stdout, stderr io.Writer) int {
	wd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
		return exitFailure
	}
	target, err := resolveCompare(ctx, opt.Compare, wd)
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
		return exitSettings
	}
	refBin := target.binary
	if refBin == "" {
		tmp, err := os.MkdirTemp("", "dispatcher-bench-compare-")
		if err != nil {
			fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
			return exitFailure
		}
		defer os.RemoveAll(tmp)
		fmt.Fprintf(stderr, "dispatcher bench: building %s (commit %s) in %s\n", target.given, target.commit, tmp)
		began := time.Now()
		if refBin, err = buildTarget(ctx, target, tmp); err != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("interrupted while building %s", target.given)
			}
			fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
			return exitFailure
		}
		fmt.Fprintf(stderr, "dispatcher bench: built %s in %.0fs\n", target.given, time.Since(began).Seconds())
	}
	cmp := &Comparison{Ref: opt.Compare, RefCommit: target.commit, RefRelease: target.release,
		RefVersion: binaryVersion(ctx, refBin), CurrentVersion: binaryVersion(ctx, opt.Dispatcher),
		Pairs: opt.ComparePairs, Rows: []CompareRow{}, Runs: []*CompareRun{}}
	rep := &Report{Version: 1, Command: commandLine(args), Started: time.Now(), Options: opt,
		Ceilings: []*Ceiling{}, Results: []*Result{}, Idle: []*IdleResult{}, Failures: []string{}, Compare: cmp}
	labels := map[string]string{sideRef: target.label(), sideCurrent: "current"}
	bins := map[string]string{sideRef: refBin, sideCurrent: opt.Dispatcher}
	var runErr error
runs:
	for pair := 1; pair <= opt.ComparePairs; pair++ {
		for _, side := range []string{sideRef, sideCurrent} {
			o := *opt
			o.Dispatcher = bins[side]
			sub := &Report{Version: 1, Command: rep.Command, Started: time.Now(), Options: &o,
				Ceilings: []*Ceiling{}, Results: []*Result{}, Idle: []*IdleResult{}, Failures: []string{}}
			r, err := newRunner(ctx, &o, stderr, sub)
			if err != nil {
				runErr = err
				break runs
			}
			fmt.Fprintf(stderr, "dispatcher bench %s: pair %d of %d, %s (%s): %d points; %s\n", r.runID, pair, opt.ComparePairs,
				labels[side], o.Dispatcher, len(points), sub.Machine)
			if !r.stamps {
				r.warnf("%s does not list %s in its --help: started without it, no dispatch view of lateness", o.Dispatcher, stampVar)
			}
			err = r.run(ctx, points)
			r.close()
			sub.Finished = time.Now()
			if err != nil {
				sub.Failures = append(sub.Failures, err.Error())
			}
			cmp.Runs = append(cmp.Runs, &CompareRun{Side: side, Pair: pair, Report: sub})
			for _, f := range sub.Failures {
				rep.Failures = append(rep.Failures, fmt.Sprintf("%s, pair %d: %s", labels[side], pair, f))
			}
			if rep.RunID == "" {
				rep.RunID, rep.Machine, rep.Consumer = sub.RunID, sub.Machine, sub.Consumer
				rep.ClockOffsetUs, rep.ClockRTTUs, rep.CPUCap = sub.ClockOffsetUs, sub.ClockRTTUs, sub.CPUCap
			}
			if err != nil {
				break runs
			}
		}
	}
	rep.Finished = time.Now()
	if runErr != nil {
		rep.Failures = append(rep.Failures, runErr.Error())
	}
	cmp.Rows = compareRows(points, cmp.Runs)
	writeCompareTables(stdout, rep, labels[sideRef])
	code := exitOK
	if len(rep.Failures) > 0 {
		code = exitFailure
	}
	if err := writeReports(opt, rep, ctx.Err() != nil); err != nil {
		fmt.Fprintf(stderr, "dispatcher bench: %v\n", err)
		code = exitFailure
	}
	return code
}

// compareRows works out every figure of every point from the runs. The
// idle background point (no instance) is not the dispatcher's and is
// left out.
func compareRows(points []Point, runs []*CompareRun) []CompareRow {
	rows := []CompareRow{}
	pairs := 0
	for _, run := range runs {
		pairs = max(pairs, run.Pair)
	}
	for _, p := range points {
		if p.Mode == modeIdle && p.Instances == 0 {
			continue
		}
		for _, fig := range compareFigures {
			if !slices.Contains(fig.modes, p.Mode) {
				continue
			}
			// vals[side][pair-1]; NaN where that run did not give it.
			vals := map[string][]float64{sideRef: nanSlice(pairs), sideCurrent: nanSlice(pairs)}
			for _, run := range runs {
				if v, ok := figureOf(run.Report, p, fig); ok {
					vals[run.Side][run.Pair-1] = v
				}
			}
			row := CompareRow{Point: p.String(), Figure: fig.name, Ref: spreadOf(vals[sideRef]), Current: spreadOf(vals[sideCurrent])}
			row.Ratio = ratioOf(row.Ref, row.Current, vals[sideRef], vals[sideCurrent])
			rows = append(rows, row)
		}
	}
	return rows
}

func nanSlice(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

// figureOf reads fig of point p from one run's report.
func figureOf(rep *Report, p Point, fig compareFigure) (float64, bool) {
	if rep == nil {
		return 0, false
	}
	if p.Mode == modeIdle {
		for _, r := range rep.Idle {
			if r.Point == p && fig.idle != nil {
				return fig.idle(r)
			}
		}
		return 0, false
	}
	for _, r := range rep.Results {
		if r.Point == p && fig.result != nil {
			return fig.result(r)
		}
	}
	return 0, false
}

// spreadOf is the median, least and most of the values that are not NaN;
// nil when there are none.
func spreadOf(vals []float64) *Spread {
	var vs []float64
	for _, v := range vals {
		if !math.IsNaN(v) {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return nil
	}
	slices.Sort(vs)
	n := len(vs)
	med := vs[n/2]
	if n%2 == 0 {
		med = (vs[n/2-1] + vs[n/2]) / 2
	}
	return &Spread{Median: med, Min: vs[0], Max: vs[n-1], N: n}
}

// ratioOf is current / REF: of the medians, and the spread of the
// per-pair ratios; nil when either side is missing or REF's median is not
// above 0.
func ratioOf(ref, cur *Spread, refVals, curVals []float64) *Ratio {
	if ref == nil || cur == nil || ref.Median <= 0 {
		return nil
	}
	out := &Ratio{OfMedians: cur.Median / ref.Median, PairMin: math.Inf(1), PairMax: math.Inf(-1)}
	for i := range min(len(refVals), len(curVals)) {
		a, b := refVals[i], curVals[i]
		if math.IsNaN(a) || math.IsNaN(b) || a <= 0 {
			continue
		}
		out.PairMin, out.PairMax = min(out.PairMin, b/a), max(out.PairMax, b/a)
		out.Pairs++
	}
	if out.Pairs == 0 {
		out.PairMin, out.PairMax = 0, 0
	}
	return out
}

// spreadCell is "median (min–max)", with "[n of N]" when some runs did not
// give the figure, or "-" when none did.
func spreadCell(s *Spread, runs int, format func(float64) string) string {
	if s == nil {
		return "-"
	}
	out := format(s.Median)
	if s.N > 1 {
		out += fmt.Sprintf(" (%s–%s)", format(s.Min), format(s.Max))
	}
	if s.N < runs {
		out += fmt.Sprintf(" [%d of %d]", s.N, runs)
	}
	return out
}

// ratioCell is "ratio of medians (least–most per-pair ratio)", or "-".
func ratioCell(r *Ratio) string {
	if r == nil {
		return "-"
	}
	out := ratioFigure(r.OfMedians)
	if r.Pairs > 1 {
		out += fmt.Sprintf(" (%s–%s)", ratioFigure(r.PairMin), ratioFigure(r.PairMax))
	}
	return out
}

// ratioFigure is a ratio to two decimals, or to two significant digits
// below 0.01, which two decimals would show as 0.
func ratioFigure(v float64) string {
	if v > 0 && v < 0.01 {
		return fmt.Sprintf("%#.2g", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeCompareTables prints the comparison as a markdown table.
func writeCompareTables(w io.Writer, rep *Report, refLabel string) {
	c := rep.Compare
	fmt.Fprintf(w, "Machine: %s\n\n", rep.Machine)
	fmt.Fprintf(w, "Command: `%s`\n\n", rep.Command)
	fmt.Fprintf(w, "Consumer: %s\n", rep.Consumer)
	if rep.CPUCap != nil {
		fmt.Fprintf(w, "\nCPU cap: %s\n", rep.CPUCap)
	}
	ref := refLabel
	if c.RefCommit != "" {
		ref += ", commit " + c.RefCommit[:min(12, len(c.RefCommit))] + " built here"
	}
	fmt.Fprintf(w, "\nREF: %s (--version: %s)\n", ref, orUnknown(c.RefVersion))
	fmt.Fprintf(w, "current: %s\n", orUnknown(c.CurrentVersion))
	fmt.Fprintf(w, "\nAgainst %s: %d pair(s) of runs, each pair %s first, then current, every point run as `dispatcher bench` runs it without -compare. Cells: the median of a side's runs (least–most); ratio: current / %s of the medians (least–most of the per-pair ratios). Below 1 is less (better) except tasks/s and ratio to ceiling, where above 1 is better.\n\n",
		refLabel, c.Pairs, refLabel, refLabel)
	runs := map[string]int{}
	for _, r := range c.Runs {
		runs[r.Side]++
	}
	table(w, []string{"point", "figure", refLabel, "current", "current / " + refLabel}, func(add func(...string)) {
		last := ""
		for _, row := range c.Rows {
			fig := figureNamed(row.Figure)
			point := row.Point
			if point == last {
				point = ""
			}
			last = row.Point
			add(point, row.Figure, spreadCell(row.Ref, runs[sideRef], fig.format), spreadCell(row.Current, runs[sideCurrent], fig.format), ratioCell(row.Ratio))
		}
	})
	for _, r := range c.Runs {
		if r.Report != nil && !r.Report.DispatcherStamps && len(r.Report.Results) > 0 {
			fmt.Fprintf(w, "\nNote: dispatch lateness \"-\": the %s dispatcher does not know %s, so its tasks carry no x-published-us.\n", map[string]string{sideRef: refLabel, sideCurrent: "current"}[r.Side], stampVar)
			break
		}
	}
	others := 0
	for _, r := range c.Runs {
		for _, res := range r.Report.Results {
			others = max(others, res.Redis.OtherClients)
		}
		for _, res := range r.Report.Idle {
			others = max(others, res.Redis.OtherClients)
		}
	}
	if others > 0 {
		fmt.Fprintf(w, "\nNote: up to %d other Redis clients sent commands during the measurements; the Redis figures include them.\n", others)
	}
	if len(rep.Failures) > 0 {
		fmt.Fprintf(w, "\nFAILED:\n")
		for _, f := range rep.Failures {
			fmt.Fprintf(w, "- %s\n", f)
		}
	}
}

func figureNamed(name string) compareFigure {
	for _, f := range compareFigures {
		if f.name == name {
			return f
		}
	}
	return compareFigure{name: name, format: f2}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
