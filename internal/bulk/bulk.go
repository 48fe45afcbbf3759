// Package bulk cancels or reschedules many pending tasks of a queue at
// once, selected by a glob on the body and a due-time range, with exactly
// the semantics of a single cancel or reschedule for each task: a task
// claimed meanwhile is not touched, and is reported.
//
// It walks each shard in (due time, body) order, a bounded batch per call,
// filters the batch here (glob.Match, Redis's MATCH), and changes the
// matching tasks with one script per batch that also records how far the
// run has got, so that an interrupted run resumes without doing anything
// twice. A reschedule walks away from where tasks move, so no task is met,
// and moved, twice.
package bulk

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/browse"
	"github.com/dispatcher/dispatcher/internal/glob"
	"github.com/dispatcher/dispatcher/shard"
)

// Mode is what a run does to each matching task.
type Mode string

const (
	Cancel Mode = "cancel" // remove it (ZREM), with its body and properties
	By     Mode = "by"     // shift its due time by Spec.ByMs
	At     Mode = "at"     // set its due time to Spec.AtMs
)

// Spec is what a run does, resolved to absolute values so that a resumed
// run does exactly what the first one started.
type Spec struct {
	Mode   Mode   `json:"mode"`
	Match  string `json:"match,omitempty"`   // glob on the member (task id, or body); "" matches all
	FromMs *int64 `json:"from_ms,omitempty"` // due at or after; nil: no bound
	ToMs   *int64 `json:"to_ms,omitempty"`   // due at or before; nil: no bound
	ByMs   int64  `json:"by_ms,omitempty"`
	AtMs   int64  `json:"at_ms,omitempty"`
	Shards int    `json:"shards"` // the queue's shard count when the run started
}

// Validate refuses a spec that would do nothing or move tasks twice, or
// whose glob Redis's MATCH reads differently on different platforms.
func (s Spec) Validate() error {
	switch s.Mode {
	case Cancel, At:
	case By:
		if s.ByMs == 0 {
			return errors.New("shift by 0 changes nothing")
		}
	default:
		return fmt.Errorf("mode %q: want cancel, by or at", s.Mode)
	}
	if err := glob.Check(s.Match); err != nil {
		return err
	}
	if s.FromMs != nil && s.ToMs != nil && *s.FromMs > *s.ToMs {
		return fmt.Errorf("from %d is after to %d: the range is empty", *s.FromMs, *s.ToMs)
	}
	if s.Shards < 1 || s.Shards > shard.MaxShards {
		return fmt.Errorf("shard count %d out of range 1..%d", s.Shards, shard.MaxShards)
	}
	return nil
}

// phase is one walk over a score range of every shard.
type phase struct {
	order browse.Order
	rg    browse.Range
}

// phases are the walks of a spec, each directed away from where its
// tasks move: a shift later walks down, a shift earlier up, so a moved
// task lands behind the cursor. A move to T walks up to just below T, then
// down to just above it; tasks already due at T are left as they are and
// not counted.
func (s Spec) phases() []phase {
	rg := browse.All
	if s.FromMs != nil {
		rg.Min = browse.Bound{Score: float64(*s.FromMs)}
	}
	if s.ToMs != nil {
		rg.Max = browse.Bound{Score: float64(*s.ToMs)}
	}
	switch {
	case s.Mode == By && s.ByMs > 0:
		return []phase{{browse.Desc, rg}}
	case s.Mode == At:
		t := browse.Bound{Score: float64(s.AtMs), Open: true}
		up := phase{browse.Asc, browse.Range{Min: rg.Min, Max: t}}
		down := phase{browse.Desc, browse.Range{Min: t, Max: rg.Max}}
		if s.ToMs != nil && *s.ToMs < s.AtMs {
			up.rg.Max = rg.Max
		}
		if s.FromMs != nil && *s.FromMs > s.AtMs {
			down.rg.Min = rg.Min
		}
		return []phase{up, down}
	}
	return []phase{{browse.Asc, rg}}
}

// DefaultTTL is how long a run's record and progress are kept after its
// last batch: the time there is to resume it, or to look at its totals.
const DefaultTTL = 7 * 24 * time.Hour

// NewID returns a fresh run id.
func NewID() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ValidID reports whether id can be a run id (what NewID returns).
func ValidID(id string) bool {
	if len(id) != 10 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// ErrNoRun: no run of that id is recorded for the queue (never started, or
// expired).
var ErrNoRun = errors.New("no such bulk run")

// Record stores a new run's spec under id, for Load; it fails if id is
// taken.
func Record(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, id string, s Spec, ttl time.Duration) error {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Errorf("encode bulk run %s: %w", id, err)
	}
	ok, err := rdb.SetNX(ctx, keys.BulkRun(id), b, ttl).Result()
	if err != nil {
		return fmt.Errorf("record bulk run %s at %s: %w", id, keys.BulkRun(id), err)
	}
	if !ok {
		return fmt.Errorf("record bulk run %s: %s exists already", id, keys.BulkRun(id))
	}
	return nil
}

// Load returns the spec of run id, and keeps it for another ttl.
func Load(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, id string, ttl time.Duration) (Spec, error) {
	var s Spec
	b, err := rdb.Get(ctx, keys.BulkRun(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return s, fmt.Errorf("%w %s on queue %s (nothing at %s: never started, or older than its TTL)", ErrNoRun, id, keys.Queue, keys.BulkRun(id))
	}
	if err != nil {
		return s, fmt.Errorf("read bulk run %s at %s: %w", id, keys.BulkRun(id), err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("bulk run %s at %s: %w", id, keys.BulkRun(id), err)
	}
	_ = rdb.PExpire(ctx, keys.BulkRun(id), ttl).Err() // a refresh only
	return s, nil
}

// Task is a pending task the walk met.
type Task struct {
	Shard  int    `json:"shard"`
	Member string `json:"body"`
	DueMs  int64  `json:"due_ms"`
}

// Result is what a run did, totals of all its invocations when resumed.
type Result struct {
	Matched int64 `json:"matched"` // tasks that matched the filters
	Changed int64 `json:"changed"` // cancelled or rescheduled
	// Skipped matched but were no longer pending with the due time read
	// when the batch was changed: claimed, cancelled or rescheduled
	// meanwhile; SkippedSample lists the first few (of this invocation).
	Skipped       int64    `json:"skipped"`
	SkippedSample []string `json:"skipped_sample,omitempty"`
	Sample        []Task   `json:"sample,omitempty"` // dry run: the first matching tasks
}

// Progress is reported after each batch.
type Progress struct {
	Shard, Shards int
	Walked        int64 // tasks read by this invocation
	Total         int64 // tasks in the range when it started (before the glob)
	Result
}

// ErrStopped: the run stopped before its end (Runner.StopAfter).
var ErrStopped = errors.New("bulk run stopped")

// ErrChanging: the queue's shard count is changing, or has changed since
// the run started; tasks move between shards meanwhile.
var ErrChanging = errors.New("the queue's shard count is changing")

// ErrBusy: another process is continuing the same run.
var ErrBusy = errors.New("another process is continuing this bulk run")

// Runner runs one bulk change (or, with DryRun, counts what it would
// change) on one queue.
type Runner struct {
	RDB    redis.UniversalClient
	Keys   shard.Keys
	ID     string // the run's id (Record); unused with DryRun
	Spec   Spec
	DryRun bool
	Batch  int           // tasks read per call; 0 means DefaultBatch
	TTL    time.Duration // of the progress; 0 means DefaultTTL
	// WakeWithin: a task rescheduled to be due sooner than this wakes the
	// dispatchers (shard.DefaultWakeWithin if 0).
	WakeWithin time.Duration
	Progress   func(Progress) // after each batch, if set
	StopAfter  int            // stop with ErrStopped after so many batches (tests); 0: no limit
	Now        func() time.Time
	// beforeAct, if set, runs between a batch's read and its change
	// (tests: a claim in between).
	beforeAct func(shard int, matched []string)
}

// DefaultBatch is how many tasks one call reads and changes: each call
// stays around a ms, however large the shard.
const DefaultBatch = 200

// MaxBatch bounds Batch.
const MaxBatch = 1000

// progressOf is one shard's recorded progress.
type progressOf struct {
	seq    int64
	phase  int
	score  string
	member string
	done   bool
	Result
}

func (r *Runner) load(ctx context.Context, i int) (progressOf, error) {
	var p progressOf
	if r.DryRun {
		return p, nil
	}
	key := r.Keys.BulkProgress(i, r.ID)
	h, err := r.RDB.HGetAll(ctx, key).Result()
	if err != nil {
		return p, fmt.Errorf("read the progress of bulk run %s at %s: %w", r.ID, key, err)
	}
	num := func(f string) int64 { n, _ := strconv.ParseInt(h[f], 10, 64); return n }
	p.seq, p.phase = num("seq"), int(num("phase"))
	p.score, p.member, p.done = h["score"], h["member"], h["done"] == "1"
	p.Matched, p.Changed, p.Skipped = num("matched"), num("changed"), num("skipped")
	return p, nil
}

// Run walks every shard and returns the totals. On an error or ctx's end
// the progress made so far is recorded, and a Runner with the same ID
// continues from there.
func (r *Runner) Run(ctx context.Context) (Result, error) {
	var res Result
	if err := r.Spec.Validate(); err != nil {
		return res, err
	}
	if r.Batch <= 0 {
		r.Batch = DefaultBatch
	}
	r.Batch = min(r.Batch, MaxBatch)
	if r.TTL <= 0 {
		r.TTL = DefaultTTL
	}
	if r.WakeWithin == 0 {
		r.WakeWithin = shard.DefaultWakeWithin
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	var matcher func(string) bool
	if r.Spec.Match != "" {
		pat := r.Spec.Match
		matcher = func(s string) bool { return glob.Match(pat, s) }
	}
	phases := r.Spec.phases()
	prog := Progress{Shards: r.Spec.Shards}
	if r.Progress != nil {
		total, err := r.count(ctx, phases)
		if err != nil {
			return res, err
		}
		prog.Total = total
	}
	if err := r.keepProgress(ctx); err != nil {
		return res, err
	}
	batches := 0
	for i := 0; i < r.Spec.Shards; i++ {
		p, err := r.load(ctx, i)
		if err != nil {
			return res, err
		}
		res.Matched += p.Matched
		res.Changed += p.Changed
		res.Skipped += p.Skipped
		prog.Shard = i
		for !p.done {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			if r.StopAfter > 0 && batches >= r.StopAfter {
				return res, ErrStopped
			}
			// Before every batch: a change of the shard count that began
			// during the last one could have moved a task this run changed
			// already into the rest of this shard's walk.
			if err := r.checkLayout(ctx); err != nil {
				return res, err
			}
			batches++
			ph := phases[p.phase]
			var after *browse.Pos
			if p.score != "" {
				due, err := strconv.ParseFloat(p.score, 64)
				if err != nil {
					return res, fmt.Errorf("bulk run %s: the progress on %s has due %q: %w", r.ID, r.Keys.Pending(i), p.score, err)
				}
				after = &browse.Pos{Score: due, Member: p.member}
			}
			zs, full, err := browse.Read(ctx, r.RDB, r.Keys.Pending(i), ph.rg, ph.order, after, r.Batch)
			if err != nil {
				return res, fmt.Errorf("read a batch of %s from due %q: %w", r.Keys.Pending(i), p.score, err)
			}
			got := make([]string, 0, 2*len(zs)) // member, score read, ...
			for _, z := range zs {
				m, _ := z.Member.(string)
				got = append(got, m, browse.FormatScore(z.Score))
			}
			next := p
			if n := len(got); full {
				next.member, next.score = got[n-2], got[n-1]
			} else { // the phase is walked
				next.phase, next.score, next.member = p.phase+1, "", ""
				next.done = next.phase == len(phases)
			}
			var matched []string // member, score read, ...
			for k := 0; k+1 < len(got); k += 2 {
				if matcher == nil || matcher(got[k]) {
					matched = append(matched, got[k], got[k+1])
				}
			}
			prog.Walked += int64(len(got) / 2)
			res.Matched += int64(len(matched) / 2)
			if r.DryRun {
				for k := 0; k < len(matched) && len(res.Sample) < 10; k += 2 {
					due, _ := strconv.ParseInt(matched[k+1], 10, 64)
					res.Sample = append(res.Sample, Task{Shard: i, Member: matched[k], DueMs: due})
				}
			} else {
				if r.beforeAct != nil {
					r.beforeAct(i, matched)
				}
				next, err = r.act(ctx, i, p, next, matched, &res)
				if err != nil {
					return res, err
				}
			}
			p = next
			if r.Progress != nil {
				prog.Result = res
				r.Progress(prog)
			}
		}
	}
	return res, nil
}

// act changes one batch of shard i and records the progress next.
func (r *Runner) act(ctx context.Context, i int, p, next progressOf, matched []string, res *Result) (progressOf, error) {
	done := "0"
	if next.done {
		done = "1"
	}
	ms := r.Spec.ByMs
	if r.Spec.Mode == At {
		ms = r.Spec.AtMs
	}
	args := make([]any, 0, 8+len(matched))
	args = append(args, string(r.Spec.Mode), ms, p.seq, r.TTL.Milliseconds(), next.phase, next.score, next.member, done)
	for _, m := range matched {
		args = append(args, m)
	}
	keys := []string{r.Keys.Pending(i), r.Keys.Moving(i), r.Keys.BulkProgress(i, r.ID), r.Keys.Tasks(i), r.Keys.Props(i)}
	out, err := actScript.Run(ctx, r.RDB, keys, args...).Slice()
	if err != nil {
		return p, fmt.Errorf("%s a batch of %d tasks on %s: %w", r.Spec.Mode, len(matched)/2, keys[0], err)
	}
	if n, _ := out[0].(int64); n < 0 {
		return p, fmt.Errorf("%w: run %s on %s", ErrBusy, r.ID, keys[0])
	}
	changed, _ := out[0].(int64)
	skipped, _ := out[1].(int64)
	earliest, _ := strconv.ParseInt(fmt.Sprint(out[2]), 10, 64)
	res.Changed += changed
	res.Skipped += skipped
	for _, m := range out[3:] {
		if len(res.SkippedSample) < 10 {
			res.SkippedSample = append(res.SkippedSample, fmt.Sprint(m))
		}
	}
	// A task now due soon wakes the instances, as shard.Producer does, once
	// its batch has run (the reply is in): it goes out promptly.
	if r.Spec.Mode != Cancel && earliest >= 0 && earliest <= r.Now().Add(r.WakeWithin).UnixMilli() {
		_ = r.RDB.Publish(ctx, r.Keys.Wake(), shard.WakeDue(i, earliest)).Err() // a hint only
	}
	next.seq = p.seq + 1
	return next, nil
}

// keepProgress gives every shard's progress of the run the TTL again, as
// Load gives the run's record: a shard finished in an earlier invocation
// must not lose its progress while the record lives on, or a resume would
// walk it again and shift its tasks twice.
func (r *Runner) keepProgress(ctx context.Context) error {
	if r.ID == "" {
		return nil
	}
	pipe := r.RDB.Pipeline()
	for i := 0; i < r.Spec.Shards; i++ {
		pipe.PExpire(ctx, r.Keys.BulkProgress(i, r.ID), r.TTL)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("bulk run %s: keep its progress for %s: %w", r.ID, r.TTL, err)
	}
	return nil
}

// checkLayout refuses to go on while the queue's shard count changes, or
// if it is not the one the run started with: tasks move between shards
// then, and a walk of one shard would miss them or meet them twice.
func (r *Runner) checkLayout(ctx context.Context) error {
	l, err := shard.ReadLayout(ctx, r.RDB, r.Keys)
	if errors.Is(err, shard.ErrNoLayout) {
		return nil // nothing recorded: the count given is the one producers use
	}
	if err != nil {
		return err
	}
	if l.Changing() {
		return fmt.Errorf("%w (%s): finish it first (dispatcher reshard finish --queue %s)", ErrChanging, l, r.Keys.Queue)
	}
	if l.Shards != r.Spec.Shards {
		return fmt.Errorf("%w: %d when the run started, %d now: start a new run", ErrChanging, r.Spec.Shards, l.Shards)
	}
	return nil
}

// count is how many tasks the phases' ranges hold, for the progress bar:
// one ZCOUNT per shard and phase, O(log N) each.
func (r *Runner) count(ctx context.Context, phases []phase) (int64, error) {
	pipe := r.RDB.Pipeline()
	var cmds []*redis.IntCmd
	for i := 0; i < r.Spec.Shards; i++ {
		for _, ph := range phases {
			cmds = append(cmds, pipe.ZCount(ctx, r.Keys.Pending(i), ph.rg.Min.String(), ph.rg.Max.String()))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("count the tasks in range on queue %s: %w", r.Keys.Queue, err)
	}
	var n int64
	for _, c := range cmds {
		n += c.Val()
	}
	return n, nil
}
