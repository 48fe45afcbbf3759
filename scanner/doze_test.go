package scanner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// count is how many queues doze.
func (w *IdleWatch) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.dozing)
}

// TestQuietQueueDozes: an empty queue's sweeps stop once they have
// stretched to the idle interval; while it dozes Redis sees only the
// IdleWatch's one call per interval (no sweep: no ZRANGE, no TIME). A task
// a producer ZADDs without a wake-up wakes it and is delivered, after
// Redis forgot the scripts too; so is one
// scheduled with a wake-up; and a queue whose sweeper role another
// instance took is woken, stops sweeping and does not doze again. Counted
// on a private Redis.
func TestQuietQueueDozes(t *testing.T) {
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	conn := testenv.AMQP(t)
	exchange := k.Prefix + ".q"
	got := testenv.Consumer(t, conn, exchange, "q")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := publisher.New(publisher.Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{exchange}, ConfirmTimeout: 5 * time.Second})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	w := NewIdleWatch(rdb, 100*time.Millisecond, nil)
	s := New(rdb, pub, Options{Queue: "q", Shards: 16, Exchange: exchange, RoutingKey: "q", KeyPrefix: k.Prefix,
		BatchSize: 10, Pipeline: 2, PollInterval: 20 * time.Millisecond, IdlePollInterval: 100 * time.Millisecond,
		Lease: 30 * time.Second, Lookahead: 100 * time.Millisecond, ShutdownTimeout: time.Second, MaxMessageBytes: 1 << 20,
		MaxAttempts: 5, RetryMin: time.Second, RetryMax: time.Minute, IdleWatch: w})
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(ctx) }()
	defer func() {
		cancel()
		wg.Wait()
		w.Close()
	}()

	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("not %s within 10s", what)
			}
		}
	}
	receive := func(body string) {
		t.Helper()
		select {
		case d := <-got:
			if string(d.Body) != body {
				t.Fatalf("delivered %q, want %q", d.Body, body)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%q not delivered within 10s; dozing %d", body, w.count())
		}
	}

	waitFor("dozing", func() bool { return w.count() == 1 })
	if dozing, _ := s.Dozing(); !dozing {
		t.Fatal("Dozing is false while the queue dozes")
	}
	_, wakes := s.Dozing()
	before := commandCalls(t, rdb)
	time.Sleep(time.Second)
	after := commandCalls(t, rdb)
	if w.count() != 1 {
		t.Fatal("woke up with nothing to do")
	}
	for name, n := range after {
		after[name] = n - before[name]
	}
	if after["zrange"] != 0 || after["time"] != 0 || after["evalsha"] > 15 || after["exists"] > 15 {
		t.Fatalf("a dozing queue of 16 shards in 1s: %v; want no sweep (zrange, time) and about 10 IdleWatch calls", after)
	}

	// A raw ZADD, no wake-up: the IdleWatch finds it.
	rdb.ZAdd(ctx, k.Pending(5), redis.Z{Score: float64(time.Now().UnixMilli()), Member: "raw"})
	receive("raw")
	waitFor("dozing again", func() bool { return w.count() == 1 })

	// Redis forgot the scripts (a restart, a failover, SCRIPT FLUSH): the
	// IdleWatch's EVALSHA gets NOSCRIPT and it loads the script again with
	// EVAL (the plain EXISTS beside it finds the task).
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.ZAdd(ctx, k.Pending(11), redis.Z{Score: float64(time.Now().UnixMilli()), Member: "after a flush"})
	receive("after a flush")
	waitFor("dozing again", func() bool { return w.count() == 1 })
	waitFor("the idle script loaded again by the IdleWatch's EVAL", func() bool {
		loaded, err := idleScript.Exists(ctx, rdb).Result()
		return err == nil && loaded[0]
	})

	// The Go producer's wake-up.
	prod, err := shard.NewProducer(rdb, k.Prefix, "q", 16)
	if err != nil {
		t.Fatal(err)
	}
	if err := prod.Schedule(ctx, []byte("woken"), time.Now().Add(50*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	receive("woken")
	waitFor("dozing again", func() bool { return w.count() == 1 })

	// Another instance holds the role now: woken, it no longer sweeps.
	rdb.Set(ctx, k.Sweeper(), "another", time.Minute)
	waitFor("woken and no longer sweeping", func() bool { return w.count() == 0 && !s.Sweeping() })
	if dozing, now := s.Dozing(); dozing || now <= wakes {
		t.Fatalf("Dozing says %v, %d wakes (%d before the first task) once the queue woke", dozing, now, wakes)
	}
	time.Sleep(500 * time.Millisecond)
	if w.count() != 0 {
		t.Fatal("dozes though another instance sweeps the queue")
	}
}

// twoMembers is a liveness in which this instance ("me") shares the queue
// with another live one.
type twoMembers struct{}

func (twoMembers) ID() string                     { return "me" }
func (twoMembers) Check(string) (ok, fenced bool) { return true, false }
func (twoMembers) Members(string) []string        { return []string{"me", "other"} }

// TestDozingInstanceTakesAFreeRole: with two live instances each sweeps
// its share, so one that does not hold the sweeper role dozes too; when
// the role falls free (its holder died) the IdleWatch wakes it and it
// takes the role over, as a bid would have.
func TestDozingInstanceTakesAFreeRole(t *testing.T) {
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	conn := testenv.AMQP(t)
	exchange := k.Prefix + ".q"
	testenv.Consumer(t, conn, exchange, "q")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rdb.Set(ctx, k.Sweeper(), "another", time.Minute)
	pub := publisher.New(publisher.Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{exchange}, ConfirmTimeout: 5 * time.Second})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	w := NewIdleWatch(rdb, 100*time.Millisecond, nil)
	s := New(rdb, pub, Options{Queue: "q", Shards: 4, Exchange: exchange, RoutingKey: "q", KeyPrefix: k.Prefix,
		BatchSize: 10, Pipeline: 2, PollInterval: 20 * time.Millisecond, IdlePollInterval: 100 * time.Millisecond,
		Lease: 30 * time.Second, ShutdownTimeout: time.Second, MaxMessageBytes: 1 << 20,
		MaxAttempts: 5, RetryMin: time.Second, RetryMax: time.Minute, IdleWatch: w, Liveness: twoMembers{}})
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(ctx) }()
	defer func() {
		cancel()
		wg.Wait()
		w.Close()
	}()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("not %s within 10s", what)
			}
		}
	}
	waitFor("dozing without the role", func() bool { return w.count() == 1 && !s.Sweeping() })
	rdb.Del(ctx, k.Sweeper())
	waitFor("holding the role fallen free", func() bool { return s.Sweeping() })
}

// TestIdleLookWakesWhomItMust: one look at several dozing queues, each in
// its own state, wakes exactly those it must (a set of theirs exists, the
// role they hold is no longer theirs, the role they do not hold is free)
// and renews the role of those that keep it; the same after Redis forgot
// the script (NOSCRIPT, then EVAL).
func TestIdleLookWakesWhomItMust(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	ready := func() bool { return true }
	type queue struct {
		name   string
		leader bool   // the instance holds the role (renews it)
		holder string // the role's holder in Redis ("": free)
		set    bool   // a task in shard 2's in-flight set
		wake   bool
		shards int  // 0: 4
		last   bool // a task in the last shard's pending set
	}
	// The sets of several queues go in one EXISTS of up to idleKeysPerCall
	// keys; a queue of more keys than that, in one of its own.
	wide := idleKeysPerCall/2 + 5
	queues := []queue{
		{name: "keeps", leader: true, holder: "me"},
		{name: "lost", leader: true, holder: "other", wake: true},
		{name: "free", holder: "", wake: true},
		{name: "held", holder: "other"},
		{name: "inflight", leader: true, holder: "me", set: true, wake: true},
		{name: "keeps2", leader: true, holder: "me"},
		{name: "wide", leader: true, holder: "me", shards: wide, last: true, wake: true},
		{name: "wide2", leader: true, holder: "me", shards: wide},
		{name: "half", leader: true, holder: "me", shards: idleKeysPerCall / 4},
		{name: "half2", leader: true, holder: "me", shards: idleKeysPerCall / 4, last: true, wake: true},
		{name: "half3", leader: true, holder: "me", shards: idleKeysPerCall / 4},
	}
	for round, flush := range []bool{false, true} {
		if flush {
			if err := rdb.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		w := &IdleWatch{rdb: rdb, dozing: map[*dozer]struct{}{}}
		ds := map[string]*dozer{}
		for _, q := range queues {
			k := shard.Keys{Prefix: prefix, Queue: q.name}
			shards := max(q.shards, 4)
			rdb.Del(ctx, k.Sweeper(), k.Inflight(2), k.Pending(shards-1))
			if q.holder != "" {
				rdb.Set(ctx, k.Sweeper(), q.holder, time.Second)
			}
			if q.set {
				rdb.ZAdd(ctx, k.Inflight(2), redis.Z{Score: 1, Member: "x"})
			}
			if q.last {
				rdb.ZAdd(ctx, k.Pending(shards-1), redis.Z{Score: 1, Member: "x"})
			}
			d := newDozer(k, shards, q.leader, "me", time.Minute, ready)
			ds[q.name] = d
			w.add(d)
		}
		w.look()
		for _, q := range queues {
			select {
			case <-ds[q.name].nudge:
				if !q.wake {
					t.Errorf("round %d: %s woken", round, q.name)
				}
			default:
				if q.wake {
					t.Errorf("round %d: %s not woken", round, q.name)
				}
			}
			ttl := rdb.PTTL(ctx, shard.Keys{Prefix: prefix, Queue: q.name}.Sweeper()).Val()
			if renewed := ttl > 2*time.Second; renewed != (q.leader && q.holder == "me") {
				t.Errorf("round %d: %s's role TTL %s: renewed %v, want %v", round, q.name, ttl, renewed, !renewed)
			}
		}
	}
}

// TestIdleLookFollowsTheDozingSet: the look's commands, made once for the
// dozing queues, are made again when a queue starts or stops dozing, and
// a queue whose broker is not ready is woken, the others looked at.
func TestIdleLookFollowsTheDozingSet(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	w := &IdleWatch{rdb: rdb, dozing: map[*dozer]struct{}{}}
	brokerUp := true
	newQueue := func(name string, scheduled bool) *dozer {
		k := shard.Keys{Prefix: prefix, Queue: name}
		rdb.Set(ctx, k.Sweeper(), "me", time.Minute)
		if scheduled {
			rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: 1, Member: "x"})
		}
		return newDozer(k, 2, true, "me", 2*time.Minute, func() bool { return brokerUp || name != "a" })
	}
	woken := func(d *dozer) bool {
		select {
		case <-d.nudge:
			return true
		default:
			return false
		}
	}
	a, b, c := newQueue("a", false), newQueue("b", true), newQueue("c", true)
	w.add(a)
	w.look()
	if woken(a) {
		t.Fatal("a woken with nothing scheduled")
	}
	w.add(b)
	w.look()
	if !woken(b) || woken(a) {
		t.Fatal("b, which started dozing after the first look, not woken (or a woken)")
	}
	w.remove(b)
	w.add(c)
	w.look()
	if !woken(c) || woken(b) || woken(a) {
		t.Fatal("after b stopped dozing and c started: c not woken, or b or a woken")
	}
	w.remove(c)
	brokerUp = false
	w.add(c)
	aRole := shard.Keys{Prefix: prefix, Queue: "a"}.Sweeper()
	rdb.PExpire(ctx, aRole, time.Minute)
	w.look()
	if !woken(a) || !woken(c) {
		t.Fatal("a, whose broker is not ready, or c, not woken")
	}
	if ttl := rdb.PTTL(ctx, aRole).Val(); ttl > time.Minute {
		t.Errorf("a's role renewed (TTL %s) by the look that woke it for its broker", ttl)
	}
	brokerUp = true
	w.look()
	if woken(a) || !woken(c) {
		t.Fatal("the look after the broker came back: a woken, or c not")
	}
}
