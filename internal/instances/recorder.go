package instances

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Totals are an instance's counters of one queue since it started.
type Totals struct {
	Published, Errors float64
	// Late is the dispatch lateness histogram: cumulative counts by upper
	// bound, the last +Inf (as Prometheus keeps it).
	Late []Bucket
	// Ingress counts what its AMQP ingress of the queue wrote and refused.
	Ingress IngressTotals
}

// Options configure a Recorder.
type Options struct {
	Prefix            string
	ID, Host, Version string
	PID               int
	Queues            []string
	// Totals reads the instance's counters per queue.
	Totals func() map[string]Totals
	// Sweeps says whether the instance holds the queue's sweeper role.
	Sweeps func(queue string) bool
	// Paused, if set, is how many of a swept queue's shards were paused at
	// its last read; known is false if it was not read yet.
	Paused func(queue string) (shards int, known bool)
	// Ingress, if set, is the state of the queue's AMQP ingress on the
	// instance, nil if it runs none; the record adds its counts over the
	// span from Totals.
	Ingress func(queue string) *Ingress
	Logger  *slog.Logger
	// TTL is how long a record lives unrenewed (0: TTL).
	TTL time.Duration
	// Now is the local clock (nil: time.Now).
	Now func() time.Time
}

// Recorder samples an instance's counters every Every and writes its
// records of every queue it serves. Run it once.
type Recorder struct {
	rdb redis.UniversalClient
	opt Options
	log *slog.Logger

	mu      sync.Mutex
	samples map[string][]sample // per queue, oldest first
	offset  time.Duration       // the Redis clock minus the local one, learnt from the writes
	failing bool                // the last write failed (logged once)
}

type sample struct {
	at time.Time // local clock
	t  Totals
}

// keep is how many samples of a queue are kept: the slots' span.
const keep = Slots + 1

// New returns a Recorder. The counters start at zero with the process:
// that is its first sample, so that the figures cover the time since the
// start until it is longer than Window.
func New(rdb redis.UniversalClient, opt Options) *Recorder {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.TTL <= 0 {
		opt.TTL = TTL
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	r := &Recorder{rdb: rdb, opt: opt, log: opt.Logger, samples: map[string][]sample{}}
	start := opt.Now()
	for _, q := range opt.Queues {
		r.samples[q] = []sample{{at: start}}
	}
	return r
}

// Run writes the records every Every, on the grid of the Redis clock so
// that the instances' slots line up, until ctx ends; then it removes them.
func (r *Recorder) Run(ctx context.Context) {
	defer func() {
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if err := Remove(stop, r.rdb, r.opt.Prefix, r.opt.ID, r.opt.Queues); err != nil {
			r.log.Debug("cannot remove this instance's records; they expire", "err", err)
		}
	}()
	for {
		r.mu.Lock()
		at := r.opt.Now().Add(r.offset)
		r.mu.Unlock()
		wait := Every - time.Duration(at.UnixNano()%int64(Every))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		r.tick(ctx)
	}
}

// tick samples the counters and writes the records.
func (r *Recorder) tick(ctx context.Context) {
	now := r.opt.Now()
	tot := r.opt.Totals()
	recs := make(map[string]Record, len(r.opt.Queues))
	r.mu.Lock()
	for _, q := range r.opt.Queues {
		ss := append(r.samples[q], sample{at: now, t: tot[q]})
		if len(ss) > keep {
			ss = append(ss[:0], ss[len(ss)-keep:]...)
		}
		// Only the figures' window needs the histograms.
		for n := range ss {
			if now.Sub(ss[n].at) > Window+2*Every {
				ss[n].t.Late = nil
			}
		}
		r.samples[q] = ss
		recs[q] = r.record(q, ss, ss[len(ss)-1])
	}
	r.mu.Unlock()

	wctx, cancel := context.WithTimeout(ctx, Every)
	before := time.Now()
	redisMs, err := Write(wctx, r.rdb, r.opt.Prefix, recs, r.opt.TTL)
	after := time.Now()
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if redisMs > 0 {
		mid := before.Add(after.Sub(before) / 2)
		r.offset = time.UnixMilli(redisMs).Sub(mid)
	}
	switch {
	case err != nil && ctx.Err() == nil && !r.failing:
		r.failing = true
		r.log.Warn("cannot write this instance's records to Redis: the other instances' status pages and /readyz do not show it", "err", err)
	case err == nil && r.failing:
		r.failing = false
		r.log.Info("writing this instance's records to Redis again")
	}
}

// Current is the instance's records as of now, their figures from a fresh
// reading of its counters: its own status page shows itself up to date.
// Its slots are those of its last write, complete, as the other
// instances' are.
func (r *Recorder) Current() map[string]Record {
	now := r.opt.Now()
	tot := r.opt.Totals()
	r.mu.Lock()
	defer r.mu.Unlock()
	recs := make(map[string]Record, len(r.opt.Queues))
	for _, q := range r.opt.Queues {
		rec := r.record(q, r.samples[q], sample{at: now, t: tot[q]})
		rec.SeenMs = now.Add(r.offset).UnixMilli()
		recs[q] = rec
	}
	return recs
}

// record is what samples ss say of queue q: its figures up to the reading
// last (ss's latest, or one after it), its slots up to ss's latest.
func (r *Recorder) record(q string, ss []sample, last sample) Record {
	rec := Record{ID: r.opt.ID, Host: r.opt.Host, PID: r.opt.PID, Version: r.opt.Version, Sweeps: r.opt.Sweeps(q)}
	if rec.Sweeps && r.opt.Paused != nil {
		if n, ok := r.opt.Paused(q); ok {
			rec.Paused = n
		}
	}
	from := ss[0]
	for _, s := range ss {
		if last.at.Sub(s.at) < Window {
			break
		}
		from = s
	}
	rec.SpanMs = last.at.Sub(from.at).Milliseconds()
	rec.Published = int64(last.t.Published - from.t.Published)
	rec.Errors = int64(last.t.Errors - from.t.Errors)
	rec.Late = lateDelta(from.t.Late, last.t.Late)
	if r.opt.Ingress != nil {
		if in := r.opt.Ingress(q); in != nil {
			in.Ingested, in.Errors = ingressDelta(from.t.Ingress, last.t.Ingress)
			rec.Ingress = in
		}
	}

	// Each sample's increase goes to the slot its time ends on the grid
	// of the Redis clock (a sample late by more than half a slot, to the
	// next one).
	slot := SlotSpan.Milliseconds()
	var idx []int64
	var pub []int64
	for n := 1; n < len(ss); n++ {
		i := int64(math.Round(float64(ss[n].at.Add(r.offset).UnixMilli()) / float64(slot)))
		if len(idx) > 0 && i <= idx[len(idx)-1] {
			i = idx[len(idx)-1] + 1
		}
		idx = append(idx, i)
		pub = append(pub, int64(ss[n].t.Published-ss[n-1].t.Published))
	}
	if len(idx) == 0 {
		return rec
	}
	lastIdx := idx[len(idx)-1]
	rec.EndMs = lastIdx * slot
	rec.Slots = make([]int64, min(Slots, int(lastIdx-idx[0])+1))
	for n, i := range idx {
		if at := len(rec.Slots) - 1 - int(lastIdx-i); at >= 0 {
			rec.Slots[at] += pub[n]
		}
	}
	return rec
}

// lateDelta is the histogram of the tasks published between two
// cumulative readings, not cumulative, empty buckets left out. A bucket
// the earlier reading lacks counts from zero.
func lateDelta(from, to []Bucket) Late {
	was := make(map[float64]uint64, len(from))
	for _, b := range from {
		was[b.UpTo] = b.Count
	}
	var out Late
	var prev uint64 // cumulative increase up to the bucket before
	for _, b := range to {
		inc := b.Count - min(was[b.UpTo], b.Count)
		if inc > prev {
			out = append(out, Bucket{UpTo: b.UpTo, Count: inc - prev})
		}
		prev = max(prev, inc)
	}
	return out
}
