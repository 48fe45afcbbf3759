package tests

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// Redis faults: each test runs the dispatcher against a private
// redis-server (testenv.StartRedis) that it breaks under steady traffic,
// and ends with h.verify.

// feeder is a producer with steady traffic: a planned batch every 20 ms,
// each due 300 ms after its planned send. The whole plan (want) is known
// before it starts, so verify can collect deliveries while faults happen.
// A task whose ZADD fails (connection lost, LOADING, READONLY, OOM) is sent
// again unchanged until it is stored, as a careful producer would: ZADD of
// the same member and score is idempotent, so each task is scheduled once
// (one already delivered and stored again by such a retry, after a lost
// reply, arrives twice, which verify counts as a duplicate). Batches
// behind plan go out at once.
type feeder struct {
	t    testing.TB
	want map[string]int64
	plan []planned

	// sending is held while a ZADD is on its way: use waits for it.
	sending  sync.Mutex
	mu       sync.Mutex
	p        *shard.Producer
	failed   int   // failed sends, each retried
	firstErr error // the first failure, as the producer saw it
	lastFail time.Time
	lastOK   time.Time
	done     chan struct{}
}

type planned struct {
	at    time.Time
	tasks []shard.Task
}

const feedEvery = 20 * time.Millisecond

// newFeeder plans perBatch tasks every 20 ms for span, members
// "<tag>-<n><pad>".
func newFeeder(t testing.TB, p *shard.Producer, tag string, span time.Duration, perBatch int, pad string) *feeder {
	f := &feeder{t: t, p: p, want: map[string]int64{}, done: make(chan struct{})}
	begin := time.Now().Add(feedEvery)
	n := 0
	for at := begin; at.Before(begin.Add(span)); at = at.Add(feedEvery) {
		b := planned{at: at}
		for i := 0; i < perBatch; i++ {
			n++
			due := at.Add(300*time.Millisecond + feedEvery*time.Duration(i)/time.Duration(perBatch))
			m := []byte(fmt.Sprintf("%s-%d%s", tag, n, pad))
			b.tasks = append(b.tasks, shard.Task{Member: m, Due: due})
			f.want[shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
		}
		f.plan = append(f.plan, b)
	}
	return f
}

func (f *feeder) start() *feeder {
	go func() {
		defer close(f.done)
		for _, b := range f.plan {
			time.Sleep(time.Until(b.at))
			if !f.send(b.tasks) {
				return
			}
		}
	}()
	return f
}

// send stores tasks one ZADD each, retrying each failed one until it is
// stored (false after 30 s). One ZADD per call keeps refusals exact: a
// task refused with an error reply (OOM, LOADING) is surely not stored, so
// only a lost connection can make a retry store a task twice.
func (f *feeder) send(tasks []shard.Task) bool {
	deadline := time.Now().Add(30 * time.Second)
	for _, task := range tasks {
		for {
			f.sending.Lock()
			f.mu.Lock()
			p := f.p
			f.mu.Unlock()
			if p == nil { // paused (see use)
				f.sending.Unlock()
				time.Sleep(10 * time.Millisecond)
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := p.Schedule(ctx, task.Member, task.Due)
			cancel()
			f.sending.Unlock()
			f.mu.Lock()
			if err == nil {
				f.lastOK = time.Now()
				f.mu.Unlock()
				break
			}
			f.failed++
			f.lastFail = time.Now()
			if f.firstErr == nil {
				f.firstErr = err
			}
			f.mu.Unlock()
			if time.Now().After(deadline) {
				f.t.Errorf("feeder: task not stored after 30s: %v", err)
				return false
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return true
}

// use switches the feeder to another producer (another server); nil
// pauses it. It returns once no ZADD of the former one is on its way.
func (f *feeder) use(p *shard.Producer) {
	f.sending.Lock()
	defer f.sending.Unlock()
	f.mu.Lock()
	f.p = p
	f.mu.Unlock()
}

// wait waits until the whole plan was sent and logs how it went.
func (f *feeder) wait() {
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	f.t.Logf("producer: %d tasks in %d batches, %d failed ZADDs retried (first: %v)", len(f.want), len(f.plan), f.failed, f.firstErr)
}

// logTrouble logs the dispatcher's warnings and errors: what an operator
// would have seen of the fault.
func logTrouble(t *testing.T, p *proc) {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
			lines = append(lines, "  "+l)
		}
	}
	t.Logf("dispatcher warnings and errors (%d):\n%s", len(lines), strings.Join(lines, "\n"))
}

func mergeWant(ms ...map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// metricSum adds up the samples of a metric whose line starts with prefix
// (name and, optionally, the start of its labels).
func metricSum(t *testing.T, addr, prefix string) float64 {
	t.Helper()
	sum := 0.0
	for _, l := range strings.Split(get(t, "http://"+addr+"/metrics"), "\n") {
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		f := strings.Fields(l)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// redisInfo reads one field of INFO from c.
func redisInfo(t *testing.T, c *redis.Client, section, field string) string {
	t.Helper()
	s, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(field) + `:(.*?)\r?$`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("INFO %s has no %s", section, field)
	}
	return m[1]
}

// TestRedisKilledWithAOF kills Redis (SIGKILL) three times under traffic,
// down for 0.5 s, 1.5 s and 3 s, and restarts it from its append-only file
// (appendfsync always): every task whose ZADD was acknowledged is
// delivered; the dispatcher rides through the outages.
func TestRedisKilledWithAOF(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{AOF: true, AppendFsync: "always"})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: "aof", Shards: 8})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	// A claim applied just before a kill, whose reply was lost, leaves its
	// tasks in flight until their lease runs out: keep it short, but longer
	// than the longest outage, or confirmed tasks whose forgetting waits
	// for Redis to come back are reaped and sent again.
	h.extra["DISPATCHER_LEASE"] = "5s"
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "1s"
	p := h.start()
	f := newFeeder(t, h.producer("aof"), "k", 8*time.Second, 10, "").start()

	verifyWhile(h, "aof", f.want, 40*time.Second, len(f.want)/50, func() {
		// A short outage go-redis's own retries hide, then longer ones
		// the dispatcher and the producer see.
		for _, down := range []time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 3 * time.Second} {
			time.Sleep(1500 * time.Millisecond)
			srv.Kill()
			time.Sleep(down)
			srv.Restart()
			srv.WaitLoaded(10 * time.Second)
		}
		f.wait()
	})
	logTrouble(t, p)
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
	eventually(t, 10*time.Second, "nothing left in Redis", func() bool {
		pn, fl, d := h.leftovers(h.queues[0])
		return pn+fl+d == 0
	})
}

// TestRedisReadOnlyReplica points the dispatcher at a replica: its claims
// get READONLY; it keeps running, says so, and backs off rather than
// spinning. Once the replica is promoted (REPLICAOF NO ONE) everything
// goes out, including what came due meanwhile.
func TestRedisReadOnlyReplica(t *testing.T) {
	primary := testenv.StartRedis(t, testenv.RedisOptions{})
	replica := testenv.StartRedis(t, testenv.RedisOptions{
		Args: []string{"replicaof 127.0.0.1 " + strconv.Itoa(primary.Port)}})
	rc := replica.Client()
	eventually(t, 10*time.Second, "replica in sync", func() bool {
		return redisInfo(t, rc, "replication", "master_link_status") == "up"
	})
	h := newHarnessOn(t, primary.Client(), queueSpec{Name: "ro", Shards: 4})
	ctx := context.Background()
	// As after a fail-over gone wrong, the dispatcher ran against this
	// primary before, so the shard count is recorded and replicated.
	keys := shard.Keys{Prefix: h.prefix, Queue: "ro"}
	if err := shard.EnsureShardCount(ctx, h.rdb, keys, 4); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "shard count replicated", func() bool { return rc.Exists(ctx, keys.ShardCount()).Val() == 1 })

	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_REDIS_URL"] = replica.URL()
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	p := h.start()
	f := newFeeder(t, h.producer("ro"), "r", 5*time.Second, 10, "").start()

	var errs, dispatched float64
	verifyWhile(h, "ro", f.want, 40*time.Second, 0, func() {
		eventually(t, 10*time.Second, "READONLY logged", func() bool { return strings.Contains(p.out.String(), "READONLY") })
		// A replica answers PING: only the scripts' READONLY tells.
		eventually(t, 5*time.Second, "/readyz to name the read-only replica", func() bool {
			code, body := readyz(addr)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "READONLY")
		})
		errs0 := metricSum(t, addr, `dispatcher_errors_total{kind="redis"`)
		time.Sleep(2 * time.Second)
		errs = metricSum(t, addr, `dispatcher_errors_total{kind="redis"`) - errs0
		dispatched = metricSum(t, addr, "dispatcher_tasks_dispatched_total")
		// Fail-over: the replica catches up with the primary, is promoted,
		// and the producer follows it.
		// WAIT waits only for the writes of its own connection: one write
		// of its own, after every ZADD of the feeder's (use returned),
		// which the replica acknowledges after all of them. A WAIT on a
		// connection that wrote nothing returned at once, and a task
		// ZADDed just before the promotion was lost with the old primary.
		f.use(nil)
		waitConn := primary.Client().Conn()
		if err := waitConn.Incr(ctx, h.prefix+":wait").Err(); err != nil {
			t.Error(err)
		}
		if n, err := waitConn.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
			t.Errorf("WAIT 1: %d replicas, %v", n, err)
		}
		_ = waitConn.Close()
		if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
			t.Error(err)
		}
		f.use(shardProducer(t, rc, h.prefix, "ro", 4))
		eventually(t, 10*time.Second, "/readyz ready once the replica is promoted", func() bool { return readyStatus(addr) == http.StatusOK })
		f.wait()
	})
	t.Logf("against the replica: %.0f Redis errors in 2s, %.0f tasks dispatched", errs, dispatched)
	// Backing off (50 ms doubling to 2 s) gives about 6; retrying at once,
	// or whenever a producer's wake-up arrives, gives 50 and more.
	if errs > 20 {
		t.Errorf("%.0f Redis errors in 2s: the dispatcher spins on READONLY", errs)
	}
	if dispatched != 0 {
		t.Errorf("%.0f tasks dispatched from a read-only replica", dispatched)
	}
	logTrouble(t, p)
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
}

func shardProducer(t *testing.T, c *redis.Client, prefix, queue string, m int) *shard.Producer {
	t.Helper()
	p, err := shard.NewProducer(c, prefix, queue, m)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRedisLoading restarts Redis with a dataset that takes seconds to
// load: the dispatcher gets LOADING replies meanwhile, rides through them
// and dispatches everything afterwards.
func TestRedisLoading(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{AOF: true, AppendFsync: "always", Args: []string{
		"enable-debug-command local",
		// 15,000 filler keys at 100 µs each take 2 to 3 s to load
		// (key-load-delay is Redis's own knob for its loading tests), and
		// clients get LOADING replies throughout rather than a stalled socket.
		"key-load-delay 100",
		"loading-process-events-interval-bytes 1024",
	}})
	admin := srv.Client()
	ctx := context.Background()
	if err := admin.Do(ctx, "DEBUG", "POPULATE", 15000, "filler", 10).Err(); err != nil {
		t.Fatal(err)
	}
	// The filler goes into the AOF's RDB base, which key-load-delay slows.
	if err := admin.BgRewriteAOF(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "AOF rewrite", func() bool {
		return redisInfo(t, admin, "persistence", "aof_rewrite_in_progress") == "0" &&
			redisInfo(t, admin, "persistence", "aof_rewrite_scheduled") == "0"
	})

	h := newHarnessOn(t, admin, queueSpec{Name: "load", Shards: 8})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	// Longer than the outage (restart and loading), as in
	// TestRedisKilledWithAOF.
	h.extra["DISPATCHER_LEASE"] = "8s"
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "1s"
	p := h.start()
	f := newFeeder(t, h.producer("load"), "l", 5*time.Second, 10, "").start()

	var loading string
	var took time.Duration
	verifyWhile(h, "load", f.want, 40*time.Second, len(f.want)/50, func() {
		time.Sleep(1500 * time.Millisecond)
		srv.Kill()
		began := time.Now()
		srv.Restart()
		loading = redisInfo(t, admin, "persistence", "loading")
		srv.WaitLoaded(30 * time.Second)
		took = time.Since(began)
		f.wait()
	})
	t.Logf("Redis took %s from restart to loaded", took.Round(10*time.Millisecond))
	if loading != "1" {
		t.Errorf("restarted Redis was not loading (loading:%s); the test proved nothing", loading)
	}
	if !strings.Contains(p.out.String(), "LOADING") {
		t.Error("the dispatcher did not log the LOADING replies")
	}
	logTrouble(t, p)
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
}

// TestRedisOutOfMemoryNoEviction fills Redis to maxmemory under noeviction
// with tasks due in a few seconds: scheduling more fails with OOM (the
// producer sees it), nothing stored is lost, and the dispatcher keeps
// claiming, publishing and forgetting, which frees memory, after which
// scheduling works again.
func TestRedisOutOfMemoryNoEviction(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{MaxMemoryPolicy: "noeviction"})
	admin := srv.Client()
	h := newHarnessOn(t, admin, queueSpec{Name: "oom", Shards: 8})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	// Small batches: claims come back full, so the dispatcher also takes
	// shards from the balancer counter (an INCRBY) while out of memory.
	h.extra["DISPATCHER_BATCH_SIZE"] = "50"
	h.extra["DISPATCHER_LEASE"] = "5s"
	h.extra["DISPATCHER_CONFIRM_TIMEOUT"] = "2s"
	p := h.start()
	ctx := context.Background()
	eventually(t, 10*time.Second, "dispatcher started", func() bool { return strings.Contains(p.out.String(), "dispatching") })

	// 2 MB above what the server uses now, with the dispatcher connected.
	used, _ := strconv.ParseInt(redisInfo(t, admin, "memory", "used_memory"), 10, 64)
	if err := admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+2<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	pad := "-" + strings.Repeat("x", 1000)
	dueAt := time.Now().Add(3 * time.Second)
	filled, refusal := fillUntilOOM(t, admin, shard.Keys{Prefix: h.prefix, Queue: "oom"}, 8, dueAt, pad)
	t.Logf("Redis full after %d tasks of 1 KB due at once; the next ZADD got: %v", len(filled), refusal)
	if !strings.Contains(refusal.Error(), "OOM command not allowed when used memory > 'maxmemory'") {
		t.Fatalf("refusal does not say OOM: %v", refusal)
	}
	if time.Now().After(dueAt) {
		t.Fatal("filling took longer than planned; the tasks came due before Redis was full")
	}

	// Steady traffic while full: refused at first, stored once the
	// dispatcher has drained the backlog that came due.
	f := newFeeder(t, h.producer("oom"), "s", 5*time.Second, 5, pad).start()
	verifyWhile(h, "oom", mergeWant(filled, f.want), 40*time.Second, 0, f.wait)
	switch {
	case f.firstErr == nil:
		t.Error("no scheduling failed: Redis was not out of memory")
	case !strings.Contains(f.firstErr.Error(), "OOM command not allowed"):
		t.Errorf("the producer's error does not say OOM: %v", f.firstErr)
	case !f.lastOK.After(f.lastFail):
		t.Error("scheduling never recovered")
	}
	if strings.Contains(p.out.String(), "may evict") {
		t.Error("eviction warning under noeviction")
	}
	logTrouble(t, p)
	if !p.running() {
		t.Fatal("dispatcher exited")
	}
}

// fillUntilOOM schedules tasks due at due, 200 single-member ZADDs per
// round trip, until Redis refuses one. Each ZADD's reply says for sure
// whether that task was stored; the stored ones are returned.
func fillUntilOOM(t *testing.T, c *redis.Client, k shard.Keys, m int, due time.Time, pad string) (map[string]int64, error) {
	t.Helper()
	ctx := context.Background()
	want := map[string]int64{}
	for n := 0; n < 100000; {
		pipe := c.Pipeline()
		members := make([][]byte, 200)
		cmds := make([]*redis.IntCmd, len(members))
		for i := range members {
			n++
			members[i] = []byte(fmt.Sprintf("fill-%d%s", n, pad))
			cmds[i] = pipe.ZAdd(ctx, k.Shard(members[i], m), redis.Z{Score: float64(due.UnixMilli()), Member: members[i]})
		}
		_, _ = pipe.Exec(ctx)
		var refusal error
		for i, cmd := range cmds {
			var re redis.Error
			switch err := cmd.Err(); {
			case err == nil:
				want[shard.MessageID(members[i], due.UnixMilli())] = due.UnixMilli()
			case errors.As(err, &re):
				refusal = err
			default:
				t.Fatalf("fill: %v", err)
			}
		}
		if refusal != nil {
			return want, refusal
		}
	}
	t.Fatal("Redis never refused a task: maxmemory not reached")
	return nil, nil
}

// TestRedisEvictionPolicyWarning: against a Redis whose maxmemory-policy
// may evict keys (allkeys-lru), the dispatcher warns at start, naming the
// policy, and still dispatches.
func TestRedisEvictionPolicyWarning(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{MaxMemory: "64mb", MaxMemoryPolicy: "allkeys-lru"})
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: "lru", Shards: 2})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	p := h.start()
	eventually(t, 10*time.Second, "eviction warning", func() bool {
		return strings.Contains(p.out.String(), "Redis may evict keys")
	})
	line := grep(p.out.String(), "Redis may evict keys")
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "maxmemory-policy=allkeys-lru") {
		t.Errorf("warning does not name the policy at warn level: %s", line)
	}
	f := newFeeder(t, h.producer("lru"), "e", time.Second, 5, "").start()
	verifyWhile(h, "lru", f.want, 20*time.Second, 0, f.wait)
}
