package reshard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// Options of Reshard and Close.
type Options struct {
	// Name identifies this mover in the lock (host and pid, say).
	Name string
	// Horizon: see Mover (DefaultHorizon).
	Horizon time.Duration
	// Report, if set, is told about each pass and each wait.
	Report func(pass int, p Progress, waiting string)
	// Wait bounds how long Close waits for the retiring shards to empty
	// (default: the horizon plus 2 minutes).
	Wait time.Duration
}

func (o Options) report(pass int, p Progress, waiting string) {
	if o.Report != nil {
		o.Report(pass, p, waiting)
	}
}

// Reshard starts (or resumes) the change of the queue's shard count to
// to, then moves tasks until a pass finds none left to move. The change
// stays in progress, both counts served, until Close. Run again after an
// interruption, it carries on where it stopped.
func Reshard(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, to int, opt Options) (Started, Progress, error) {
	st, err := Start(ctx, rdb, keys, to)
	if err != nil || st.Same {
		return st, Progress{}, err
	}
	l := shard.Layout{Shards: to, From: st.From}
	p, err := moveAll(ctx, rdb, keys, l, opt, false)
	return st, p, err
}

// Close finishes the change in progress: it moves what is left, waits
// for the shards the new count no longer has to empty (their tasks due
// soon are dispatched, their in-flight ones confirmed), then ends the
// change.
func Close(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, opt Options) (shard.Layout, Progress, error) {
	l, err := shard.ReadLayout(ctx, rdb, keys)
	if err != nil {
		return l, Progress{}, err
	}
	if !l.Changing() {
		return l, Progress{}, fmt.Errorf("queue %s: no change of the shard count is in progress (%s)", keys.Queue, l)
	}
	p, err := moveAll(ctx, rdb, keys, l, opt, true)
	if err != nil {
		return l, p, err
	}
	return l, p, Finish(ctx, rdb, keys, l)
}

// moveAll holds the lock and runs passes until one moves nothing; with
// drain, also until the retiring shards are empty.
func moveAll(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, l shard.Layout, opt Options, drain bool) (total Progress, err error) {
	lock, err := waitLock(ctx, rdb, keys, opt)
	if err != nil {
		return Progress{}, err
	}
	defer lock.Unlock(context.WithoutCancel(ctx))
	outer := ctx
	ctx, stop := lock.Guard(ctx)
	defer stop()
	defer func() {
		if cause := context.Cause(ctx); errors.Is(cause, ErrLockLost) && outer.Err() == nil {
			err = fmt.Errorf("queue %s: %w; run it again", keys.Queue, cause)
		}
	}()
	if err := settle(ctx, rdb, keys, opt); err != nil {
		return Progress{}, err
	}
	m := &Mover{RDB: rdb, Keys: keys, Horizon: opt.Horizon}
	wait := opt.Wait
	if wait == 0 {
		wait = m.horizon() + 2*time.Minute
	}
	deadline := time.Now().Add(wait)
	for pass := 1; ; pass++ {
		p, err := m.Pass(ctx, l, 0, l.Span())
		// Again after each pass: a wake-up lost (a failover, a dispatcher
		// reconnecting) would leave an instance to its layout poll.
		Notify(ctx, rdb, keys)
		total.add(p)
		total.Near, total.Retiring = p.Near, p.Retiring
		if rerr := record(ctx, rdb, keys, p); rerr != nil && err == nil {
			err = fmt.Errorf("record the pass: %w", rerr)
		}
		if err != nil {
			return total, err
		}
		moved := p.Moved + p.Kept + p.Raced + p.DeadMoved
		// Finishing waits until no task is left where only the old count
		// puts it: after a growth too, since producers then cancel and
		// reschedule by the new count only.
		if moved == 0 && (!drain || p.Retiring+p.Near == 0) {
			opt.report(pass, p, "")
			return total, nil
		}
		waiting := ""
		if moved == 0 {
			var left []string
			if p.Retiring > 0 {
				left = append(left, fmt.Sprintf("shards %d..%d still hold %d tasks (pending due soon, in flight or dead)", l.Shards, l.From-1, p.Retiring))
			}
			if p.Near > 0 {
				left = append(left, fmt.Sprintf("%d pending tasks due soon are outside their shard by %d", p.Near, l.Shards))
			}
			if time.Now().After(deadline) {
				return total, fmt.Errorf("queue %s: %s after %s: is a dispatcher serving the queue, or a producer still writing with %d shards?",
					keys.Queue, strings.Join(left, "; "), wait, l.From)
			}
			waiting = strings.Join(left, "; ") + ": waiting for them to be dispatched"
			select {
			case <-ctx.Done():
				return total, ctx.Err()
			case <-time.After(time.Second):
			}
		}
		opt.report(pass, p, waiting)
	}
}

// settle waits until shard.LayoutSettle has passed, by the Redis clock,
// since the change was recorded: a producer that read the layout just
// before it (producers read it once a second) may still write by the old
// count until then, and a move of its task would undo that write (the new
// count's copy wins). Nothing is moved before.
func settle(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, opt Options) error {
	for told := false; ; told = true {
		started, err := rdb.HGet(ctx, keys.Reshard(), "started_ms").Int64()
		if errors.Is(err, redis.Nil) {
			return nil // finished meanwhile: nothing to wait for
		}
		if err != nil {
			return fmt.Errorf("queue %s: read when the change started (%s): %w", keys.Queue, keys.Reshard(), err)
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("queue %s: read the Redis clock: %w", keys.Queue, err)
		}
		left := time.UnixMilli(started).Add(shard.LayoutSettle).Sub(now)
		if left <= 0 {
			return nil
		}
		if !told {
			opt.report(0, Progress{}, fmt.Sprintf("waiting %s for producers to read the new shard count before moving anything",
				left.Round(100*time.Millisecond)))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(left):
		}
	}
}

// waitLock takes the mover lock, waiting while another mover holds it
// (one that died holds it for up to LockTTL).
func waitLock(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, opt Options) (*Lock, error) {
	for told := false; ; {
		lock, holder, err := TryLock(ctx, rdb, keys, opt.Name)
		if err != nil || lock != nil {
			return lock, err
		}
		if !told {
			opt.report(0, Progress{}, fmt.Sprintf("another mover (%s) holds the lock; waiting (a mover that died holds it up to %s)", holder, LockTTL))
			told = true
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// SweepRetired moves what producers still hashing with a retired (larger)
// shard count wrote to the shards a shrink retired, which no dispatcher
// serves, due or not, and hands tasks left in flight there whose lease
// ran out to their shards' dispatchers. It checks the shards with one
// round trip, and only if one holds something takes the lock. It does
// nothing without a retired count, or while another mover runs.
func SweepRetired(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, l shard.Layout, name string) (Swept, error) {
	if l.Retired <= l.Shards || l.Changing() {
		return Swept{}, nil
	}
	if found, err := retiredWork(ctx, rdb, keys, l); err != nil || !found {
		return Swept{}, err
	}
	lock, _, err := TryLock(ctx, rdb, keys, name)
	if err != nil || lock == nil {
		return Swept{}, err
	}
	defer lock.Unlock(context.WithoutCancel(ctx))
	ctx, stop := lock.Guard(ctx)
	defer stop()
	m := &Mover{RDB: rdb, Keys: keys, Horizon: -1}
	p, err := m.Pass(ctx, l, l.Shards, l.Retired)
	sw := Swept{Moved: p.Moved + p.Kept + p.DeadMoved}
	for i := l.Shards; i < l.Retired && ctx.Err() == nil; i++ {
		n, rerr := m.reclaimInflight(ctx, l, i)
		sw.Reclaimed += n
		err = errors.Join(err, rerr)
	}
	return sw, err
}
