package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

func setup(t *testing.T, m int) (*redis.Client, shard.Keys) {
	t.Helper()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	if m > 0 {
		if err := rdb.Set(context.Background(), k.ShardCount(), m, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return rdb, k
}

// TestStartRules: no recorded count, the same count, a paused queue and a
// second change are refused or reported; the same change again resumes.
func TestStartRules(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 0)
	if _, err := reshard.Start(ctx, rdb, k, 8); !errors.Is(err, shard.ErrNoLayout) {
		t.Fatalf("no count recorded: %v, want ErrNoLayout", err)
	}
	rdb.Set(ctx, k.ShardCount(), 4, 0)
	if st, err := reshard.Start(ctx, rdb, k, 4); err != nil || !st.Same {
		t.Fatalf("same count: %+v, %v", st, err)
	}
	rdb.Set(ctx, k.Paused(0), 1, 0)
	if _, err := reshard.Start(ctx, rdb, k, 8); err == nil || !strings.Contains(err.Error(), "paused") {
		t.Fatalf("paused queue: %v", err)
	}
	rdb.Del(ctx, k.Paused(0))
	if st, err := reshard.Start(ctx, rdb, k, 8); err != nil || st.From != 4 || st.Resumed {
		t.Fatalf("start: %+v, %v", st, err)
	}
	if st, err := reshard.Start(ctx, rdb, k, 8); err != nil || !st.Resumed {
		t.Fatalf("again: %+v, %v", st, err)
	}
	_, err := reshard.Start(ctx, rdb, k, 16)
	if !errors.Is(err, reshard.ErrBusy) || !strings.Contains(err.Error(), "from 4 to 8") {
		t.Fatalf("second change: %v", err)
	}
	l, err := shard.ReadLayout(ctx, rdb, k)
	if err != nil || l != (shard.Layout{Shards: 8, From: 4}) {
		t.Fatalf("layout %+v, %v", l, err)
	}
	if l.Span() != 8 || fmt.Sprint(l.Indexes([]byte("a"))) == "" {
		t.Fatalf("span %d", l.Span())
	}
}

// TestShrinkAndRetired: a shrink moves pending tasks and dead letters
// (with reasons), Close ends it once the retired shards are empty and
// records the retired count, and SweepRetired moves what a producer on
// the old count writes there afterwards, due or not.
func TestShrinkAndRetired(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 8)
	far := time.Now().Add(time.Hour).UnixMilli()
	var members []string
	for i := 0; i < 200; i++ {
		m := fmt.Sprintf("task-%d", i)
		members = append(members, m)
		rdb.ZAdd(ctx, k.Pending(shard.Index([]byte(m), 8)), redis.Z{Score: float64(far), Member: m})
	}
	deadM := "dead-one"
	for shard.Index([]byte(deadM), 8) < 2 {
		deadM += "x"
	}
	entry := fmt.Sprintf("%d:%s", far, deadM)
	rdb.ZAdd(ctx, k.Dead(shard.Index([]byte(deadM), 8)), redis.Z{Score: float64(far), Member: entry})
	rdb.HSet(ctx, k.DeadReason(shard.Index([]byte(deadM), 8)), entry, "nacked 5 times")

	st, p, err := reshard.Reshard(ctx, rdb, k, 2, reshard.Options{Name: "test"})
	if err != nil || st.From != 8 {
		t.Fatalf("reshard: %+v, %v", st, err)
	}
	if p.Moved == 0 || p.DeadMoved != 1 {
		t.Fatalf("progress %+v: want tasks and one dead letter moved", p)
	}
	l, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test", Wait: 5 * time.Second})
	if err != nil {
		t.Fatalf("close: %v", err)
	}
	if l.Shards != 2 {
		t.Fatalf("closed layout %+v", l)
	}
	for _, m := range members {
		if _, err := rdb.ZScore(ctx, k.Pending(shard.Index([]byte(m), 2)), m).Result(); err != nil {
			t.Fatalf("%s not in its shard by 2: %v", m, err)
		}
	}
	j := shard.Index([]byte(deadM), 2)
	if why := rdb.HGet(ctx, k.DeadReason(j), entry).Val(); why != "nacked 5 times" {
		t.Fatalf("dead letter's reason after the move: %q", why)
	}
	l, err = shard.ReadLayout(ctx, rdb, k)
	if err != nil || l != (shard.Layout{Shards: 2, Retired: 8}) {
		t.Fatalf("layout after the shrink: %+v, %v", l, err)
	}

	// A producer still on 8 writes a task due now to a retired shard.
	late := "late-task"
	for shard.Index([]byte(late), 8) < 2 {
		late += "x"
	}
	now := time.Now().UnixMilli()
	rdb.ZAdd(ctx, k.Pending(shard.Index([]byte(late), 8)), redis.Z{Score: float64(now), Member: late})
	n, err := reshard.SweepRetired(ctx, rdb, k, l, "test")
	if err != nil || n != (reshard.Swept{Moved: 1}) {
		t.Fatalf("SweepRetired: %+v, %v; want 1 moved", n, err)
	}
	if s, err := rdb.ZScore(ctx, k.Pending(shard.Index([]byte(late), 2)), late).Result(); err != nil || int64(s) != now {
		t.Fatalf("late task in its shard by 2: %v, %v", s, err)
	}
	if n, err := reshard.SweepRetired(ctx, rdb, k, l, "test"); err != nil || n != (reshard.Swept{}) {
		t.Fatalf("second SweepRetired: %+v, %v", n, err)
	}

	// Growing back past the retired count forgets it. (No dispatcher runs
	// here: tasks due now are moved too, which finishing waits for.)
	if _, _, err := reshard.Reshard(ctx, rdb, k, 16, reshard.Options{Name: "test", Horizon: -1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test", Horizon: -1}); err != nil {
		t.Fatal(err)
	}
	if l, err := shard.ReadLayout(ctx, rdb, k); err != nil || l != (shard.Layout{Shards: 16}) {
		t.Fatalf("layout after growing back: %+v, %v", l, err)
	}
}

// TestCloseWaitsForInflight: a shrink's Close does not end the change
// while a retired shard holds a task in flight, and says what is left.
func TestCloseWaitsForInflight(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	rdb.ZAdd(ctx, k.Inflight(3), redis.Z{Score: float64(time.Now().Add(time.Minute).UnixMilli()), Member: "1:x"})
	if _, _, err := reshard.Reshard(ctx, rdb, k, 2, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	_, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test", Wait: 1500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "shards 2..3 still hold 1 tasks") {
		t.Fatalf("close with a task in flight in a retired shard: %v", err)
	}
	if l, _ := shard.ReadLayout(ctx, rdb, k); !l.Changing() {
		t.Fatalf("the change ended with a task in flight in a retired shard: %+v", l)
	}
}

// TestLockOneMover: a second mover waits while the first holds the lock.
func TestLockOneMover(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	l1, _, err := reshard.TryLock(ctx, rdb, k, "first")
	if err != nil || l1 == nil {
		t.Fatalf("first lock: %v", err)
	}
	l2, holder, err := reshard.TryLock(ctx, rdb, k, "second")
	if err != nil || l2 != nil || !strings.HasPrefix(holder, "first/") {
		t.Fatalf("second lock: %v, holder %q, %v", l2, holder, err)
	}
	l1.Unlock(ctx)
	l2, _, err = reshard.TryLock(ctx, rdb, k, "second")
	if err != nil || l2 == nil {
		t.Fatalf("after unlock: %v", err)
	}
	l2.Unlock(ctx)
}

// TestLockLostStopsTheMove: a mover whose lock another took over (its
// renewal finds another holder) has its guarded context cancelled with
// ErrLockLost, so it stops before racing the other mover.
func TestLockLostStopsTheMove(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	l, _, err := reshard.TryLock(ctx, rdb, k, "first")
	if err != nil || l == nil {
		t.Fatalf("lock: %v", err)
	}
	defer l.Unlock(ctx)
	guarded, stop := l.Guard(ctx)
	defer stop()
	rdb.Set(ctx, k.ReshardLock(), "second/xyz", reshard.LockTTL) // the lock expired and another took it
	select {
	case <-guarded.Done():
		if !errors.Is(context.Cause(guarded), reshard.ErrLockLost) {
			t.Fatalf("cause %v, want ErrLockLost", context.Cause(guarded))
		}
	case <-time.After(reshard.LockTTL / 2):
		t.Fatal("the guarded context outlived the lock")
	}
	if got := rdb.Get(ctx, k.ReshardLock()).Val(); got != "second/xyz" {
		t.Fatalf("the lost lock's renewal overwrote the new holder's: %q", got)
	}
}

// TestCloseAfterGrowthWaitsForNearTasks: after a growth, producers cancel
// by the new count only, so finishing waits while a task due soon (not
// moved: a dispatcher sends it where it is) is outside its new shard.
func TestCloseAfterGrowthWaitsForNearTasks(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	m := "near"
	for shard.Index([]byte(m), 4) == shard.Index([]byte(m), 8) {
		m += "x"
	}
	rdb.ZAdd(ctx, k.Pending(shard.Index([]byte(m), 4)), redis.Z{Score: float64(time.Now().Add(5 * time.Second).UnixMilli()), Member: m})
	if _, _, err := reshard.Reshard(ctx, rdb, k, 8, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	_, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test", Wait: 1500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "1 pending tasks due soon are outside their shard by 8") {
		t.Fatalf("close with a task due soon in its old shard: %v", err)
	}
	rdb.ZRem(ctx, k.Pending(shard.Index([]byte(m), 4)), m) // dispatched
	if _, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test"}); err != nil {
		t.Fatalf("close once it was dispatched: %v", err)
	}
}
