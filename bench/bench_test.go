package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

var binary string

// TestMain builds the dispatcher the bench starts as its instances.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dispatcher-bench-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "dispatcher")
	build := exec.Command("go", "build", "-o", binary, "../cmd/dispatcher")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build dispatcher:", err)
		os.Exit(1)
	}
	code := m.Run()
	testenv.StopSharedRabbitCluster()
	testenv.StopPrivateRabbit()
	os.RemoveAll(dir)
	os.Exit(code)
}

// runBench runs `dispatcher bench` in-process against the test servers.
func runBench(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return runBenchOn(t, testenv.RedisURL(t), args...)
}

// runBenchOn runs the bench against the Redis at redisURL. Memory figures
// need a Redis of the test's own: on the shared one, other packages' tests
// write and free memory while a point loads.
func runBenchOn(t *testing.T, redisURL string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	args = append([]string{"-redis", redisURL, "-amqp", testenv.AMQPURL(t)}, args...)
	var out, errOut bytes.Buffer
	code = Main(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// A tiny bench of every mode end to end: one instance, a few thousand
// tasks. The figures are not judged (the machine is shared), only that
// they are there and sane, nothing went missing, and nothing was left.
func TestBenchEndToEnd(t *testing.T) {
	dir := t.TempDir()
	jsonPath, svgPath := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.svg")
	code, stdout, stderr := runBench(t,
		"-mode", "backlog,rate,idle", "-backlog", "3000", "-window", "2000",
		"-rate", "500", "-duration", "2s", "-idle-duration", "1s", "-queues", "3", "-prefetch", "200",
		"-shards", "4", "-batch", "200", "-size", "100", "-queue-type", "transient",
		"-ceiling-count", "2000", "-ceiling-window", "100,1000", "-stall", "20s",
		"-json", jsonPath, "-svg", svgPath, "-dispatcher", binary)
	t.Logf("stdout:\n%s", stdout)
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| pending N |", "| rate/s | queues | instances |", "| 500 | 3 | 1 | 4 |", "| instances | queues | shards | pending |", "Command: `dispatcher bench -redis",
		"Consumer: manual ack of each delivery right after it is recorded, prefetch 200", "| dispatch p50 / p99 / p99.9 / max ms | consumer p50 / p99 / p99.9 / max ms |",
		"| first 1 s |", "Redis CPU s/10k tasks", "Redis CPU %", "Note: Redis CPU is everything"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	if !strings.Contains(stderr, "received") {
		t.Errorf("no progress on stderr:\n%s", stderr)
	}

	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 {
		t.Errorf("failures: %q", rep.Failures)
	}
	if rep.Options.AutoAck || rep.Options.Prefetch != 200 || !strings.HasPrefix(rep.Consumer, "manual ack") {
		t.Errorf("consumer: autoack %v, prefetch %d, %q", rep.Options.AutoAck, rep.Options.Prefetch, rep.Consumer)
	}
	if len(rep.Ceilings) != 1 || len(rep.Ceilings[0].Tried) != 2 {
		t.Fatalf("ceilings: %+v", rep.Ceilings)
	}
	for _, run := range rep.Ceilings[0].Tried {
		if run.PerSec <= 0 || run.Missing != 0 || run.Latency.Count != 2000 || run.PerSec > rep.Ceilings[0].PerSec {
			t.Errorf("ceiling run %+v of %+v", run, rep.Ceilings[0])
		}
	}
	if len(rep.Results) != 2 || len(rep.Idle) != 2 {
		t.Fatalf("%d results and %d idle results, want 2 and 2", len(rep.Results), len(rep.Idle))
	}
	backlog, rate := rep.Results[0], rep.Results[1]
	checkResult(t, backlog, 2000)
	checkResult(t, rate, 1000) // over -queues 3: every queue's tasks arrive
	if backlog.Queues != 0 || rate.Queues != 3 {
		t.Errorf("queues: backlog %d, rate %d; want 0 (one) and 3", backlog.Queues, rate.Queues)
	}
	if backlog.Ratio <= 0 || backlog.Ceiling <= 0 || backlog.StartupMs <= 0 {
		t.Errorf("backlog: ratio %v, ceiling %v, startup %v ms", backlog.Ratio, backlog.Ceiling, backlog.StartupMs)
	}
	checkViews(t, rep.DispatcherStamps, backlog)
	checkViews(t, rep.DispatcherStamps, rate)
	if backlog.FirstSecond != nil {
		t.Errorf("backlog: a first second %+v", backlog.FirstSecond)
	}
	// The start of traffic: the 500 tasks due in the first second.
	if f := rate.FirstSecond; f == nil || f.Tasks != 500 || f.Lateness.Count != 500 || f.Ms != 1000 || f.FromDueMs <= 0 ||
		(f.DispatchLateness != nil) != rep.DispatcherStamps {
		t.Errorf("rate: first second %+v", f)
	}
	// A backlog instance's CPU counts from its start, which alone takes
	// more than the 10 ms /proc resolves.
	if backlog.CPUSeconds <= 0 || backlog.CPUPer10k <= 0 {
		t.Errorf("backlog CPU: %v s, %v s/10k", backlog.CPUSeconds, backlog.CPUPer10k)
	}
	if bg := rep.Idle[0]; bg.Instances != 0 || bg.Seconds < 1 {
		t.Errorf("background: %+v", bg)
	}
	idle := rep.Idle[1]
	if idle.CmdsPerSec <= 0 || idle.ScriptsPerSec <= 0 || idle.Unexpected != 0 || idle.PeakRSSMB <= 0 || idle.Queues != 3 ||
		idle.RedisCPUPercent == nil || *idle.RedisCPUPercent <= 0 || len(idle.CPUPercentEach) != 1 {
		t.Errorf("idle: %+v", idle)
	}

	// The picture is well-formed XML with a curve per point.
	svg, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(svg))
	curves := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			curves++
		}
	}
	want := 3 // ceiling, backlog, rate
	if rep.DispatcherStamps {
		want += 2 // the dispatch views of backlog and rate
	}
	if curves != want {
		t.Errorf("%d curves in the SVG, want %d", curves, want)
	}

	assertCleanedUp(t, rep.RunID, backlog.Name, rate.Name, idle.Name)
}

// checkViews checks the dispatch view: there for every task when the
// dispatcher stamps, absent otherwise.
func checkViews(t *testing.T, stamps bool, r *Result) {
	t.Helper()
	d := r.DispatchLateness
	if !stamps {
		if d != nil || r.Unstamped != int64(r.Delivered) {
			t.Errorf("%s: dispatch view %+v, %d unstamped, from a dispatcher that does not stamp", r.Point, d, r.Unstamped)
		}
		return
	}
	// The stamp is taken when the batch's publish begins, before the
	// consumer gets it: the dispatch view's median is below the
	// consumer's (both allow for a clock offset of a few ms at most).
	if d == nil || d.Count != r.Delivered || r.Unstamped != 0 || d.P50 > d.P99 || d.P99 > d.Max || len(d.Curve) == 0 ||
		d.P50 > r.Lateness.P50+5 {
		t.Errorf("%s: dispatch view %+v, %d unstamped; consumer view p50 %v", r.Point, d, r.Unstamped, r.Lateness.P50)
	}
}

func checkResult(t *testing.T, r *Result, want int) {
	t.Helper()
	if r.Scheduled != want || r.Delivered != want || r.Missing != 0 || r.Duplicates != 0 || r.Unexpected != 0 ||
		r.Early != 0 || r.BadID != 0 || r.Malformed != 0 || len(r.Errors) != 0 {
		t.Errorf("%s: scheduled %d delivered %d missing %d dups %d unexpected %d early %d bad id %d malformed %d errors %q",
			r.Point, r.Scheduled, r.Delivered, r.Missing, r.Duplicates, r.Unexpected, r.Early, r.BadID, r.Malformed, r.Errors)
	}
	l := r.Lateness
	if l.Count != want || l.P50 > l.P99 || l.P99 > l.P999 || l.P999 > l.Max || l.Min < 0 || len(l.Curve) == 0 {
		t.Errorf("%s: lateness %+v", r.Point, l)
	}
	sum := 0
	for _, s := range r.ShardLateness {
		sum += s.Count
	}
	if len(r.ShardLateness) != r.Shards || sum != want || r.ShardP99Worst < r.ShardP99Median {
		t.Errorf("%s: per-shard lateness of %d shards covers %d tasks: %+v", r.Point, len(r.ShardLateness), sum, r.ShardLateness)
	}
	if r.RedisCPUPer10k == nil || *r.RedisCPUPer10k <= 0 || r.Redis.CPUSeconds == nil || len(r.CPUSecondsEach) != r.Instances ||
		len(r.CPUPer10kEach) != r.Instances {
		t.Errorf("%s: Redis CPU %v s/10k, %v s; instances' CPU %v s, %v s/10k", r.Point, r.RedisCPUPer10k, r.Redis.CPUSeconds,
			r.CPUSecondsEach, r.CPUPer10kEach)
	}
	if r.PerSec <= 0 || r.CmdsPerTask <= 0 || r.ScriptsPerTask <= 0 || r.Redis.ByCommand["evalsha"] == 0 ||
		r.PeakRSSMB <= 1 || len(r.RSSMB) != r.Instances || r.ClaimBatchMean <= 0 {
		t.Errorf("%s: %.0f tasks/s, %.2f cmds/task, %.3f scripts/task, %v, RSS %v MB, batch mean %v",
			r.Point, r.PerSec, r.CmdsPerTask, r.ScriptsPerTask, r.Redis.ByCommand, r.RSSMB, r.ClaimBatchMean)
	}
}

// assertCleanedUp checks that no key of the run is left and that the
// points' exchanges and queues are gone.
func assertCleanedUp(t *testing.T, runID string, names ...string) {
	t.Helper()
	assertCleanedUpIn(t, testenv.Redis(t), runID, names...)
}

// assertCleanedUpIn is assertCleanedUp with the bench's keys looked for in rdb.
func assertCleanedUpIn(t *testing.T, rdb *redis.Client, runID string, names ...string) {
	t.Helper()
	ctx := context.Background()
	keys, _, err := rdb.Scan(ctx, 0, "dispatcher-bench-"+runID+"-*", 100000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		t.Errorf("keys left behind: %q", keys)
	}
	conn := testenv.AMQP(t)
	for _, n := range names {
		for what, check := range map[string]func(*amqp.Channel) error{
			"exchange": func(ch *amqp.Channel) error {
				return ch.ExchangeDeclarePassive(n, "direct", true, false, false, false, nil)
			},
			"queue": func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(n, true, false, false, false, nil)
				return err
			},
		} {
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			var ae *amqp.Error
			if err := check(ch); !errors.As(err, &ae) || ae.Code != amqp.NotFound {
				t.Errorf("%s %s still there (%v)", what, n, err)
			}
			ch.Close()
		}
	}
}

// A dispatcher that does not dispatch: every task goes missing, and the
// bench says so with exit code 1 and still cleans up.
func TestBenchFailsWhenTasksGoMissing(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "bench.json")
	code, stdout, stderr := runBench(t, "-mode", "backlog", "-backlog", "100", "-ceiling-count", "100",
		"-queue-type", "transient", "-stall", "1s", "-dispatcher", "/bin/true", "-json", jsonPath)
	if code != exitFailure {
		t.Fatalf("exit code %d, want %d; stdout:\n%s\nstderr:\n%s", code, exitFailure, stdout, stderr)
	}
	if !strings.Contains(stdout, "FAILED") {
		t.Errorf("no FAILED section:\n%s", stdout)
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) == 0 {
		t.Error("no failure in the JSON report")
	}
	assertCleanedUp(t, rep.RunID)
}

// A backlog and two rate points (one queue, three) against a private
// Redis Cluster (3 primaries with a replica each): everything arrives, the
// Redis figures cover every primary, each holding some of the 16 shards of
// every queue, the bench's own ZADDs are taken out where they went, and
// no key is left on any.
func TestBenchRedisCluster(t *testing.T) {
	cluster := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "bench.json")
	var out, errOut bytes.Buffer
	code := Main([]string{"-redis", cluster.URL(), "-amqp", testenv.AMQPURL(t),
		"-mode", "backlog,rate", "-backlog", "2000", "-window", "1500", "-rate", "500", "-duration", "2s",
		"-queues", "1,3", "-shards", "16", "-batch", "200", "-size", "100", "-queue-type", "transient", "-autoack",
		"-ceiling-count", "1000", "-ceiling-window", "300", "-stall", "20s",
		"-json", jsonPath, "-dispatcher", binary}, &out, &errOut)
	t.Logf("stdout:\n%s", out.String())
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "| point | primary | shards |") || !strings.Contains(out.String(), "Consumer: auto-ack (no prefetch)") {
		t.Errorf("no per-primary table, or not the auto-ack consumer")
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 || len(rep.Results) != 3 {
		t.Fatalf("failures %q, %d results", rep.Failures, len(rep.Results))
	}
	if rep.Machine.RedisMode != "cluster of 3 primaries" {
		t.Errorf("redis mode %q", rep.Machine.RedisMode)
	}
	checkResult(t, rep.Results[0], 1500)
	checkResult(t, rep.Results[1], 1000)
	checkResult(t, rep.Results[2], 1000)
	if rep.Results[2].Queues != 3 {
		t.Errorf("%s: %d queues", rep.Results[2].Point, rep.Results[2].Queues)
	}
	if !rep.Options.AutoAck || rep.Options.Prefetch != 0 {
		t.Errorf("options: autoack %v, prefetch %d", rep.Options.AutoAck, rep.Options.Prefetch)
	}
	for _, r := range rep.Results {
		checkViews(t, rep.DispatcherStamps, r)
		u := r.Redis
		if len(u.Primaries) != 3 {
			t.Fatalf("%s: %d primaries: %+v", r.Point, len(u.Primaries), u.Primaries)
		}
		var cmds, zadds int64
		var cpu float64
		shards := 0
		for _, p := range u.Primaries {
			if p.Commands <= 0 || p.ScriptCalls <= 0 || p.CmdsPerTask <= 0 || p.Shards <= 0 || p.CPUSeconds == nil || p.CPUPercent == nil {
				t.Errorf("%s: primary %+v", r.Point, p)
			} else {
				cpu += *p.CPUSeconds
			}
			cmds += p.Commands
			zadds += p.Subtracted["zadd"]
			shards += p.Shards
		}
		if u.CPUSeconds == nil || math.Abs(*u.CPUSeconds-cpu) > 1e-9 {
			t.Errorf("%s: primaries' CPU sums to %v s; total %v", r.Point, cpu, u.CPUSeconds)
		}
		if cmds != u.Commands || shards != 16*max(r.Queues, 1) || zadds != u.Subtracted["zadd"] {
			t.Errorf("%s: primaries sum to %d commands, %d shards, %d ZADDs subtracted; totals %d, %d",
				r.Point, cmds, shards, zadds, u.Commands, u.Subtracted["zadd"])
		}
	}
	for _, r := range rep.Results[1:] {
		if r.Redis.Subtracted["zadd"] == 0 {
			t.Errorf("%s: no ZADD subtracted", r.Point)
		}
	}
	// No key of the run is left on any primary.
	ctx := context.Background()
	err := cluster.Client().ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		keys, err := c.Keys(ctx, "dispatcher-bench-"+rep.RunID+"-*").Result()
		if err == nil && len(keys) > 0 {
			t.Errorf("keys left behind on %s: %q", c.Options().Addr, keys)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readReport reads the JSON report the bench wrote to path.
func readReport(t *testing.T, path string) Report {
	t.Helper()
	var rep Report
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("JSON report %s: %v", path, err)
	}
	return rep
}

// The burst and memory modes at small scale: a burst of 10,000 tasks with
// one due time drains completely, none early, with the probes' figures
// there; memory reads a growth per task above the member's size. Only that
// the figures exist and are sane is checked: timings are the bench's to
// report, not a test's to judge on a shared machine.
func TestBenchBurstAndMemory(t *testing.T) {
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	code, stdout, stderr := runBenchOn(t, srv.URL(),
		"-mode", "burst,memory", "-backlog", "10000", "-burst-lead", "5s", "-instances", "2", "-shards", "4", "-size", "100",
		"-queue-type", "transient", "-ceiling-count", "2000", "-ceiling-window", "300", "-stall", "20s",
		"-json", jsonPath, "-dispatcher", binary)
	t.Logf("stdout:\n%s", stdout)
	if code != exitOK {
		t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
	}
	for _, want := range []string{"| due N | instances |", "| ZADD p50 / p99 / max ms |", "| tasks | shards | member B | form | bytes/task |"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("tables lack %q", want)
		}
	}
	rep := readReport(t, jsonPath)
	if len(rep.Failures) != 0 || len(rep.Results) != 1 || len(rep.Memory) != 1 {
		t.Fatalf("failures %q, %d results, %d memory results", rep.Failures, len(rep.Results), len(rep.Memory))
	}
	r := rep.Results[0]
	checkResult(t, r, 10000)
	b := r.Burst
	if b == nil {
		t.Fatal("no burst figures")
	}
	sum := 0
	for _, n := range b.PerSecond {
		sum += n
	}
	if sum != 10000 || b.DrainSeconds <= 0 || b.DrainPerSec <= 0 || r.Ratio <= 0 {
		t.Errorf("drain: %d tasks over %v s at %v/s, ratio %v", sum, b.DrainSeconds, b.DrainPerSec, r.Ratio)
	}
	// A producer ZADD every 2 ms over the 2 s before and the drain.
	if b.Before.Count < 100 || b.Producer.Count < 1 || b.Stats.Count < 1 || b.Producer.P50 > b.Producer.P99 || b.Producer.P99 > b.Producer.Max {
		t.Errorf("probes: producer before %+v, during %+v, stats %+v", b.Before, b.Producer, b.Stats)
	}
	if b.SlowNote != "" || b.SlowUs != 1000 {
		t.Errorf("slow log: %q, threshold %d µs", b.SlowNote, b.SlowUs)
	}
	// The slow log settings are put back.
	if got := srv.Client().ConfigGet(context.Background(), "slowlog-log-slower-than").Val()["slowlog-log-slower-than"]; got == "1000" {
		t.Errorf("slowlog-log-slower-than left at %s", got)
	}
	mem := rep.Memory[0]
	if mem.Backlog != 10000 || mem.PerTask <= 100 || mem.PerTask > 1000 || mem.In16GB <= 0 {
		t.Errorf("memory: %+v", mem)
	}
	assertCleanedUpIn(t, srv.Client(), rep.RunID, r.Name)
}

// A memory point measured while another client writes to the same Redis
// says so: used_memory growth then holds that client's writes and frees
// (on a shared Redis in CI a 100-byte task once read as 33 bytes), so the
// report must not pass the figure off as the tasks' alone. A client that
// stays connected is counted from CLIENT LIST; one that connects for each
// write and is gone when the load ends, by the connections Redis took.
func TestBenchMemoryNamesOtherClients(t *testing.T) {
	for _, tc := range []struct {
		name       string
		reconnect  bool
		wantNoteOn string
	}{
		{"connected", false, "other Redis clients sent commands"},
		{"gone", true, "connections of other clients"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := testenv.StartRedis(t, testenv.RedisOptions{})
			ctx, cancel := context.WithCancel(context.Background())
			// Connected (and its first write done) before the bench starts.
			other := redis.NewClient(&redis.Options{Addr: srv.Addr(), ClientName: "another-app"})
			if err := other.Set(ctx, "another-app", "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := 0; ctx.Err() == nil; i++ {
					if other == nil {
						other = redis.NewClient(&redis.Options{Addr: srv.Addr(), ClientName: "another-app"})
					}
					other.Set(ctx, fmt.Sprintf("another-app:%d", i%1000), strings.Repeat("x", 200), 0)
					if tc.reconnect {
						other.Close()
						other = nil
					}
					time.Sleep(5 * time.Millisecond)
				}
				if other != nil {
					other.Close()
				}
			}()
			jsonPath := filepath.Join(t.TempDir(), "bench.json")
			code, stdout, stderr := runBenchOn(t, srv.URL(), "-mode", "memory", "-backlog", "20000", "-shards", "4", "-size", "100",
				"-json", jsonPath, "-dispatcher", binary)
			cancel()
			<-done
			t.Logf("stdout:\n%s", stdout)
			if code != exitOK {
				t.Fatalf("exit code %d; stderr:\n%s", code, stderr)
			}
			rep := readReport(t, jsonPath)
			if len(rep.Memory) != 1 {
				t.Fatalf("memory results %+v: want one", rep.Memory)
			}
			// The connected writer opens none during the load: the bench's
			// own connections are not taken for another client's.
			if m := rep.Memory[0]; !tc.reconnect && (m.OtherClients < 1 || m.OtherConnections != 0) || tc.reconnect && m.OtherConnections < 1 {
				t.Errorf("other clients %d, other connections %d: want the writer counted", m.OtherClients, m.OtherConnections)
			}
			if !strings.Contains(stdout, tc.wantNoteOn) {
				t.Errorf("the report does not say %q", tc.wantNoteOn)
			}
		})
	}
}
