// Package tests drives real dispatcher processes, built from cmd/dispatcher,
// against real Redis and RabbitMQ servers.
//
// Most tests run one at a time, since what they check is timed. Those that
// mostly wait (a walk's minute, a record's expiry, a package install, a
// release build, a consumer's restart) call t.Parallel, so that they wait
// together once the others are done and the package stays within CI's time.
package tests

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dispatcher-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "dispatcher")
	// Built with -race so a data race in the daemon fails the tests too,
	// except for benchmarks, which measure the real thing.
	flag.Parse()
	args := []string{"build", "-race", "-o", binary, "../cmd/dispatcher"}
	if f := flag.Lookup("test.bench"); f != nil && f.Value.String() != "" {
		args = []string{"build", "-o", binary, "../cmd/dispatcher"}
	}
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build dispatcher:", err)
		os.Exit(1)
	}
	code := m.Run()
	testenv.StopPrivateRabbit() // its process watcher would count as a leak
	testenv.StopSharedRabbitCluster()
	// Every test's consumers, clients and processes are gone by now; a
	// goroutine still running is a leak.
	if err := goleak.Find(netProxyLeaks...); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "goroutine leak:", err)
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is one running dispatcher.
type proc struct {
	t    testing.TB
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error
}

// start runs the dispatcher with env (on top of a clean environment).
func start(t testing.TB, env map[string]string) *proc {
	t.Helper()
	return startBinary(t, binary, env)
}

// startBinary is start with another build of the dispatcher, e.g. a
// previous release (upgrade_test.go).
func startBinary(t testing.TB, bin string, env map[string]string) *proc {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = childEnv(env)
	p := &proc{t: t, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.signal(syscall.SIGKILL)
		<-p.done
		if strings.Contains(p.out.String(), "DATA RACE") {
			t.Errorf("data race in dispatcher:\n%s", p.out.String())
		}
		if t.Failed() {
			t.Logf("dispatcher pid %d output:\n%s", cmd.Process.Pid, tail(p.out.String(), 4000))
		}
	})
	return p
}

// childEnv is the environment of a dispatcher process the tests run: this
// one's without its DISPATCHER_* settings, then env.
func childEnv(env map[string]string) []string {
	var out []string
	for _, kv := range os.Environ() {
		// DISPATCHER_TEST_* are test knobs (e.g. a CPU profile): passed on.
		if !strings.HasPrefix(kv, "DISPATCHER_") || strings.HasPrefix(kv, "DISPATCHER_TEST_") {
			out = append(out, kv)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("dispatcher did not exit within %s; output:\n%s", timeout, tail(p.out.String(), 3000))
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// queueSpec is one queue under test.
type queueSpec struct {
	Name, Exchange, RoutingKey string
	Shards                     int
}

// harness is one test's isolated world: its own key prefix, queues,
// exchanges and consumers.
type harness struct {
	t      testing.TB
	prefix string
	rdb    redis.UniversalClient
	conn   *amqp.Connection
	queues []queueSpec
	got    map[string]<-chan amqp.Delivery
	extra  map[string]string
	mu     sync.Mutex
	// delivered is what the last verify of each queue collected,
	// duplicates included (verify may run for several queues at once).
	delivered map[string][]received
}

func newHarness(t testing.TB, queues ...queueSpec) *harness {
	t.Helper()
	return newHarnessOn(t, testenv.Redis(t), queues...)
}

// newHarnessOn is newHarness with producing, leftovers and clean-up on rdb,
// e.g. a private Redis server a fault test breaks, or a private Redis
// Cluster (a *redis.ClusterClient); the test points the dispatcher at it
// with h.extra["DISPATCHER_REDIS_URL"].
func newHarnessOn(t testing.TB, rdb redis.UniversalClient, queues ...queueSpec) *harness {
	t.Helper()
	h := &harness{t: t, prefix: testenv.Name(t), rdb: rdb, conn: testenv.AMQP(t),
		got: map[string]<-chan amqp.Delivery{}, extra: map[string]string{}, delivered: map[string][]received{}}
	if c, ok := rdb.(*redis.Client); ok {
		testenv.CleanRedis(t, c, h.prefix) // a private cluster goes with its test
	}
	for _, q := range queues {
		if q.Exchange == "" {
			q.Exchange = h.prefix + "." + q.Name
		}
		if q.RoutingKey == "" {
			q.RoutingKey = q.Name
		}
		h.queues = append(h.queues, q)
		h.got[q.Name] = testenv.Consumer(t, h.conn, q.Exchange, q.RoutingKey)
	}
	return h
}

func (h *harness) env() map[string]string {
	var names []string
	env := map[string]string{
		"DISPATCHER_REDIS_URL":        testenv.RedisURL(h.t),
		"DISPATCHER_AMQP_URL":         testenv.AMQPURL(h.t),
		"DISPATCHER_KEY_PREFIX":       h.prefix,
		"DISPATCHER_LOG_LEVEL":        "info",
		"DISPATCHER_SHUTDOWN_TIMEOUT": "5s",
	}
	for _, q := range h.queues {
		names = append(names, q.Name)
		p := config.QueuePrefix(q.Name) + "_"
		env[p+"SHARDS"] = fmt.Sprint(q.Shards)
		env[p+"EXCHANGE"] = q.Exchange
		env[p+"ROUTING_KEY"] = q.RoutingKey
	}
	env["DISPATCHER_QUEUES"] = strings.Join(names, ",")
	for k, v := range h.extra {
		env[k] = v
	}
	return env
}

func (h *harness) start() *proc { return start(h.t, h.env()) }

func (h *harness) producer(queue string) *shard.Producer {
	for _, q := range h.queues {
		if q.Name == queue {
			p, err := shard.NewProducer(h.rdb, h.prefix, q.Name, q.Shards)
			if err != nil {
				h.t.Fatal(err)
			}
			return p
		}
	}
	h.t.Fatalf("no queue %s", queue)
	return nil
}

// received is one delivery as a consumer saw it.
type received struct {
	at time.Time
	d  amqp.Delivery
}

// collect reads deliveries of queue until want distinct message ids were
// seen and then a short quiet period passed (to catch late duplicates),
// or until timeout. It returns every delivery, duplicates included.
func (h *harness) collect(queue string, want int, timeout time.Duration) []received {
	h.t.Helper()
	var out []received
	ids := map[string]bool{}
	deadline := time.After(timeout)
	var quiet <-chan time.Time
	for {
		select {
		case d := <-h.got[queue]:
			out = append(out, received{at: time.Now(), d: d})
			ids[d.MessageId] = true
			if len(ids) >= want && quiet == nil {
				quiet = time.After(500 * time.Millisecond)
			}
		case <-quiet:
			return out
		case <-deadline:
			return out
		}
	}
}

// countIDs returns distinct ids and how many deliveries were duplicates.
func countIDs(rs []received) (map[string]int, int) {
	ids := map[string]int{}
	dups := 0
	for _, r := range rs {
		ids[r.d.MessageId]++
		if ids[r.d.MessageId] > 1 {
			dups++
		}
	}
	return ids, dups
}

// scheduleSpread schedules n tasks "<tag>-<i>" over the window [from, from+span).
func scheduleSpread(t testing.TB, p *shard.Producer, tag string, n int, from time.Time, span time.Duration) map[string]int64 {
	t.Helper()
	want := map[string]int64{}
	var tasks []shard.Task
	for i := 0; i < n; i++ {
		due := from.Add(time.Duration(int64(span) * int64(i) / int64(n)))
		m := []byte(fmt.Sprintf("%s-%d", tag, i))
		tasks = append(tasks, shard.Task{Member: m, Due: due})
		want[shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
		if len(tasks) == 1000 {
			if err := p.ScheduleMany(context.Background(), tasks); err != nil {
				t.Fatal(err)
			}
			tasks = tasks[:0]
		}
	}
	if err := p.ScheduleMany(context.Background(), tasks); err != nil {
		t.Fatal(err)
	}
	return want
}

// missing lists wanted ids never received.
func missing(want map[string]int64, got map[string]int) []string {
	var out []string
	for id := range want {
		if got[id] == 0 {
			out = append(out, id)
		}
	}
	return out
}

// leftovers counts what is still in Redis for a queue: pending, in flight, dead.
func (h *harness) leftovers(q queueSpec) (pending, inflight, dead int64) {
	ctx := context.Background()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	for i := 0; i < q.Shards; i++ {
		pending += h.rdb.ZCard(ctx, k.Pending(i)).Val()
		inflight += h.rdb.ZCard(ctx, k.Inflight(i)).Val()
		dead += h.rdb.ZCard(ctx, k.Dead(i)).Val()
	}
	return
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// queueName is the name of the broker queue a test's consumer of queue
// declares.
func (h *harness) queueName(queue string) string { return h.prefix + "." + queue }
