// Package forecast says how many of a queue's pending tasks fall due in
// each step of a window ahead (by default every minute of the next hour),
// how many are overdue already, and the busiest second ahead, so that a
// thundering herd (a million tasks due at one second) is seen before it
// comes. It only counts: ZCOUNT per bucket per shard (O(log n) each), or
// a sparse shard's few scores read at once, never a scan, so a queue of
// 10^7 tasks costs what an empty one does.
package forecast

import (
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// countScript counts one shard's pending tasks per bucket. One call per
// shard touches one key, so it runs on a Redis Cluster as on one server;
// the bounds come from the caller, read once from the Redis clock, so
// that the buckets of every shard line up. It only reads: no-writes lets
// it run on a replica and on a Redis at maxmemory.
//
// Redis counts each call inside a script as its work, and a ZCOUNT per
// bucket of a sparse shard is most of that work for nothing: the script
// counts the whole window first, and when it holds at most sparseScores
// tasks it reads their scores in one ZRANGE and buckets them itself (two
// calls instead of one per bucket; at most sparseScores members copied).
//
// KEYS[1] pending shard P:{Q:i} (score = due time in ms)
// ARGV[1] start of the first bucket, ms since the epoch
// ARGV[2] width of a bucket, ms
// ARGV[3] number of buckets
// ARGV[4] "1": also count the tasks due before ARGV[1] (overdue)
// Returns {before (-1 if not asked), count of bucket 1, ..., bucket n};
// bucket k holds the scores in [from + (k-1)*width, from + k*width).
var countScript = redis.NewScript(countSrc)

const countSrc = `#!lua flags=no-writes
local from, width, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {-1}
if ARGV[4] == '1' then
  out[1] = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[1])
end
local upto = string.format('(%d', from + n * width)
local total = -1
if n > 2 then total = redis.call('ZCOUNT', KEYS[1], ARGV[1], upto) end
if total >= 0 and total <= 128 then -- sparseScores
  for k = 0, n - 1 do out[k + 2] = 0 end
  if total > 0 then
    local got = redis.call('ZRANGE', KEYS[1], ARGV[1], upto, 'BYSCORE', 'LIMIT', 0, total, 'WITHSCORES')
    for i = 2, #got, 2 do
      local k = math.floor((tonumber(got[i]) - from) / width)
      if k < 0 then k = 0 elseif k > n - 1 then k = n - 1 end
      out[k + 2] = out[k + 2] + 1
    end
  end
  return out
end
for k = 0, n - 1 do
  local a = from + k * width
  out[k + 2] = redis.call('ZCOUNT', KEYS[1], string.format('%d', a), string.format('(%d', a + width))
end
return out
`

// sparseScores is the most tasks in a window whose scores countScript
// reads to bucket them, instead of a ZCOUNT per bucket. The script spells
// it as a literal: a script's source must be a constant.
const sparseScores = 128

// MaxBuckets bounds a window's buckets (a day by the minute).
const MaxBuckets = 1440

// Window is what to forecast.
type Window struct {
	// FromMs is the start, ms since the epoch; 0 is the current whole
	// second of the Redis clock (so that the seconds of the busiest-second
	// search are the clock's seconds, and a herd due within one does not
	// straddle two).
	FromMs int64
	Span   time.Duration // length of the window, a multiple of Step
	Step   time.Duration // width of a bucket, a whole number of seconds
}

// Check says what is wrong with w, naming the value.
func (w Window) Check() error {
	switch {
	case w.Step < time.Second || w.Step%time.Second != 0:
		return fmt.Errorf("step %s: want a whole number of seconds, at least 1s", w.Step)
	case w.Step > time.Minute && w.Step%time.Minute != 0:
		// The busiest second is found by splitting a step into at most 60
		// equal parts: 61s could only be split into seconds.
		return fmt.Errorf("step %s: over a minute, want whole minutes", w.Step)
	case w.Span < w.Step || w.Span%w.Step != 0:
		return fmt.Errorf("window %s: want a multiple of the step %s", w.Span, w.Step)
	case w.Span/w.Step > MaxBuckets:
		return fmt.Errorf("window %s by %s: %d buckets, at most %d", w.Span, w.Step, w.Span/w.Step, MaxBuckets)
	}
	return nil
}

// Bucket is the tasks due in [FromMs, FromMs+step).
type Bucket struct {
	FromMs int64 `json:"from_ms"`
	Tasks  int64 `json:"tasks"`
}

// Peak is the busiest second found: the most tasks due in one second of
// the window (seconds counted from the window's start).
type Peak struct {
	FromMs int64 `json:"from_ms,omitempty"` // its start; 0 if nothing is due
	Tasks  int64 `json:"tasks"`
	// Exact: no other second of the window holds more. When the refining
	// budget ran out first, Bound is the most any second not looked at
	// could hold (the count of the largest bucket not refined).
	Exact bool  `json:"exact"`
	Bound int64 `json:"bound,omitempty"`
}

// ShardError is a shard that could not be read.
type ShardError struct {
	Shard int    `json:"shard"`
	Err   string `json:"error"`
}

// Forecast is a queue's tasks due ahead, summed over the shards read.
type Forecast struct {
	Queue  string `json:"queue"`
	FromMs int64  `json:"from_ms"`
	StepMs int64  `json:"step_ms"`
	// Overdue counts the tasks due before FromMs still pending (with a
	// from of now: due and not yet claimed).
	Overdue int64        `json:"overdue"`
	Total   int64        `json:"total"` // in the window
	Buckets []Bucket     `json:"buckets"`
	Peak    Peak         `json:"peak_second"`
	Broken  []ShardError `json:"broken_shards,omitempty"`
}

// Options are a read's queue and shards.
type Options struct {
	Prefix, Queue string
	// Shards are the shard indexes to count.
	Shards []int
	// Refine is how many buckets may be split to find the busiest second
	// (each split is one round trip, one call per shard that has tasks in
	// the bucket, at most 60 counts in each): the largest first, each
	// into seconds or, for a step over a minute, into up to 60 parts.
	// 0 finds no peak.
	Refine int
}

// Read counts opt.Queue's tasks due in each bucket of w, over opt.Shards,
// and, with opt.Refine, finds the busiest second. A shard that cannot be
// read is listed in Broken and the others are counted; the error is for
// no shard read.
func Read(ctx context.Context, rdb redis.UniversalClient, opt Options, w Window) (Forecast, error) {
	if err := w.Check(); err != nil {
		return Forecast{}, err
	}
	f := Forecast{Queue: opt.Queue, FromMs: w.FromMs, StepMs: w.Step.Milliseconds()}
	if f.FromMs == 0 {
		t, err := rdb.Time(ctx).Result()
		if err != nil {
			return f, fmt.Errorf("forecast queue %s: read the Redis clock: %w", opt.Queue, err)
		}
		f.FromMs = t.UnixMilli() / 1000 * 1000
	}
	n := int(w.Span / w.Step)
	r := reader{rdb: rdb, keys: shard.Keys{Prefix: opt.Prefix, Queue: opt.Queue}, shards: opt.Shards}
	all := make([]bool, len(opt.Shards))
	for i := range all {
		all[i] = true
	}
	counts, before, errs := r.count(ctx, all, f.FromMs, f.StepMs, n, true)
	read := 0
	var firstErr error
	for s, err := range errs {
		if err != nil {
			f.Broken = append(f.Broken, ShardError{Shard: opt.Shards[s], Err: err.Error()})
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		read++
		f.Overdue += before[s]
	}
	if read == 0 && firstErr != nil {
		return f, fmt.Errorf("forecast queue %s: %w", opt.Queue, firstErr)
	}
	spans := make([]span, n)
	for k := range n {
		sp := span{from: f.FromMs + int64(k)*f.StepMs, width: f.StepMs, per: make([]int64, len(opt.Shards))}
		for s := range opt.Shards {
			if errs[s] == nil {
				sp.per[s] = counts[s][k]
				sp.tasks += counts[s][k]
			}
		}
		spans[k] = sp
		f.Buckets = append(f.Buckets, Bucket{FromMs: sp.from, Tasks: sp.tasks})
		f.Total += sp.tasks
	}
	if opt.Refine > 0 {
		f.Peak = r.peak(ctx, spans, opt.Refine)
	}
	return f, nil
}

type reader struct {
	rdb    redis.UniversalClient
	keys   shard.Keys
	shards []int
}

// count runs countScript on the shards marked in ask, in one pipeline (on
// a cluster, one per primary, sent in parallel by go-redis): counts[s][k]
// is shard s's bucket k, before[s] its overdue tasks.
func (r reader) count(ctx context.Context, ask []bool, from, width int64, n int, withBefore bool) (counts [][]int64, before []int64, errs []error) {
	counts, before, errs = make([][]int64, len(r.shards)), make([]int64, len(r.shards)), make([]error, len(r.shards))
	cmds := make([]*redis.Cmd, len(r.shards))
	flag := "0"
	if withBefore {
		flag = "1"
	}
	send := func(pipe redis.Pipeliner, s int, source bool) {
		keys := []string{r.keys.Pending(r.shards[s])}
		if source { // after NOSCRIPT: the source, which also caches it
			cmds[s] = countScript.Eval(ctx, pipe, keys, from, width, n, flag)
		} else {
			cmds[s] = countScript.EvalSha(ctx, pipe, keys, from, width, n, flag)
		}
	}
	pipe := r.rdb.Pipeline()
	for s := range r.shards {
		if ask[s] {
			send(pipe, s, false)
		}
	}
	if pipe.Len() == 0 {
		return counts, before, errs
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// A command never sent (the connection's set-up failed) has no
		// error of its own: it gets the pipeline's.
		for _, c := range cmds {
			if c != nil && c.Err() == nil && c.Val() == nil {
				c.SetErr(err)
			}
		}
	}
	pipe = r.rdb.Pipeline()
	for s, c := range cmds {
		if c != nil && redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			send(pipe, s, true)
		}
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx)
	}
	for s, c := range cmds {
		if c == nil {
			continue
		}
		vals, err := c.Int64Slice()
		switch {
		case redis.HasErrorPrefix(err, "WRONGTYPE"):
			errs[s] = fmt.Errorf("shard %d: WRONGTYPE key %s is not a sorted set", r.shards[s], r.keys.Pending(r.shards[s]))
		case err != nil:
			errs[s] = fmt.Errorf("shard %d: %w", r.shards[s], err)
		case len(vals) != n+1:
			errs[s] = fmt.Errorf("shard %d: count script returned %d values, want %d", r.shards[s], len(vals), n+1)
		default:
			before[s], counts[s] = vals[0], vals[1:]
		}
	}
	return counts, before, errs
}

// span is a stretch of the window with its tasks, in all and per shard.
type span struct {
	from, width, tasks int64
	per                []int64
}

// spanHeap orders spans by their tasks, the most first, then the earliest.
type spanHeap []span

func (h spanHeap) Len() int { return len(h) }
func (h spanHeap) Less(a, b int) bool {
	return h[a].tasks > h[b].tasks || (h[a].tasks == h[b].tasks && h[a].from < h[b].from)
}
func (h spanHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *spanHeap) Push(x any)   { *h = append(*h, x.(span)) }
func (h *spanHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// peak finds the busiest second by branch and bound: a span's count is
// the most any of its seconds can hold, so the largest span is split
// (into seconds, or into up to 60 parts) until a single second is larger
// than every span left. Buckets no busier than that second are never
// split: a herd costs one split, an idle window none. A budget of splits
// bounds the cost of an even load, whose every second is alike.
func (r reader) peak(ctx context.Context, spans []span, budget int) Peak {
	h := spanHeap(append([]span(nil), spans...))
	heap.Init(&h)
	var best Peak
	for h.Len() > 0 {
		top := heap.Pop(&h).(span)
		if top.tasks == 0 || top.tasks <= best.Tasks {
			break
		}
		if top.width <= 1000 {
			best.FromMs, best.Tasks = top.from, top.tasks
			continue
		}
		if budget == 0 {
			// The seconds already counted still give the busiest known.
			for _, sp := range h {
				if sp.width <= 1000 && (sp.tasks > best.Tasks || (sp.tasks == best.Tasks && sp.tasks > 0 && sp.from < best.FromMs)) {
					best.FromMs, best.Tasks = sp.from, sp.tasks
				}
			}
			best.Bound = top.tasks
			return best
		}
		budget--
		parts := split(top.width / 1000)
		width := top.width / int64(parts)
		ask := make([]bool, len(r.shards))
		for s, c := range top.per {
			ask[s] = c > 0 // only the shards with tasks in it
		}
		counts, _, errs := r.count(ctx, ask, top.from, width, parts, false)
		for k := range parts {
			sp := span{from: top.from + int64(k)*width, width: width, per: make([]int64, len(r.shards))}
			for s := range r.shards {
				switch {
				case !ask[s]:
				case errs[s] != nil:
					// Unreadable now: it keeps its count over the whole
					// span, so the bound stays true.
					sp.per[s] = top.per[s]
				default:
					sp.per[s] = counts[s][k]
				}
				sp.tasks += sp.per[s]
			}
			heap.Push(&h, sp)
		}
	}
	best.Exact = true
	return best
}

// split is how many equal parts a span of secs seconds is cut into: each
// a second for a minute or less, else the fewest whole-second parts of at
// most a 60th of it each.
func split(secs int64) int {
	if secs <= 60 {
		return int(secs)
	}
	for d := (secs + 59) / 60; d < secs; d++ {
		if secs%d == 0 {
			return int(secs / d)
		}
	}
	return int(secs) // a prime number of seconds: each second
}
