package tests

import (
	"bufio"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/shard"
)

// release is one line of RELEASES.
type release struct{ Version, Commit, Date string }

var releaseLine = regexp.MustCompile(`^(v\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?) ([0-9a-f]{40}) (\d{4}-\d{2}-\d{2})$`)

// latestRelease reads the newest release recorded in RELEASES (the first
// line that is not a comment).
func latestRelease(t *testing.T) release {
	t.Helper()
	f, err := os.Open("../RELEASES")
	if err != nil {
		t.Fatalf("the releases record: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := releaseLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("RELEASES: line %q is not <version> <40-hex commit> <YYYY-MM-DD>", line)
		}
		return release{m[1], m[2], m[3]}
	}
	t.Fatal("RELEASES records no release")
	return release{}
}

// buildRelease builds the dispatcher of rel from the repository's git
// history (git archive of its commit, go build there), stamped with its
// version. It skips the test only when the tree has no git history at all
// (a source archive); a clone without the commit (shallow) fails.
func buildRelease(t *testing.T, rel release) string {
	t.Helper()
	root, err := exec.Command("git", "-C", "..", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("no git history to build release %s from (git rev-parse: %v): the upgrade test needs a clone", rel.Version, err)
	}
	repo := strings.TrimSpace(string(root))
	if out, err := exec.Command("git", "-C", repo, "cat-file", "-e", rel.Commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("release %s: commit %s is not in this clone (a shallow clone? git fetch --unshallow): %v %s",
			rel.Version, rel.Commit, err, out)
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", `git -C "$1" archive "$2" | tar -x -C "$3"`, "sh", repo, rel.Commit, src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s of release %s: %v\n%s", rel.Commit, rel.Version, err, out)
	}
	bin := filepath.Join(t.TempDir(), "dispatcher-"+rel.Version)
	build := exec.Command("go", "build", "-o", bin, "-ldflags",
		"-X main.buildVersion="+rel.Version+" -X main.buildCommit="+rel.Commit, "./cmd/dispatcher")
	build.Dir = src
	build.Env = append(os.Environ(), "GOWORK=off")
	started := time.Now()
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of release %s: %v\n%s", rel.Version, err, out)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "dispatcher "+rel.Version) {
		t.Fatalf("release %s built, but --version says %q (%v)", rel.Version, out, err)
	}
	t.Logf("built release %s (%s) in %s", rel.Version, rel.Commit[:12], time.Since(started).Round(time.Second))
	return bin
}

// plannedTraffic is a producer's whole schedule worked out ahead: task i
// of queue q is ZADDed at send[i] and due at its due time, 0 to 3 s after
// its send time, so the wanted ids are known before the first task goes.
type plannedTraffic struct {
	queue  string
	send   []time.Time
	tasks  []shard.Task
	wanted map[string]int64
}

func planTraffic(queue string, rate int, from time.Time, d time.Duration, rng *rand.Rand) plannedTraffic {
	p := plannedTraffic{queue: queue, wanted: map[string]int64{}}
	n := int(d.Seconds() * float64(rate))
	for i := range n {
		at := from.Add(time.Duration(i) * time.Second / time.Duration(rate))
		due := at.Add(time.Duration(rng.Int63n(int64(3 * time.Second))))
		m := []byte(fmt.Sprintf("%s-%d", queue, i))
		p.send = append(p.send, at)
		p.tasks = append(p.tasks, shard.Task{Member: m, Due: due})
		p.wanted[shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
	}
	return p
}

// run sends the planned tasks at their send times, in batches every 10 ms
// (a task sent late is only due sooner; none is sent early).
func (p plannedTraffic) run(t *testing.T, prod *shard.Producer) {
	ctx := context.Background()
	for next := 0; next < len(p.tasks); {
		time.Sleep(time.Until(p.send[next]))
		end := next
		for end < len(p.tasks) && !p.send[end].After(time.Now()) {
			end++
		}
		if err := prod.ScheduleMany(ctx, p.tasks[next:end]); err != nil {
			t.Errorf("producer of %s: %v", p.queue, err)
			return
		}
		next = end
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRollingUpgrade runs the newest recorded release (RELEASES, built
// from git) and the current tree side by side as a rolling update does,
// under steady traffic on two queues (16 and 4 shards, 300 tasks/s in
// all, each due 0 to 3 s after its ZADD): two instances of the release,
// then, one at a time, a new instance started and an old one stopped with
// SIGTERM; then back the same way (a rollback). Every task must arrive,
// none published before its due time by the Redis clock, each stop exits
// 0, and nothing is left in Redis. Duplicates are counted and reported:
// a clean stop should cause none; the bound only catches gross failures
// (what the stops could resend if every outstanding confirm was lost).
func TestRollingUpgrade(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	rel := latestRelease(t)
	oldBin := buildRelease(t, rel)

	queues := []queueSpec{{Name: "roll", Shards: 16}, {Name: "roll4", Shards: 4}}
	rates := map[string]int{"roll": 200, "roll4": 100}
	// Both builds run with the harness's settings: a setting only the
	// current tree knew would stop the release at its start (exit 2), as it
	// would in a real rolling upgrade (docs/upgrading.md#settings-across-versions).
	h := newHarness(t, queues...)
	// x-published-us: the publish time on the Redis clock, to judge "early".
	h.extra["DISPATCHER_STAMP_PUBLISHED"] = "true"
	h.extra["DISPATCHER_SHUTDOWN_TIMEOUT"] = "20s"
	const instances, pipeline, batch = 2, 4, 500 // PIPELINE and BATCH_SIZE defaults

	startOld := func() *proc { return startBinary(t, oldBin, h.env()) }
	old := []*proc{startOld(), startOld()}
	for _, p := range old {
		waitStarted(t, p)
	}

	const traffic = 30 * time.Second
	from := time.Now().Add(300 * time.Millisecond)
	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	plans := map[string]plannedTraffic{}
	for _, q := range queues {
		plans[q.Name] = planTraffic(q.Name, rates[q.Name], from, traffic, rng)
	}
	var producers sync.WaitGroup
	for _, q := range queues {
		producers.Add(1)
		go func() { defer producers.Done(); plans[q.Name].run(t, h.producer(q.Name)) }()
	}
	defer producers.Wait()

	// Collect while the roll runs: receipt times make the lateness figures.
	stops := 0
	outcomes := map[string]outcome{}
	var mu sync.Mutex
	var verifying sync.WaitGroup
	for _, q := range queues {
		verifying.Add(1)
		go func() {
			defer verifying.Done()
			o := h.verify(q.Name, plans[q.Name].wanted, traffic+90*time.Second, 2*instances*pipeline*batch)
			mu.Lock()
			outcomes[q.Name] = o
			mu.Unlock()
		}()
	}
	defer verifying.Wait() // also when the roll ends the test early

	// roll replaces each of running, one at a time, with an instance that
	// start gives: start it, let it dispatch, then SIGTERM the one it
	// replaces and wait for its clean exit.
	roll := func(what string, running []*proc, start func() *proc) []*proc {
		var next []*proc
		for i, p := range running {
			n := start()
			waitStarted(t, n)
			next = append(next, n)
			time.Sleep(2 * time.Second)
			p.signal(syscall.SIGTERM)
			if code := p.exitCode(60 * time.Second); code != 0 {
				t.Errorf("%s: instance %d exited %d after SIGTERM, want 0", what, i, code)
			}
			stops++
			time.Sleep(2 * time.Second)
		}
		t.Logf("%s done %.1f s into the traffic", what, time.Since(from).Seconds())
		return next
	}
	time.Sleep(time.Until(from.Add(3 * time.Second)))
	current := roll("upgrade "+rel.Version+" -> current tree", old, h.start)
	roll("rollback current tree -> "+rel.Version, current, startOld)
	if left := time.Until(from.Add(traffic)); left < 2*time.Second {
		t.Errorf("the roll outlasted the traffic (%.1f s left): the last steps ran without tasks falling due", left.Seconds())
	}
	producers.Wait()
	verifying.Wait()

	dups := 0
	for _, q := range queues {
		dups += outcomes[q.Name].Duplicates
		// Early by the Redis clock: x-published-us against x-due-ms.
		h.mu.Lock()
		rs := h.delivered[q.Name]
		h.mu.Unlock()
		checkStamps(t, rs, plans[q.Name].wanted, 0)
		h.emptyAtEnd(q)
	}
	t.Logf("rolling upgrade %s -> current tree -> %s, %d SIGTERMs: %d tasks, %d duplicates",
		rel.Version, rel.Version, stops, len(plans["roll"].wanted)+len(plans["roll4"].wanted), dups)
}
