package monitor

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// gauge reads one queue's gauge from reg; ok is false if it is not exported.
func gauge(t *testing.T, reg *prometheus.Registry, name, queue string) (v float64, ok bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && l.GetValue() == queue {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// readNow is a refresh as if every queue's read were due.
func readNow(ctx context.Context, m *Monitor) {
	m.mu.Lock()
	for _, v := range m.queues {
		v.next = time.Time{}
	}
	m.mu.Unlock()
	m.refresh(ctx)
}

// TestQuietQueueReadLess: reads of a queue whose figures stay the same
// stretch out to quietReads intervals; a change, or a due task, brings
// them back to every interval.
func TestQuietQueueReadLess(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	m := New(rdb, Options{Queues: []queuestate.Target{{Name: "q", Shards: 1}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: time.Minute, Sweeping: func(string) bool { return true }})
	v := m.queues[0]
	var got []time.Duration
	for range 6 {
		readNow(ctx, m)
		got = append(got, v.every)
	}
	want := []time.Duration{1, 2, 4, 8, 8, 8}
	for n := range want {
		if want[n] *= time.Second; got[n] != want[n] {
			t.Fatalf("read intervals of a quiet queue %v, want %v", got, want)
		}
	}
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(time.Now().UnixMilli() + 600_000), Member: "x"})
	readNow(ctx, m)
	if v.every != time.Second {
		t.Errorf("after a task was added the interval is %s, want 1s", v.every)
	}
	readNow(ctx, m)
	if v.every != 2*time.Second {
		t.Errorf("interval %s after an unchanged read, want 2s", v.every)
	}
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 1, Member: "x"}) // now due, count unchanged
	readNow(ctx, m)
	readNow(ctx, m)
	if v.every != time.Second {
		t.Errorf("interval %s with a due task, want 1s", v.every)
	}
	// A tick before the next read is due reads nothing.
	before := v.ReadAt
	m.refresh(ctx)
	if v.ReadAt != before {
		t.Error("refresh read a queue before its next read was due")
	}
}

// TestWatchdog drives one queue, against a real Redis, through a stall
// and its recovery, and the sweeper role away and back: the gauges, the
// log, and what /readyz gets from Stalls.
func TestWatchdog(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	var sweeping atomic.Bool
	sweeping.Store(true)
	reg := prometheus.NewRegistry()
	var log syncBuf
	m := New(rdb, Options{
		Queues: []queuestate.Target{{Name: "q", Shards: 2}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: 10 * time.Second,
		Sweeping:   func(string) bool { return sweeping.Load() },
		Waiting:    func(string) []string { return []string{"the broker blocks publishes"} },
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})

	readNow(ctx, m)
	if v, ok := gauge(t, reg, "dispatcher_queue_stalled", "q"); !ok || v != 0 {
		t.Fatalf("stalled = %v (exported %v) on an empty queue, want 0", v, ok)
	}
	now := time.Now().UnixMilli()
	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: float64(now - 5_000), Member: "late"}, redis.Z{Score: float64(now + 600_000), Member: "later"})
	readNow(ctx, m)
	if v, _ := gauge(t, reg, "dispatcher_queue_oldest_due_age_seconds", "q"); v < 5 || v > 9 {
		t.Errorf("oldest due age %v s, want about 5", v)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_pending_tasks", "q"); v != 2 {
		t.Errorf("pending %v, want 2", v)
	}
	if s := m.Stalls(); len(s) != 0 || strings.Contains(log.String(), "stalled") {
		t.Fatalf("stalled after 5 s with STALL_AFTER 10s: %q\n%s", s, log.String())
	}

	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: float64(now - 30_000), Member: "later"}) // now 30 s late
	readNow(ctx, m)
	stalls := m.Stalls()
	if len(stalls) != 1 || !strings.Contains(stalls[0], "queue q: stalled") || !strings.Contains(stalls[0], "shards 1 (") ||
		!strings.Contains(stalls[0], "waiting on: the broker blocks publishes") {
		t.Errorf("Stalls() = %q, want the queue, its late shard and what it waits on", stalls)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_stalled", "q"); v != 1 {
		t.Errorf("stalled = %v, want 1", v)
	}
	logged := log.String()
	if !strings.Contains(logged, "level=ERROR") || !strings.Contains(logged, "queue stalled") ||
		!strings.Contains(logged, "waiting_on=\"the broker blocks publishes\"") || !strings.Contains(logged, "late_shards=") {
		t.Errorf("stall log:\n%s", logged)
	}
	readNow(ctx, m) // within STALL_AFTER of the first report: not logged again
	if n := strings.Count(log.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines after two reads of one stall, want 1:\n%s", n, log.String())
	}

	// The late shard's key is overwritten: unreadable, it keeps its last
	// known age, growing, and the stall goes on.
	rdb.Rename(ctx, k.Pending(1), k.Pending(1)+":saved")
	rdb.Set(ctx, k.Pending(1), "oops", 0)
	readNow(ctx, m)
	if s := m.Stalls(); len(s) != 1 || !strings.Contains(s[0], "waiting on: the broker blocks publishes; cannot read shard 1: WRONGTYPE") {
		t.Errorf("Stalls() = %q with the late shard unreadable, want the stall going on, naming the shard", s)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_oldest_due_age_seconds", "q"); v < 30 {
		t.Errorf("oldest due age %v s with the late shard unreadable, want its last known age (30 s) and more", v)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_broken_shards", "q"); v != 1 {
		t.Errorf("broken shards %v, want 1", v)
	}
	rdb.Rename(ctx, k.Pending(1)+":saved", k.Pending(1))

	// 7 s late: under STALL_AFTER but over half of it, the stall holds.
	rdb.ZRem(ctx, k.Pending(1), "later")
	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: float64(time.Now().UnixMilli() - 7_000), Member: "late"})
	readNow(ctx, m)
	if s := m.Stalls(); len(s) != 1 {
		t.Errorf("stall ended at 7 s late with STALL_AFTER 10s; it ends under half of it: %q", s)
	}
	rdb.ZRem(ctx, k.Pending(1), "late", "later")
	readNow(ctx, m)
	if s := m.Stalls(); len(s) != 0 {
		t.Errorf("Stalls() = %q after the due tasks left", s)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_stalled", "q"); v != 0 {
		t.Errorf("stalled = %v after recovery, want 0", v)
	}
	if !strings.Contains(log.String(), "queue no longer stalled") {
		t.Errorf("no recovery logged:\n%s", log.String())
	}

	sweeping.Store(false) // another instance took the role over
	readNow(ctx, m)
	for _, name := range []string{"dispatcher_queue_pending_tasks", "dispatcher_queue_stalled", "dispatcher_queue_oldest_due_age_seconds"} {
		if _, ok := gauge(t, reg, name, "q"); ok {
			t.Errorf("%s still exported by an instance that no longer sweeps the queue", name)
		}
	}
	// Its status page still shows the queue, read on demand.
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now + 600_000), Member: "x"})
	time.Sleep(time.Second) // the on-demand read is cached for an interval
	views := m.Views(ctx)
	if len(views) != 1 || views[0].Swept || views[0].State.Pending != 1 {
		t.Errorf("view of a queue swept elsewhere: %+v", views)
	}
	if _, ok := gauge(t, reg, "dispatcher_queue_pending_tasks", "q"); ok {
		t.Error("an on-demand read for the page exported gauges")
	}
}

// TestRedisGone: when Redis cannot be read at all, the queue shows its
// last known figures with every shard unreadable, and a late queue goes on
// getting later rather than looking on time.
func TestRedisGone(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	k := shard.Keys{Prefix: "p", Queue: "q"}
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(time.Now().UnixMilli() - 30_000), Member: "late"})
	reg := prometheus.NewRegistry()
	m := New(rdb, Options{Queues: []queuestate.Target{{Name: "q", Shards: 4}}, KeyPrefix: "p",
		Interval: time.Second, StallAfter: 10 * time.Second, Sweeping: func(string) bool { return true },
		Registerer: reg, Logger: slog.New(slog.DiscardHandler)})
	readNow(ctx, m)
	if len(m.Stalls()) != 1 {
		t.Fatal("a task 30 s late is no stall")
	}
	srv.Kill()
	time.Sleep(1100 * time.Millisecond)
	readNow(ctx, m)
	if v, _ := gauge(t, reg, "dispatcher_queue_oldest_due_age_seconds", "q"); v < 31 {
		t.Errorf("oldest due age %v s a second after Redis went, want 31 s or more", v)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_broken_shards", "q"); v != 4 {
		t.Errorf("broken shards %v with Redis gone, want all 4", v)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_pending_tasks", "q"); v != 1 {
		t.Errorf("pending %v with Redis gone, want the last known 1", v)
	}
	if s := m.Stalls(); len(s) != 1 || !strings.Contains(s[0], "cannot read shards 0, 1, 2, 3: not read:") {
		t.Errorf("Stalls() with Redis gone: %q", s)
	}
}

// TestRetriedTasksStall: tasks that wait in a retry (their publishes
// failed: unroutable, nacked, refused) are due and undelivered, so they
// are late: they are exported with the age of the oldest, make the queue's
// oldest due age, keep it read every interval, and stall it past
// StallAfter with nothing pending at all. Unreadable, the shard keeps its
// retried figures, their age growing. Once confirmed, all goes back to 0.
func TestRetriedTasksStall(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	reg := prometheus.NewRegistry()
	var log syncBuf
	m := New(rdb, Options{
		Queues: []queuestate.Target{{Name: "q", Shards: 2}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: 10 * time.Second, Sweeping: func(string) bool { return true },
		Waiting: func(string) []string {
			return []string{`publishes fail: unroutable: exchange "x" has no queue bound for routing key "y"`}
		},
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	now := time.Now().UnixMilli()
	e := "1:gone"
	for n := 0; n < 3; n++ {
		e = strconv.FormatInt(now-20_000+int64(n), 10) + ":t" + strconv.Itoa(n)
		rdb.ZAdd(ctx, k.Inflight(1), redis.Z{Score: float64(now+1_000) + 0.5, Member: e})
		rdb.HSet(ctx, k.Attempts(1), e, 4)
		rdb.ZAdd(ctx, k.Retrying(1), redis.Z{Score: float64(now - 20_000 + int64(n)), Member: e})
	}
	readNow(ctx, m)
	readNow(ctx, m)
	if v := m.queues[0].every; v != time.Second {
		t.Errorf("read interval %s with retried tasks, want every interval: they are late", v)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_retried_tasks", "q"); v != 3 {
		t.Errorf("retried tasks %v, want 3", v)
	}
	for _, name := range []string{"dispatcher_queue_oldest_retried_age_seconds", "dispatcher_queue_oldest_due_age_seconds"} {
		if v, _ := gauge(t, reg, name, "q"); v < 20 || v > 25 {
			t.Errorf("%s = %v, want about 20", name, v)
		}
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_stalled", "q"); v != 1 {
		t.Errorf("stalled = %v with tasks retried for 20 s and STALL_AFTER 10s, want 1", v)
	}
	stalls := m.Stalls()
	if len(stalls) != 1 || !strings.Contains(stalls[0], "shards 1 (20s)") || !strings.Contains(stalls[0], "3 retried after failed publishes, the oldest 20") ||
		!strings.Contains(stalls[0], "unroutable: exchange") {
		t.Errorf("Stalls() = %q, want the late shard, the retried tasks and the cause", stalls)
	}
	if l := log.String(); !strings.Contains(l, "retried=3") || !strings.Contains(l, "oldest_retried_age=20") || !strings.Contains(l, "unroutable") {
		t.Errorf("stall log:\n%s", l)
	}

	// Unreadable: the last known retried figures, the age growing.
	rdb.Rename(ctx, k.Attempts(1), k.Attempts(1)+":saved")
	rdb.Set(ctx, k.Attempts(1), "oops", 0)
	time.Sleep(1100 * time.Millisecond)
	readNow(ctx, m)
	if v, _ := gauge(t, reg, "dispatcher_queue_oldest_retried_age_seconds", "q"); v < 21 {
		t.Errorf("oldest retried age %v s with the shard unreadable, want its last known age growing", v)
	}
	if v, _ := gauge(t, reg, "dispatcher_queue_retried_tasks", "q"); v != 3 {
		t.Errorf("retried tasks %v with the shard unreadable, want the last known 3", v)
	}
	rdb.Del(ctx, k.Attempts(1))

	// Confirmed at last (the ack removes all three keys' entries).
	rdb.Del(ctx, k.Inflight(1), k.Retrying(1))
	readNow(ctx, m)
	for _, name := range []string{"dispatcher_queue_retried_tasks", "dispatcher_queue_oldest_retried_age_seconds", "dispatcher_queue_oldest_due_age_seconds", "dispatcher_queue_stalled"} {
		if v, _ := gauge(t, reg, name, "q"); v != 0 {
			t.Errorf("%s = %v after the retried tasks were confirmed, want 0", name, v)
		}
	}
}

// TestBadScores: a task with no real due time (score -5) is not late by
// 56 years: its age counts from when a read first found it, so it stalls
// the queue only once it has waited STALL_AFTER (here: as if first seen
// 20 s ago), and another such task starts anew. Tasks after year 5138
// are warned of with key, member and score, once per farEvery.
func TestBadScores(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	reg := prometheus.NewRegistry()
	var log syncBuf
	m := New(rdb, Options{
		Queues: []queuestate.Target{{Name: "q", Shards: 2}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: 10 * time.Second, Sweeping: func(string) bool { return true },
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: -5, Member: "minus-five"})
	readNow(ctx, m)
	if v, _ := gauge(t, reg, "dispatcher_queue_oldest_due_age_seconds", "q"); v > 5 {
		t.Errorf("oldest due age %v s for a task scored -5 just seen, want about 0", v)
	}
	if s := m.Stalls(); len(s) != 0 || strings.Contains(log.String(), "stalled") {
		t.Fatalf("a task scored -5 stalled the queue at once: %q\n%s", s, log.String())
	}
	m.mu.Lock()
	m.queues[0].undated[0].since = time.Now().Add(-20 * time.Second)
	m.mu.Unlock()
	readNow(ctx, m)
	if v, _ := gauge(t, reg, "dispatcher_queue_oldest_due_age_seconds", "q"); v < 20 || v > 25 {
		t.Errorf("oldest due age %v s of a task first seen 20 s ago, want 20", v)
	}
	if s := m.Stalls(); len(s) != 1 || !strings.Contains(s[0], "shards 0 (20s)") {
		t.Errorf("Stalls() = %q, want shard 0 stalled for 20 s", s)
	}
	// That one went out; another undated task is new.
	rdb.ZRem(ctx, k.Pending(0), "minus-five")
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 0, Member: "zero"})
	readNow(ctx, m)
	if s := m.Stalls(); len(s) != 0 {
		t.Errorf("Stalls() = %q after a new undated task replaced the old", s)
	}

	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: 1767225600000000, Member: "micros"}, redis.Z{Score: math.Inf(1), Member: "plus-inf"})
	readNow(ctx, m)
	readNow(ctx, m)
	logged := log.String()
	if n := strings.Count(logged, "scored after year 5138"); n != 1 {
		t.Errorf("%d warnings of far scores after two reads, want 1:\n%s", n, logged)
	}
	if !strings.Contains(logged, "key="+k.Pending(1)) || !strings.Contains(logged, "member=plus-inf score=+inf due=never") ||
		!strings.Contains(logged, "far_future=2") {
		t.Errorf("far scores warned of without key, count, member and score:\n%s", logged)
	}
}

// TestPauseAndResumeLogged: the sweeping instance logs a pause it finds,
// and the resume, once each however many reads see the same, and tells
// how many shards are paused.
func TestPauseAndResumeLogged(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	var log syncBuf
	m := New(rdb, Options{Queues: []queuestate.Target{{Name: "q", Shards: 2}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: time.Minute, Sweeping: func(string) bool { return true },
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	count := func(msg string) int { return strings.Count(log.String(), `msg="`+msg) }
	readNow(ctx, m)
	if n, known := m.Paused("q"); n != 0 || !known || count("queue paused") != 0 {
		t.Fatalf("before the pause: paused %d (known %v), log:\n%s", n, known, log.String())
	}
	for i := range 2 {
		rdb.Set(ctx, k.Paused(i), 1, 0)
	}
	readNow(ctx, m)
	readNow(ctx, m)
	if n, _ := m.Paused("q"); n != 2 || count("queue paused") != 1 || !strings.Contains(log.String(), "paused_shards=2") {
		t.Errorf("paused: %d shards, log:\n%s", n, log.String())
	}
	rdb.Del(ctx, k.Paused(0), k.Paused(1))
	readNow(ctx, m)
	readNow(ctx, m)
	if n, _ := m.Paused("q"); n != 0 || count("queue resumed") != 1 || count("queue paused") != 1 {
		t.Errorf("resumed: %d shards paused, log:\n%s", n, log.String())
	}
}

// TestDozingQueueReadLess: while the scanner says a queue dozes (its
// pending and in-flight sets are looked at by the idle watch), its quiet
// reads stretch further, to dozingReads intervals; when it has woken since
// the last tick, even if it dozes again by then, the tick reads it at
// once and its reads start over from every interval.
func TestDozingQueueReadLess(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	var dozing atomic.Bool
	var wakes atomic.Uint64
	dozing.Store(true)
	m := New(rdb, Options{Queues: []queuestate.Target{{Name: "q", Shards: 1}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: time.Minute, Sweeping: func(string) bool { return true },
		Dozing: func(string) (bool, uint64) { return dozing.Load(), wakes.Load() }})
	v := m.queues[0]
	var got []time.Duration
	for range 8 {
		readNow(ctx, m)
		got = append(got, v.every)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30, 30}
	for n := range want {
		if want[n] *= time.Second; got[n] != want[n] {
			t.Fatalf("read intervals of a dozing queue %v, want %v", got, want)
		}
	}
	// Nothing woke it: a tick reads nothing.
	before := v.ReadAt
	m.refresh(ctx)
	if v.ReadAt != before {
		t.Fatal("a tick read the dozing queue before its next read was due")
	}
	// Woken and dozing again before the tick: read at once, and its reads
	// start over (the read finds nothing new: the next in 2 s).
	wakes.Add(1)
	m.refresh(ctx)
	if !v.ReadAt.After(before) {
		t.Fatal("the first tick after the queue woke did not read it")
	}
	if v.every != 2*time.Second {
		t.Errorf("interval %s after the read of a woken queue, want 2s", v.every)
	}
	// Awake from now on: its quiet reads stretch to quietReads only.
	dozing.Store(false)
	wakes.Add(1)
	before = v.ReadAt
	m.refresh(ctx)
	if !v.ReadAt.After(before) {
		t.Fatal("the first tick after the queue woke did not read it")
	}
	for range 6 {
		readNow(ctx, m)
	}
	if v.every != quietReads*time.Second {
		t.Errorf("interval %s of a quiet queue awake, want %s", v.every, quietReads*time.Second)
	}
	// Dozing again, reads stretch again.
	dozing.Store(true)
	for range 3 {
		readNow(ctx, m)
	}
	if v.every != 30*time.Second {
		t.Errorf("interval %s after dozing again, want 30s", v.every)
	}
}
