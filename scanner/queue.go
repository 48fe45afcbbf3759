package scanner

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// LayoutPoll is how often a queue's layout is read again, in case a
// "layout" wake-up was lost; SweepRetired runs as often on the sweeper,
// and so does each step of the walk of the indexes beyond (strays.go).
const LayoutPoll = 5 * time.Second

// Queue serves one queue: it runs a Scanner over the shards the queue's
// layout has, and a new one whenever a change of the shard count
// (`dispatcher reshard`) changes which shards those are. The old one
// stops as on SIGTERM (held tasks go back into pending, outstanding
// confirms are awaited), so nothing is claimed twice or lost in between.
type Queue struct {
	rdb    redis.UniversalClient
	pub    Publisher
	opt    Options
	keys   shard.Keys
	log    *slog.Logger
	cur    atomic.Pointer[Scanner]
	layout atomic.Pointer[shard.Layout]
	poke   chan struct{} // a "layout" wake-up was heard
	strays strayWalk     // the sweeper's walk of the indexes beyond the served ones
	// scanned holds the indexes beyond the served ones where the
	// StrayScan found keys, until the watch moves their tasks.
	scanned atomic.Pointer[[]int]
}

// NewQueue returns the runner of one queue, with opt.Shards shards until
// SetLayout.
func NewQueue(rdb redis.UniversalClient, pub Publisher, opt Options) *Queue {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.InstanceID == "" {
		opt.InstanceID = NewInstanceID()
	}
	q := &Queue{rdb: rdb, pub: pub, keys: shard.Keys{Prefix: opt.KeyPrefix, Queue: opt.Queue},
		log: opt.Logger.With("queue", opt.Queue), poke: make(chan struct{}, 1)}
	opt.OnLayout = func() {
		select {
		case q.poke <- struct{}{}:
		default:
		}
	}
	q.opt = opt
	q.use(shard.Layout{Shards: opt.Shards})
	return q
}

// SetLayout sets the layout read at start (shard.EnsureLayout). Call it
// before Run.
func (q *Queue) SetLayout(l shard.Layout) { q.use(l) }

// use makes l the layout served, with a new scanner for it.
func (q *Queue) use(l shard.Layout) {
	opt := q.opt
	opt.Shards, opt.Layout = l.Span(), l.Shards
	q.layout.Store(&l)
	q.cur.Store(New(q.rdb, q.pub, opt))
	q.opt.Metrics.layout(q.opt.Queue, l)
}

// Layout is the layout the queue is served with.
func (q *Queue) Layout() shard.Layout { return *q.layout.Load() }

// Run serves the queue until ctx ends.
func (q *Queue) Run(ctx context.Context) error {
	if s := q.opt.StrayScan; s != nil {
		if s.add(q) {
			defer s.remove(q)
		} else {
			q.opt.StrayScan = nil // walk: the scan would not see this queue's keys
		}
	}
	for {
		sc := q.cur.Load()
		scCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = sc.Run(scCtx) }()
		next, changed := q.watch(scCtx, sc)
		stop()
		<-done // its wake channel unsubscribed before the next scanner subscribes it (the WakeHub routes by name)
		if !changed || ctx.Err() != nil {
			return nil
		}
		q.log.Info("shard layout changed: serving the new one", "layout", next.String(), "shards_served", next.Span(),
			"was", q.Layout().String())
		q.use(next)
	}
}

// watch reads the layout on every "layout" wake-up and every LayoutPoll;
// it returns a layout that needs other shards served, or when ctx ends.
// Meanwhile the sweeping instance moves what late producers write to
// shards a shrink retired, and what producers hashing with a larger count
// than the recorded one write to any index beyond (sweepStrays).
func (q *Queue) watch(ctx context.Context, sc *Scanner) (shard.Layout, bool) {
	// On the grid, so that every queue's read goes in one round trip
	// (readLayout).
	t := time.NewTimer(time.Until(gridNext(time.Now(), LayoutPoll)))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return shard.Layout{}, false
		case <-q.poke:
		case <-t.C:
			t.Reset(time.Until(gridNext(time.Now(), LayoutPoll)))
		}
		l, look, err := q.readLayout(ctx, sc.Sweeping())
		if err != nil {
			if ctx.Err() == nil {
				q.log.Debug("cannot read the shard layout; serving the last one read", "err", err)
			}
			continue
		}
		cur := q.Layout()
		if l.Span() != cur.Span() {
			return l, true
		}
		if l != cur {
			// Same shards served (a growth finished, a shrink started):
			// only the count misplaced tasks are told by changes.
			q.log.Info("shard layout changed", "layout", l.String(), "was", cur.String())
			q.layout.Store(&l)
			q.opt.Metrics.layout(q.opt.Queue, l)
			sc.layoutM.Store(int64(l.Shards))
		}
		if l.Changing() {
			if st, err := reshard.ReadStatus(ctx, q.rdb, q.keys); err == nil {
				q.opt.Metrics.reshardLeft(q.opt.Queue, st.LastPass.Near+st.LastPass.Retiring)
			}
		}
		if sc.Sweeping() && l.Retired > 0 {
			sw, err := reshard.SweepRetired(ctx, q.rdb, q.keys, l, q.opt.InstanceID)
			if err != nil && ctx.Err() == nil {
				q.log.Warn("cannot move tasks out of retired shards", "err", err)
			}
			q.opt.Metrics.retiredMoved(q.opt.Queue, sw.Moved+sw.Reclaimed)
			if sw.Moved > 0 {
				q.log.Warn("moved tasks that producers wrote to shards retired by a shrink: a producer still hashes with the old shard count",
					"moved", sw.Moved, "retired_shards", l.Retired, "shards", l.Shards)
			}
			if sw.Reclaimed > 0 {
				q.log.Warn("handed out tasks left in flight in shards retired by a shrink, their lease run out: an instance stopped holding them",
					"reclaimed", sw.Reclaimed, "retired_shards", l.Retired, "shards", l.Shards)
			}
		}
		if sc.Sweeping() {
			q.sweepStrays(ctx, l, look)
		}
	}
}

// readLayout reads the queue's layout and, for the sweeper, whether the
// next chunk of its walk of the indexes beyond holds anything (strays.go):
// on one Redis in one round trip shared with the other queues' (the
// instance's Coalescer), so that a thousand queues' reads every LayoutPoll
// cost one round trip, not two each.
func (q *Queue) readLayout(ctx context.Context, sweeping bool) (shard.Layout, strayLook, error) {
	_, cluster := q.rdb.(*redis.ClusterClient)
	if cluster || q.opt.Coalescer == nil {
		l, err := shard.ReadLayout(ctx, q.rdb, q.keys)
		return l, strayLook{}, err
	}
	var look strayLook
	if cur := q.Layout(); sweeping && !cur.Changing() && !q.opt.StrayScan.covers() {
		look = q.nextStrays(cur)
	}
	var layout func() (shard.Layout, error)
	var exists *redis.IntCmd
	if _, _, err := q.opt.Coalescer.Do(ctx, "", func(pipe redis.Pipeliner) {
		layout = shard.QueueLayoutRead(ctx, pipe, q.keys)
		if len(look.keys) > 0 {
			exists = pipe.Exists(ctx, look.keys...)
		}
	}); err != nil {
		return shard.Layout{}, strayLook{}, err
	}
	l, err := layout()
	if exists != nil {
		look.read = true
		look.any, look.err = exists.Val() > 0, exists.Err()
	}
	return l, look, err
}

// Wake makes the queue's scanner look at every shard now.
func (q *Queue) Wake() { q.cur.Load().Wake() }

// Sweeping: see Scanner.Sweeping.
func (q *Queue) Sweeping() bool { return q.cur.Load().Sweeping() }

// Dozing: see Scanner.Dozing.
func (q *Queue) Dozing() (dozing bool, wakes uint64) { return q.cur.Load().Dozing() }

// Waiting: see Scanner.Waiting.
func (q *Queue) Waiting() []string { return q.cur.Load().Waiting() }

// RedisRefusal: see Scanner.RedisRefusal.
func (q *Queue) RedisRefusal() string { return q.cur.Load().RedisRefusal() }

// Queue names the queue.
func (q *Queue) Queue() string { return q.opt.Queue }

// PublishFailures: see Scanner.PublishFailures.
func (q *Queue) PublishFailures() []string { return q.cur.Load().PublishFailures() }

// HandBack hands out again at once the tasks that claims of the dead
// instance with liveness id owner still hold in any of the queue's shards
// (retired ones included), and wakes the queue to claim them.
func (q *Queue) HandBack(ctx context.Context, owner string) (int, error) {
	l := q.Layout()
	return q.cur.Load().HandBack(ctx, owner, max(l.Span(), l.Retired))
}
