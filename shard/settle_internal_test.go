package shard

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// testRedis connects to the tests' Redis (DISPATCHER_TEST_REDIS_URL, or
// localhost) and cleans the keys under prefix after the test.
func testRedis(t *testing.T, prefix string) *redis.Client {
	t.Helper()
	u := os.Getenv("DISPATCHER_TEST_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("DISPATCHER_TEST_REDIS_URL: %v", err)
	}
	rdb := redis.NewClient(opt)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("no Redis for tests at %s: %v", opt.Addr, err)
	}
	clean := func() {
		keys, _ := rdb.Keys(ctx, prefix+":*").Result()
		if len(keys) > 0 {
			rdb.Del(ctx, keys...)
		}
	}
	clean()
	t.Cleanup(func() { clean(); rdb.Close() })
	return rdb
}

// TestSlowWriteChecksTheLayoutAgain: a write whose reply comes
// LayoutRecheck or more after the layout it used was read may have
// raced the start of a change of the shard count (and a move after
// LayoutSettle): the producer reads the layout again and writes again by
// the new one. Each operation here uses a layout by the old count, read
// just before, and takes 4 s, while Redis records a change from 4 to 8
// shards.
func TestSlowWriteChecksTheLayoutAgain(t *testing.T) {
	ctx := context.Background()
	prefix := fmt.Sprintf("settle%d", time.Now().UnixNano())
	rdb := testRedis(t, prefix)
	p, err := NewProducer(rdb, prefix, "q", 4)
	if err != nil {
		t.Fatal(err)
	}
	p.SetWakeWithin(0)
	k := p.Keys()
	rdb.Set(ctx, k.ShardCount(), 8, 0)
	rdb.HSet(ctx, k.Reshard(), "from", 4, "to", 8)
	// The layout by 4 read just now (within LayoutTTL, so used as is),
	// and every write taking 4 s.
	stale := func() { p.layout.Store(&readLayout{l: Layout{Shards: 4}, sent: time.Now(), read: true}) }
	p.age = func(sent time.Time) time.Duration { return time.Since(sent) + 4*time.Second }

	// A member whose shard differs by 4 and by 8.
	var m []byte
	for n := 0; ; n++ {
		m = []byte(fmt.Sprintf("task-%d", n))
		if Index(m, 4) != Index(m, 8) {
			break
		}
	}
	old, next := k.Pending(Index(m, 4)), k.Pending(Index(m, 8))
	due := time.Now().Add(time.Hour)

	stale()
	if err := p.Schedule(ctx, m, due); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, next, string(m)).Val() != float64(due.UnixMilli()) || rdb.Exists(ctx, old).Val() != 0 {
		t.Fatalf("schedule with a stale layout: want the task in %s only; %s has %v, %s has %v",
			next, next, rdb.ZRangeWithScores(ctx, next, 0, -1).Val(), old, rdb.ZRangeWithScores(ctx, old, 0, -1).Val())
	}

	// As a move would have left it: in its new shard only.
	later := due.Add(time.Hour)
	stale()
	if err := p.Reschedule(ctx, m, later); err != nil {
		t.Fatalf("reschedule of a task moved to its new shard, with a stale layout: %v", err)
	}
	if got := rdb.ZScore(ctx, next, string(m)).Val(); got != float64(later.UnixMilli()) {
		t.Fatalf("reschedule with a stale layout: score %v in %s, want %d", got, next, later.UnixMilli())
	}

	stale()
	ok, err := p.Cancel(ctx, m)
	if err != nil || !ok {
		t.Fatalf("cancel of a task moved to its new shard, with a stale layout: %v, %v", ok, err)
	}
	if n := rdb.Exists(ctx, old, next).Val(); n != 0 {
		t.Fatalf("cancelled, yet %d of the two shards hold tasks", n)
	}

	stale()
	if err := p.ScheduleMany(ctx, []Task{{Member: m, Due: due}}); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, next, string(m)).Val() != float64(due.UnixMilli()) || rdb.Exists(ctx, old).Val() != 0 {
		t.Fatalf("schedule many with a stale layout: want the task in %s only", next)
	}

	// A write that took no time trusts the layout it used: no second read.
	p.age = time.Since
	stale()
	if err := p.Schedule(ctx, m, due); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, old, string(m)).Val() != float64(due.UnixMilli()) {
		t.Fatalf("a fresh layout by 4 shards: want the task written to %s", old)
	}
}
