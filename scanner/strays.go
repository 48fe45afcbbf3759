package scanner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// StrayCycle is how long the sweeping instance takes to look once at
// every shard index beyond those it serves, up to the contract's last
// (MaxShards-1): where a producer hashing with a larger count than the
// recorded one writes. Those after a shrink (the retired ones) are
// looked at every LayoutPoll instead (reshard.SweepRetired).
const StrayCycle = time.Minute

// strayChunks is how many looks a cycle takes, one per LayoutPoll: for a
// queue of 32 shards, 4064 indexes in chunks of 339 keys, one EXISTS each
// on one server (a pipeline of 339 on Redis Cluster).
const strayChunks = int(StrayCycle / LayoutPoll)

// strayFrom is the first index where strays are looked for in a queue
// of layout l: beyond the served shards and those a shrink retired (which
// are watched on their own).
func strayFrom(l shard.Layout) int { return max(l.Span(), l.Retired) }

// beyondServed returns the indexes of idx from strayFrom(l) on, sorted,
// each once, in idx's array.
func beyondServed(l shard.Layout, idx []int) []int {
	from := strayFrom(l)
	out := idx[:0]
	for _, i := range idx {
		if i >= from {
			out = append(out, i)
		}
	}
	slices.Sort(out) // a SCAN may return a key twice
	return slices.Compact(out)
}

// strayWalk is where the walk of a queue's indexes beyond its served ones
// is: the next index to look at. Only Queue.watch uses it.
type strayWalk struct {
	next int
}

// chunk returns the next indexes to look at, beyond from, and moves on.
func (w *strayWalk) chunk(from int) (lo, hi int) {
	if from >= shard.MaxShards {
		return 0, 0
	}
	if w.next < from || w.next >= shard.MaxShards {
		w.next = from
	}
	n := shard.MaxShards - from
	lo, hi = w.next, min(w.next+(n+strayChunks-1)/strayChunks, shard.MaxShards)
	w.next = hi
	return lo, hi
}

// strayLook is the next chunk of the walk, looked at with one EXISTS in
// the layout's round trip (Queue.readLayout); read is false if it was not.
type strayLook struct {
	lo        int
	keys      []string
	read, any bool
	err       error
}

// nextStrays is the next chunk of the walk for layout l.
func (q *Queue) nextStrays(l shard.Layout) strayLook {
	lo, hi := q.strays.chunk(strayFrom(l))
	return strayLook{lo: lo, keys: q.keys.PendingRange(lo, hi)}
}

// sweepStrays looks at the next chunk of the indexes beyond those served
// (and beyond the retired ones, watched on their own) and moves what
// producers wrote there to its shard by the current count, due or not:
// the due ones are then dispatched from there at once. They count as
// misplaced and are warned of with their keys. Nothing is done during a
// change of the shard count, whose mover holds the lock. look is the
// chunk if readLayout looked at it already (with the layout l was read
// with, the one served).
func (q *Queue) sweepStrays(ctx context.Context, l shard.Layout, look strayLook) {
	if l.Changing() {
		return
	}
	if q.opt.StrayScan.covers() {
		q.moveScanned(ctx, l)
		return
	}
	if !look.read {
		look = q.nextStrays(l)
	}
	keys, lo := look.keys, look.lo
	if len(keys) == 0 || look.read && look.err == nil && !look.any {
		return
	}
	err := look.err
	var found []int
	if err == nil {
		found, err = shard.Occupied(ctx, q.rdb, keys)
	}
	if err != nil {
		if ctx.Err() == nil {
			q.log.Warn("cannot look for tasks in shard keys beyond the shard count", "from", keys[0], "to", keys[len(keys)-1], "err", err)
		}
		return
	}
	if len(found) == 0 {
		return
	}
	q.moveFound(ctx, l, lo, found)
}

// moveFound moves the tasks of indexes lo+found[n] (moveStrays), counts
// and warns of them.
func (q *Queue) moveFound(ctx context.Context, l shard.Layout, lo int, found []int) {
	moved, names, err := q.moveStrays(ctx, l, lo, found)
	if moved > 0 {
		q.opt.Metrics.strayMoved(q.opt.Queue, moved)
		q.log.Warn("moved tasks a producer wrote to shard keys beyond the queue's shard count: a producer hashes with a larger count than the recorded one",
			"moved", moved, "keys", names, "shards", l.Shards)
		q.Wake()
	}
	if err != nil && ctx.Err() == nil {
		q.log.Warn("cannot move tasks out of shard keys beyond the shard count", "keys", names, "err", err)
	}
}

// strayKeys hands the queue the indexes beyond its served ones where the
// StrayScan found keys, and wakes its watch to move their tasks.
func (q *Queue) strayKeys(idx []int) {
	q.scanned.Store(&idx)
	select {
	case q.poke <- struct{}{}:
	default:
	}
}

// moveScanned moves the tasks of the keys the StrayScan found beyond the
// shards served by l, as sweepStrays does those of the walk.
func (q *Queue) moveScanned(ctx context.Context, l shard.Layout) {
	p := q.scanned.Swap(nil)
	if p == nil {
		return
	}
	// The layout may have changed since the scan.
	if found := beyondServed(l, *p); len(found) > 0 {
		q.moveFound(ctx, l, 0, found)
	}
}

// moveStrays moves the tasks of indexes lo+found[n] to their shards under
// the mover's lock (none if another mover holds it: the next cycle
// tries again). It returns how many it moved, and the keys with their
// counts: `dq:{orders:40} (3), dq:{orders:4095} (1)`, at most 8 named.
func (q *Queue) moveStrays(ctx context.Context, l shard.Layout, lo int, found []int) (int64, string, error) {
	lock, _, err := reshard.TryLock(ctx, q.rdb, q.keys, q.opt.InstanceID)
	if err != nil || lock == nil {
		return 0, "", err
	}
	defer lock.Unlock(context.WithoutCancel(ctx))
	ctx, stop := lock.Guard(ctx)
	defer stop()
	m := &reshard.Mover{RDB: q.rdb, Keys: q.keys, Horizon: -1}
	var total int64
	var names []string
	var errs []string
	for n, f := range found {
		i := lo + f
		p, err := m.Pass(ctx, l, i, i+1)
		moved := p.Moved + p.Kept + p.DeadMoved
		total += moved
		if n < 8 {
			names = append(names, fmt.Sprintf("%s (%d)", q.keys.Pending(i), moved))
		}
		if err != nil {
			errs = append(errs, err.Error())
			if ctx.Err() != nil {
				break
			}
		}
	}
	if len(found) > 8 {
		names = append(names, fmt.Sprintf("and %d more", len(found)-8))
	}
	if len(errs) > 0 {
		err = fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return total, strings.Join(names, ", "), err
}
