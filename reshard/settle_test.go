package reshard_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// failLayoutReads makes a client's reads of the queue's layout fail while
// on is set (the node holding P:{Q}:shards does not answer this client;
// on Redis Cluster the shards' keys live on other nodes).
type failLayoutReads struct {
	key string
	on  atomic.Bool
}

func (h *failLayoutReads) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *failLayoutReads) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *failLayoutReads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			for _, c := range cmds {
				if a := c.Args(); c.Name() == "get" && len(a) > 1 && a[1] == h.key {
					err := errors.New("test: the layout's node does not answer")
					for _, c := range cmds {
						c.SetErr(err)
					}
					return err
				}
			}
		}
		return next(ctx, cmds)
	}
}

// delayStart holds the start script of a change (EVALSHA/EVAL with the
// reshard hash as its second key and two arguments) for a while, then
// runs before() and lets it through: a reshard process paused between
// its TIME and its start script.
type delayStart struct {
	reshardKey string
	pause      time.Duration
	before     func()
	done       atomic.Bool
}

func (h *delayStart) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *delayStart) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *delayStart) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, c redis.Cmder) error {
		a := c.Args()
		if (c.Name() == "evalsha" || c.Name() == "eval") && len(a) >= 7 && a[4] == h.reshardKey && !h.done.Swap(true) {
			time.Sleep(h.pause)
			h.before()
		}
		return next(ctx, c)
	}
}

// scheduled returns a producer of k on c by 4 shards, wake-ups off, and n
// tasks it scheduled due in 10 minutes (old); later is 20 minutes ahead.
func scheduled(t *testing.T, c redis.UniversalClient, k shard.Keys, n int) (p *shard.Producer, ms [][]byte, old, later time.Time) {
	t.Helper()
	p, err := shard.NewProducer(c, k.Prefix, k.Queue, 4)
	if err != nil {
		t.Fatal(err)
	}
	p.SetWakeWithin(0)
	old, later = time.Now().Add(10*time.Minute), time.Now().Add(20*time.Minute)
	ms = members(n)
	for _, m := range ms {
		if err := p.Schedule(context.Background(), m, old); err != nil { // reads the layout by 4
			t.Fatal(err)
		}
	}
	return p, ms, old, later
}

func members(n int) [][]byte {
	var out [][]byte
	for i := 0; i < n; i++ {
		out = append(out, []byte(fmt.Sprintf("task-%d", i)))
	}
	return out
}

// undone counts the members not pending once, at due, in their shard by 8.
func undone(t *testing.T, rdb *redis.Client, k shard.Keys, ms [][]byte, due time.Time) (early, missing int) {
	ctx := context.Background()
	for _, m := range ms {
		score, err := rdb.ZScore(ctx, k.Pending(shard.Index(m, 8)), string(m)).Result()
		if err != nil {
			missing++
			continue
		}
		if int64(score) != due.UnixMilli() {
			early++
		}
	}
	return early, missing
}

// TestFailedLayoutReadsKeepTheLayoutsAge: a producer that read
// the layout by 4 shards, and whose reads of it then fail while its writes
// succeed, keeps writing by 4 long after the change to 8 was recorded and
// the move ran: a failed read stores the kept layout with the time of the
// failed read as its "sent", so the write looks fast and no re-check
// happens. Its reschedules are then undone by the next pass (the moved
// copy, at the old due time, wins): tasks sent 10 minutes early.
func TestFailedLayoutReadsKeepTheLayoutsAge(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	hook := &failLayoutReads{key: k.ShardCount()}
	pc := redis.NewClient(rdb.Options())
	pc.AddHook(hook)
	t.Cleanup(func() { pc.Close() })
	p, ms, old, later := scheduled(t, pc, k, 50)
	hook.on.Store(true)
	if _, _, err := reshard.Reshard(ctx, rdb, k, 8, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	// Over 5 s after the producer's last successful layout read.
	trusted := 0
	for _, m := range ms {
		if err := p.Schedule(ctx, m, later); err == nil {
			trusted++
		}
	}
	if _, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	early, missing := undone(t, rdb, k, ms, later)
	t.Logf("%d of %d reschedules by a layout read %s+ before answered nil; after finish %d are at the old due time, %d missing",
		trusted, len(ms), shard.LayoutSettle, early, missing)
	if early > 0 && trusted > 0 {
		t.Errorf("%d of %d reschedules reported done (nil) were undone by the move: tasks due %s sent at %s",
			early, len(ms), later.Format(time.TimeOnly), old.Format(time.TimeOnly))
	}
}

// TestChangeStartsWhenRecorded: started_ms is the Redis clock
// read (TIME) before the start script runs, not when the change is
// recorded. A reshard process paused between the two (6 s here) starts
// moving at once, and a producer that read the layout just before the
// change and writes 0.5 s later (well within LayoutRecheck) has its
// reschedules undone. (With started_ms the time of the record, the move
// waits 5 s and the writes, made by the old count before it, are moved.)
func TestChangeStartsWhenRecorded(t *testing.T) {
	ctx := context.Background()
	rdb, k := setup(t, 4)
	p, ms, _, later := scheduled(t, rdb, k, 50)
	read := make(chan time.Time, 1)
	hook := &delayStart{reshardKey: k.Reshard(), pause: 6 * time.Second, before: func() {
		at := time.Now()
		if l := p.Layout(ctx); l != (shard.Layout{Shards: 4}) { // its cache ran out: read now
			t.Errorf("layout read just before the change: %+v", l)
		}
		read <- at
	}}
	rc := redis.NewClient(rdb.Options())
	rc.AddHook(hook)
	t.Cleanup(func() { rc.Close() })
	moved := make(chan error, 1)
	go func() {
		_, _, err := reshard.Reshard(ctx, rc, k, 8, reshard.Options{Name: "test"})
		moved <- err
	}()
	readAt := <-read
	time.Sleep(time.Until(readAt.Add(500 * time.Millisecond)))
	for _, m := range ms {
		if err := p.Schedule(ctx, m, later); err != nil {
			t.Fatal(err)
		}
	}
	wrote := time.Since(readAt)
	if wrote > 900*time.Millisecond {
		t.Fatalf("inconclusive: writes done %s after the layout read, past its second in the cache", wrote)
	}
	if err := <-moved; err != nil {
		t.Fatal(err)
	}
	if _, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	early, missing := undone(t, rdb, k, ms, later)
	t.Logf("writes done %s after their layout read; after finish %d of %d at the old due time, %d missing", wrote.Round(time.Millisecond), early, len(ms), missing)
	if early > 0 || missing > 0 {
		t.Errorf("%d of %d reschedules written within %s of their layout read were undone by a move (%d missing)",
			early, len(ms), wrote.Round(time.Millisecond), missing)
	}
}
