package scanner

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// strayQueue runs a queue of 4 shards (recorded) on rdb with a StrayScan
// scanning every 200 ms, until the test ends.
func strayQueue(t *testing.T, rdb *redis.Client, k shard.Keys) *Queue {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l, err := shard.EnsureLayout(ctx, rdb, k, 4)
	if err != nil {
		t.Fatal(err)
	}
	exchange := k.Prefix + ".q"
	testenv.Consumer(t, testenv.AMQP(t), exchange, "q")
	pub := publisher.New(publisher.Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{exchange}, ConfirmTimeout: 5 * time.Second})
	scan := NewStrayScan(rdb, k.Prefix, 200*time.Millisecond, nil)
	co := NewCoalescer(rdb) // as the daemon runs it: the layout read in the shared round trip
	q := NewQueue(rdb, pub, Options{Coalescer: co, Queue: k.Queue, Shards: 4, Exchange: exchange, RoutingKey: "q", KeyPrefix: k.Prefix,
		BatchSize: 10, Pipeline: 2, PollInterval: 20 * time.Millisecond, IdlePollInterval: 100 * time.Millisecond,
		Lease: 30 * time.Second, Lookahead: 100 * time.Millisecond, ShutdownTimeout: time.Second, MaxMessageBytes: 1 << 20,
		MaxAttempts: 5, RetryMin: time.Second, RetryMax: time.Minute, StrayScan: scan})
	q.SetLayout(l)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	go func() { defer wg.Done(); _ = q.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		scan.Close()
		co.Close()
	})
	return q
}

// walkLooks returns the walk's EXISTS that Redis ran since the last
// SLOWLOG RESET (with slowlog-log-slower-than 0, every command is logged;
// a script's own calls, such as the sweep's EXISTS, are not): those of
// pending keys beyond the queue's 4 shards.
func walkLooks(t *testing.T, rdb *redis.Client, k shard.Keys) []string {
	t.Helper()
	logs, err := rdb.SlowLogGet(context.Background(), 100000).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range logs {
		if len(l.Args) < 2 || !strings.EqualFold(l.Args[0], "exists") {
			continue
		}
		var i int
		if _, err := fmt.Sscanf(strings.TrimPrefix(l.Args[1], pendingHead(k)), "%d}", &i); err == nil && i >= 4 &&
			l.Args[1] == k.Pending(i) {
			out = append(out, strings.Join(l.Args[:min(len(l.Args), 4)], " "))
		}
	}
	return out
}

// TestStrayScanStandsInForTheWalk: on a small keyspace the StrayScan finds
// a task a producer wrote to the contract's last index, which the walk
// would reach after most of a minute, and the sweeping queue moves it to
// its shard within a couple of scans; meanwhile the queue does not walk
// (Redis runs no EXISTS across a layout read). Counted on a private Redis.
func TestStrayScanStandsInForTheWalk(t *testing.T) {
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	q := strayQueue(t, rdb, k)
	ctx := context.Background()
	for end := time.Now().Add(10 * time.Second); !q.Sweeping() || !q.opt.StrayScan.covers(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after 10 s: sweeping %v, scan covers %v", q.Sweeping(), q.opt.StrayScan.covers())
		}
	}
	hour := time.Now().Add(time.Hour).UnixMilli()
	member := "late-producer"
	if err := rdb.ZAdd(ctx, k.Pending(shard.MaxShards-1), redis.Z{Score: float64(hour), Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
	home := k.Pending(shard.Index([]byte(member), 4))
	for end := time.Now().Add(5 * time.Second); rdb.ZScore(ctx, home, member).Val() != float64(hour); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after 5 s the task at %s is not in %s", k.Pending(shard.MaxShards-1), home)
		}
	}
	if n := rdb.Exists(ctx, k.Pending(shard.MaxShards-1)).Val(); n != 0 {
		t.Errorf("%s still exists", k.Pending(shard.MaxShards-1))
	}
	// Two layout reads (LayoutPoll) later, still no walk.
	for _, set := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "100000"}} {
		if err := rdb.ConfigSet(ctx, set[0], set[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb.SlowLogReset(ctx)
	time.Sleep(2*LayoutPoll + time.Second)
	if looks := walkLooks(t, rdb, k); len(looks) > 0 {
		t.Errorf("the queue walked while the scan covered it: %q", looks)
	}
}

// TestStrayScanLeavesALargeKeyspaceToTheWalk: where the keyspace is larger
// than the walk's keys over the scan's worth, the scan is not taken and
// the queue walks, finding a task just beyond its shards in its first
// chunk.
func TestStrayScanLeavesALargeKeyspaceToTheWalk(t *testing.T) {
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	ctx := context.Background()
	// A 4-shard queue walks 4,092 indexes a cycle: 300 other keys are
	// more than a scan's worth of it.
	pipe := rdb.Pipeline()
	for i := range 300 {
		pipe.Set(ctx, fmt.Sprintf("cache:%d", i), "x", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// Written before the start, so that the walk's first chunk finds it.
	hour := time.Now().Add(time.Hour).UnixMilli()
	member := "late-producer"
	if err := rdb.ZAdd(ctx, k.Pending(5), redis.Z{Score: float64(hour), Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
	q := strayQueue(t, rdb, k)
	home := k.Pending(shard.Index([]byte(member), 4))
	for end := time.Now().Add(3*LayoutPoll + 5*time.Second); rdb.ZScore(ctx, home, member).Val() != float64(hour); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the task at %s is not in %s", k.Pending(5), home)
		}
	}
	if q.opt.StrayScan.covers() {
		t.Error("the scan covers a keyspace larger than the walk")
	}
	// The walk goes on: its next chunk, one EXISTS of some 340 keys.
	for _, set := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "100000"}} {
		if err := rdb.ConfigSet(ctx, set[0], set[1]).Err(); err != nil {
			t.Fatal(err)
		}
	}
	rdb.SlowLogReset(ctx)
	time.Sleep(LayoutPoll + time.Second)
	if looks := walkLooks(t, rdb, k); len(looks) == 0 {
		t.Error("no walk of the indexes beyond in a LayoutPoll")
	}
}

// TestStrayScanParse: only a pending key of a registered queue, at an
// index written as the contract writes it, is taken for one; a queue of
// another prefix is not registered (it walks); the scan stands in for the
// walk only for StrayCycle after its last scan began.
func TestStrayScanParse(t *testing.T) {
	s := &StrayScan{prefix: "dq:eu:{", queues: map[string]*Queue{}}
	q := &Queue{keys: shard.Keys{Prefix: "dq:eu", Queue: "orders"}}
	if !s.add(q) {
		t.Fatal("a queue of the scan's prefix not registered")
	}
	if s.add(&Queue{keys: shard.Keys{Prefix: "dq", Queue: "eu"}}) {
		t.Error("a queue of prefix dq registered with a scan of dq:eu")
	}
	for key, want := range map[string]int{
		"dq:eu:{orders:40}":      40,
		"dq:eu:{orders:4095}":    4095,
		"dq:eu:{orders:0}":       0,
		"dq:eu:{orders:4096}":    -1,
		"dq:eu:{orders:040}":     -1,
		"dq:eu:{orders:-1}":      -1,
		"dq:eu:{orders:+1}":      -1,
		"dq:eu:{orders}":         -1,
		"dq:eu:{order:4}":        -1,
		"dq:{eu:orders:4}":       -1,
		"dq:eu:{orders:4}:x}":    -1,
		"dq:eu:{orders:4}:tasks": -1,
	} {
		got, i, ok := s.parse(key)
		if want < 0 && ok || want >= 0 && (!ok || got != q || i != want) {
			t.Errorf("%s: %v %d %v, want index %d", key, got != nil, i, ok, want)
		}
	}
	if s.covers() {
		t.Error("covers before any scan")
	}
	for ago, want := range map[time.Duration]bool{time.Second: true, StrayCycle - time.Second: true, StrayCycle + time.Second: false} {
		at := time.Now().Add(-ago)
		s.covered.Store(&at)
		if s.covers() != want {
			t.Errorf("a scan begun %v ago: covers %v", ago, !want)
		}
	}
	s.remove(&Queue{keys: q.keys}) // another queue of the same name: not q's registration
	if got, _, _ := s.parse("dq:eu:{orders:40}"); got != q {
		t.Error("removing another queue of the same keys removed q")
	}
	s.remove(q)
	if _, _, ok := s.parse("dq:eu:{orders:40}"); ok {
		t.Error("a removed queue's key still parsed")
	}
}
