package shard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/shard"
)

// TestSlowWriteChecksTheLayoutAgain: a write whose reply comes
// LayoutRecheck or more after the layout it used was read may have
// raced the start of a change of the shard count (and a move after
// LayoutSettle): the producer reads the layout again and writes again by
// the new one. Each operation here uses a layout by the old count, read
// just before, and takes 4 s, while Redis records a change from 4 to 8
// shards.
func TestSlowWriteChecksTheLayoutAgain(t *testing.T) {
	ctx := context.Background()
	rdb := testRedis(t)
	prefix := testPrefix(t, rdb)
	p, err := shard.NewProducer(rdb, prefix, "q", 4)
	if err != nil {
		t.Fatal(err)
	}
	p.SetWakeWithin(0)
	k := p.Keys()
	rdb.Set(ctx, k.ShardCount(), 8, 0)
	rdb.HSet(ctx, k.Reshard(), "from", 4, "to", 8)
	// The layout by 4 read just now (within LayoutTTL, so used as is),
	// and every write taking 4 s more than it does.
	took := 4 * time.Second
	stale := func() { shard.UseLayout(p, shard.Layout{Shards: 4}, took) }

	// A member whose shard differs by 4 and by 8.
	var m []byte
	for n := 0; ; n++ {
		m = []byte(fmt.Sprintf("task-%d", n))
		if shard.Index(m, 4) != shard.Index(m, 8) {
			break
		}
	}
	old, next := k.Pending(shard.Index(m, 4)), k.Pending(shard.Index(m, 8))
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
	if err := p.ScheduleMany(ctx, []shard.Task{{Member: m, Due: due}}); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, next, string(m)).Val() != float64(due.UnixMilli()) || rdb.Exists(ctx, old).Val() != 0 {
		t.Fatalf("schedule many with a stale layout: want the task in %s only", next)
	}

	// A write that took no time trusts the layout it used: no second read.
	took = 0
	stale()
	if err := p.Schedule(ctx, m, due); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, old, string(m)).Val() != float64(due.UnixMilli()) {
		t.Fatalf("a fresh layout by 4 shards: want the task written to %s", old)
	}
}
