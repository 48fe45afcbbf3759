package recurring

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/coalesce"
	"github.com/dispatcher/dispatcher/shard"
)

// Options configure a Materialiser.
type Options struct {
	Keys shard.Keys
	// Sweeping reports whether this instance is the queue's sweeper: only
	// the sweeper materialises, so the cost does not grow with instances
	// (correctness does not depend on it: every step is a compare-and-set).
	Sweeping func() bool
	// Layout is the queue's layout as this instance serves it.
	Layout  func() shard.Layout
	Logger  *slog.Logger
	Metrics *Metrics
	// RevPoll is how often the sweeper reads the revision counter to
	// notice changed definitions (default 1s): the only Redis command
	// while nothing is due.
	RevPoll time.Duration
	// Coalescer, if set (one Redis, not a cluster), carries the revision
	// reads: read on the RevPoll grid, every queue's go in one round trip.
	Coalescer *coalesce.Coalescer
	// RevWatch, if set (one Redis, not a cluster), reads the revision
	// counter in place of the materialiser, with every other queue's,
	// and wakes it when the counter changed; the materialiser reads it
	// itself once a minute besides (a counter of the wrong type is then
	// reported). RevPoll is then the RevWatch's.
	RevWatch *RevWatch
	// WakeWithin: an occurrence materialised due sooner than this wakes the
	// queue's sweep at once (default 1s, as the Go producer).
	WakeWithin time.Duration
}

// Materialiser turns one queue's schedules into pending tasks while this
// instance sweeps the queue.
type Materialiser struct {
	rdb     redis.UniversalClient
	opt     Options
	store   *Store
	log     *slog.Logger
	entries map[string]*entry
	rev     int64        // revision the entries were read at; -1: read them
	active  bool         // materialising: this instance sweeps the queue
	raced   atomic.Int64 // steps another instance's step overtook (tests)
}

// entry is one schedule as the materialiser keeps it.
type entry struct {
	def    Def
	sched  *Schedule // nil if the definition is invalid
	bad    error
	home   int       // shard the state was last seen in, -1 if unknown
	wakeAt time.Time // local clock: when to look at it next; zero: never
	busy   time.Duration
	status Status
	logged string // the last error logged, so each is logged once
}

// New returns a materialiser of opt.Keys' queue.
func New(rdb redis.UniversalClient, opt Options) *Materialiser {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.RevPoll <= 0 {
		opt.RevPoll = time.Second
	}
	if opt.WakeWithin == 0 {
		opt.WakeWithin = time.Second
	}
	return &Materialiser{rdb: rdb, opt: opt, store: NewStore(rdb, opt.Keys),
		log: opt.Logger.With("queue", opt.Keys.Queue), entries: map[string]*entry{}, rev: -1}
}

// idleCheck is how often a non-sweeping instance looks whether it became
// the sweeper (no Redis command: the role is known locally).
const idleCheck = 250 * time.Millisecond

// revFallback is how often a materialiser watched by a RevWatch reads its
// revision counter itself.
const revFallback = time.Minute

// Run materialises until ctx ends.
func (m *Materialiser) Run(ctx context.Context) error {
	var nextRev time.Time
	var sub *revSub // the RevWatch's watch while sweeping
	defer func() {
		if sub != nil {
			m.opt.RevWatch.unwatch(sub)
		}
	}()
	errDelay, lastErr := time.Duration(0), ""
	for {
		if !m.opt.Sweeping() {
			if sub != nil {
				m.opt.RevWatch.unwatch(sub)
				sub = nil
			}
			if m.active {
				m.entries, m.rev, m.active = map[string]*entry{}, -1, false
				m.opt.Metrics.forgetQueue(m.opt.Keys.Queue)
			}
			if !sleep(ctx, idleCheck) {
				return nil
			}
			continue
		}
		if sub == nil && m.opt.RevWatch != nil {
			sub = m.opt.RevWatch.watch(m.opt.Keys.RecurringRev())
			nextRev = time.Time{} // just became the sweeper: read at once
		}
		now := time.Now()
		told := false
		if sub != nil {
			select {
			case <-sub.ch:
				told = true
			default:
			}
		}
		if told || !now.Before(nextRev) {
			if sub != nil {
				nextRev = now.Add(revFallback)
			} else {
				// On the grid: every queue's read falls due at once.
				nextRev = now.Truncate(m.opt.RevPoll).Add(m.opt.RevPoll)
			}
			if err := m.refresh(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				errDelay = min(max(2*errDelay, 100*time.Millisecond), 5*time.Second)
				if err.Error() != lastErr { // once per kind: Redis may refuse for minutes
					lastErr = err.Error()
					m.log.Warn("cannot read the recurring schedules; trying again", "err", err, "every", "5s")
				}
				if sub != nil {
					nextRev = time.Time{} // the RevWatch tells only of changes: try again
				}
				if !sleep(ctx, errDelay) {
					return nil
				}
				continue
			}
			errDelay, lastErr = 0, ""
		}
		for _, e := range m.entries {
			if ctx.Err() != nil {
				return nil
			}
			if !e.wakeAt.IsZero() && !time.Now().Before(e.wakeAt) {
				m.step(ctx, e)
			}
		}
		// With schedules, the role is looked at every idleCheck, so that
		// one lost stops materialising soon; without, a queue's
		// materialiser wakes only for the revision (a thousand queues'
		// wake-ups four times a second cost an idle instance CPU).
		wait := time.Until(nextRev)
		if len(m.entries) > 0 {
			wait = min(wait, idleCheck)
		}
		for _, e := range m.entries {
			if !e.wakeAt.IsZero() {
				wait = min(wait, time.Until(e.wakeAt))
			}
		}
		var wake <-chan struct{}
		if sub != nil {
			wake = sub.ch
		}
		if !sleepOr(ctx, max(wait, time.Millisecond), wake, sub) {
			return nil
		}
	}
}

// sleepOr sleeps as sleep does, or until the RevWatch tells sub of a
// change, which it then leaves for the loop to take.
func sleepOr(ctx context.Context, d time.Duration, wake <-chan struct{}, sub *revSub) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-wake:
		sub.tell()
	}
	return true
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// refresh reads the definitions again if the revision changed (one GET
// otherwise).
func (m *Materialiser) refresh(ctx context.Context) error {
	rev, err := m.store.Rev(ctx, m.opt.Coalescer)
	if err != nil {
		return err
	}
	if rev == m.rev {
		return nil
	}
	defs, bad, err := m.store.Defs(ctx)
	if err != nil {
		return err
	}
	sts, err := m.store.Statuses(ctx)
	if err != nil {
		return err
	}
	if !m.active && len(defs)+len(bad) > 0 {
		m.active = true
		m.log.Info("materialising the queue's recurring schedules (this instance sweeps it)", "schedules", len(defs)+len(bad))
	}
	seen := map[string]bool{}
	for _, d := range defs {
		seen[d.Name] = true
		if e, ok := m.entries[d.Name]; ok && e.def == d {
			continue // unchanged: keep its timer
		}
		e := &entry{def: d, home: -1, wakeAt: time.Now()}
		if st, ok := sts[d.Name]; ok {
			e.home, e.status = st.Home, st
		}
		e.sched, e.bad = Parse(d)
		m.entries[d.Name] = e
	}
	for name, err := range bad {
		seen[name] = true
		e := &entry{def: Def{Queue: m.opt.Keys.Queue, Name: name}, home: -1, bad: err, wakeAt: time.Now()}
		m.entries[name] = e
	}
	for name := range m.entries {
		if !seen[name] {
			delete(m.entries, name)
			m.opt.Metrics.forget(m.opt.Keys.Queue, name)
		}
	}
	for name := range sts {
		if !seen[name] { // a removed schedule's status a late write brought back
			_ = m.rdb.HDel(ctx, m.opt.Keys.RecurringStatus(), name).Err()
		}
	}
	m.rev = rev
	return nil
}

// read is what one step reads in one round trip.
type read struct {
	now    time.Time // Redis clock
	off    time.Duration
	states map[int]string // shard -> state field ("" absent)
	scores map[int]int64  // shard -> the body's pending score, if pending
}

func (m *Materialiser) read(ctx context.Context, e *entry, cands []int) (read, error) {
	pipe := m.rdb.Pipeline()
	before := time.Now()
	tm := pipe.Time(ctx)
	hs := map[int]*redis.StringCmd{}
	zs := map[int]*redis.FloatCmd{}
	body := e.def.Body
	for _, i := range cands {
		hs[i] = pipe.HGet(ctx, m.opt.Keys.RecurringState(i), e.def.Name)
		zs[i] = pipe.ZScore(ctx, m.opt.Keys.Pending(i), body)
	}
	_, _ = pipe.Exec(ctx)
	r := read{states: map[int]string{}, scores: map[int]int64{}}
	now, err := tm.Result()
	if err != nil {
		return r, fmt.Errorf("read the Redis clock: %w", err)
	}
	r.now = now
	r.off = now.Sub(before)
	for _, i := range cands {
		v, err := hs[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return r, fmt.Errorf("read %s: %w", m.opt.Keys.RecurringState(i), err)
		}
		r.states[i] = v
		s, err := zs[i].Result()
		if err == nil {
			r.scores[i] = int64(s)
		} else if !errors.Is(err, redis.Nil) {
			return r, fmt.Errorf("read %s: %w", m.opt.Keys.Pending(i), err)
		}
	}
	return r, nil
}

// local converts a Redis-clock time to this instance's clock.
func (r read) local(t time.Time) time.Time { return t.Add(-r.off) }

// step looks at one schedule: it moves its state where the layout wants
// it, retires a state of an older definition, or materialises the next
// occurrence once the one before has left pending.
func (m *Materialiser) step(ctx context.Context, e *entry) {
	e.wakeAt = time.Time{}
	q, name := m.opt.Keys.Queue, e.def.Name
	if e.bad != nil {
		m.fail(ctx, e, e.bad.Error(), time.Time{})
		return
	}
	body := []byte(e.def.Body)
	l := m.opt.Layout()
	t := shard.Index(body, l.Shards)
	cands := candidates(body, l, e.home)
	r, err := m.read(ctx, e, cands)
	if err != nil {
		if ctx.Err() == nil { // stopping: nothing to report
			m.redisError(e, err)
		}
		return
	}
	rev := e.def.Rev
	states := map[int]state{}
	liveAt := -1
	for _, i := range cands {
		v := r.states[i]
		if v == "" {
			continue
		}
		st, ok := parseState(v)
		if !ok {
			m.fail(ctx, e, fmt.Sprintf("state %q at %s is not <rev>:<ms>:<flag>", v, m.opt.Keys.RecurringState(i)), time.Time{})
			return
		}
		if st.rev > rev {
			m.rev = -1 // our definition is older than the state: read them again
			e.wakeAt = time.Now().Add(m.opt.RevPoll)
			return
		}
		states[i] = st
		if st.flag == live && (liveAt == -1 || i == t) {
			liveAt = i
		}
	}

	// A change of the shard count moved the body's shard: move the state
	// there, freezing the old one first so that no instance still serving
	// the old count materialises there meanwhile (a frozen state is never
	// live again but by a seed, which takes the larger cursor).
	if liveAt != -1 && liveAt != t {
		src := states[liveAt]
		seed := state{rev: src.rev, cursor: src.cursor}
		if dst, ok := states[t]; ok && dst.cursor > seed.cursor {
			seed.cursor = dst.cursor
		}
		frozenSt := src
		frozenSt.flag = frozen
		if ok := m.run(ctx, e, liveAt, r.states[liveAt], frozenSt.String(), ""); ok != 1 {
			e.wakeAt = time.Now().Add(10 * time.Millisecond)
			return
		}
		if ok := m.run(ctx, e, t, r.states[t], seed.String(), ""); ok != 1 {
			e.wakeAt = time.Now().Add(10 * time.Millisecond)
			return
		}
		m.log.Info("recurring schedule's state moved to its shard by the new shard count", "schedule", name, "from_shard", liveAt, "to_shard", t)
		e.home = t
		e.wakeAt = time.Now()
		return
	}
	st, has := states[t]

	// An older definition's live state: cancel its occurrence if still
	// pending, keep the floor.
	if has && st.flag == live && st.rev < rev {
		if _, err := retire(ctx, m.rdb, m.opt.Keys, t, name, body, rev); err != nil {
			m.redisError(e, err)
			return
		}
		e.wakeAt = time.Now()
		return
	}
	if e.def.Paused {
		e.status = Status{Home: e.home, Rev: rev, LastMs: e.status.LastMs, AtMs: r.now.UnixMilli()}
		m.report(ctx, e)
		return // until the definition changes
	}
	now := r.now
	var next time.Time
	var caught catchUp // what the catch-up policy skipped, if anything
	expect := r.states[t]
	lastMs := e.status.LastMs
	if has && st.flag == live && st.rev == rev {
		// Steady: the occurrence at cursor must have left pending, in its
		// shard and (during a change) in the other.
		if busy, at := pendingAt(r.scores); busy {
			e.status.NextMs = at
			if at != st.cursor {
				m.fail(ctx, e, fmt.Sprintf("a task with the same body is pending at %s: the next occurrence waits until it leaves pending (give recurring bodies an id no one-off task has)",
					ms(at).UTC().Format(time.RFC3339Nano)), r.local(ms(max(at, now.UnixMilli()))).Add(m.backoff(e)))
				return
			}
			// Not claimed yet: look again at its due time (it is claimed up
			// to the look-ahead before), then back off while the queue is
			// late or paused.
			if ms(at).After(now) {
				e.busy = 0
				e.wakeAt = r.local(ms(at)).Add(5 * time.Millisecond)
				return
			}
			// Late, but not past the next occurrence's due time while that
			// is ahead (so a short stall does not make it late too).
			d := m.backoff(e)
			if until := e.sched.NextAfter(ms(st.cursor)).Sub(now) - 50*time.Millisecond; until > 20*time.Millisecond && until < d {
				d = until
			}
			e.wakeAt = time.Now().Add(d)
			return
		}
		lastMs = st.cursor
		caught = e.sched.following(ms(st.cursor), now)
		next = caught.at
	} else {
		if has && st.flag == frozen && st.rev == rev {
			// The state was moved away from the body's shard by this
			// instance's layout: an instance on a newer shard count moved
			// it. Starting afresh here would revive it beside the moved
			// one, and an occurrence would go out twice; wait for this
			// instance's layout to catch up (LayoutPoll) instead.
			e.wakeAt = time.Now().Add(time.Second)
			return
		}
		// A fresh start: a new schedule, or one whose definition changed,
		// resumed, or whose state was retired. It must stay after every
		// occurrence a state here says was delivered.
		floor := int64(0)
		for _, s := range states {
			floor = max(floor, s.cursor)
		}
		if busy, at := pendingAt(r.scores); busy {
			m.fail(ctx, e, fmt.Sprintf("a task with the same body is pending at %s: the schedule starts once it leaves pending (give recurring bodies an id no one-off task has)",
				ms(at).UTC().Format(time.RFC3339Nano)), time.Now().Add(m.backoff(e)))
			return
		}
		next = e.sched.NextAfter(maxTime(now, ms(floor)))
	}
	e.busy = 0
	if next.IsZero() {
		m.fail(ctx, e, "the cron expression has no further occurrence", time.Time{})
		return
	}
	nst := state{rev: rev, cursor: next.UnixMilli()}
	switch m.run(ctx, e, t, expect, nst.String(), fmt.Sprint(next.UnixMilli())) {
	case 1:
	case 2:
		e.wakeAt = time.Now().Add(m.backoff(e))
		return
	default:
		m.raced.Add(1)
		e.wakeAt = time.Now().Add(10 * time.Millisecond)
		return
	}
	m.opt.Metrics.materialised(q, caught.skipped)
	m.logCatchUp(name, e.sched.CatchUp, caught)
	if next.Sub(now) < m.opt.WakeWithin {
		_ = m.rdb.Publish(ctx, m.opt.Keys.Wake(), shard.WakeDue(t, next.UnixMilli())).Err() // a hint: the sweep finds it anyway
	}
	e.home = t
	e.status = Status{Home: t, Rev: rev, LastMs: lastMs, NextMs: next.UnixMilli(), AtMs: now.UnixMilli()}
	e.logged = ""
	m.report(ctx, e)
	// Look again when it is due: by then it has been claimed.
	e.wakeAt = r.local(next).Add(5 * time.Millisecond)
}

// logCatchUp says what the catch-up policy skipped after an outage, and if
// it could not find the occurrence to fire.
func (m *Materialiser) logCatchUp(name, policy string, c catchUp) {
	if c.skipped == 0 && !c.lost {
		return
	}
	count := "skipped"
	if c.floor { // a cron expression's count stops at countLimit
		count = "skipped_at_least"
	}
	attrs := []any{"schedule", name, count, c.skipped, "catchup", policy, "firing", c.at.UTC().Format(time.RFC3339)}
	if c.lost {
		m.log.Warn("recurring schedule missed occurrences while no instance materialised it, and the one its catch-up policy fires could not be found; going on with the first occurrence after now", attrs...)
		return
	}
	m.log.Warn("recurring schedule missed occurrences while no instance materialised it", attrs...)
}

// pendingAt reports whether the body is pending in any of the shards,
// and the earliest score.
func pendingAt(scores map[int]int64) (bool, int64) {
	found, at := false, int64(0)
	for _, s := range scores {
		if !found || s < at {
			found, at = true, s
		}
	}
	return found, at
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// backoff is how long to wait before looking again at a schedule whose
// occurrence is overdue but still pending (the queue is paused or late):
// 20 ms doubling to 5 s, so that a paused queue's schedules cost a read
// each per 5 s.
func (m *Materialiser) backoff(e *entry) time.Duration {
	e.busy = min(max(2*e.busy, 20*time.Millisecond), 5*time.Second)
	return e.busy
}

// run runs stepScript on shard i; it returns 1 done, 0 raced, 2 busy, -1
// error (reported).
func (m *Materialiser) run(ctx context.Context, e *entry, i int, expect, next, due string) int64 {
	keys := []string{m.opt.Keys.Pending(i), m.opt.Keys.RecurringState(i), m.opt.Keys.Tasks(i), m.opt.Keys.Props(i)}
	var props []byte
	if e.sched != nil {
		props = e.sched.Props()
	}
	res, err := stepScript.Run(ctx, m.rdb, keys, e.def.Name, e.def.Body, expect, next, due, props).Slice()
	if err != nil {
		if ctx.Err() == nil {
			m.redisError(e, fmt.Errorf("materialise on %s: %w", keys[0], err))
		}
		return -1
	}
	return res[0].(int64)
}

// redisError records a failed Redis call and looks again in a second.
func (m *Materialiser) redisError(e *entry, err error) {
	e.wakeAt = time.Now().Add(time.Second)
	if msg := err.Error(); msg != e.logged {
		e.logged = msg
		m.log.Warn("recurring schedule: Redis failed; trying again", "schedule", e.def.Name, "err", err)
	}
}

// fail records why a schedule cannot be materialised: logged once per
// reason at error level, in its status and metrics. It looks again at
// retry (never if zero: until the definition changes).
func (m *Materialiser) fail(ctx context.Context, e *entry, why string, retry time.Time) {
	e.wakeAt = retry
	if why != e.logged {
		e.logged = why
		m.log.Error("recurring schedule cannot be materialised", "schedule", m.opt.Keys.Queue+"/"+e.def.Name, "err", why)
	}
	if e.status.Error == why {
		return
	}
	e.status.Error = why
	e.status.Home, e.status.Rev = e.home, e.def.Rev
	m.report(ctx, e)
}

// report writes the schedule's status (for `recurring list`, the status
// page) and its metrics.
func (m *Materialiser) report(ctx context.Context, e *entry) {
	m.opt.Metrics.show(m.opt.Keys.Queue, e.def.Name, e.status, e.def.Paused)
	b, _ := json.Marshal(e.status)
	_ = m.rdb.HSet(ctx, m.opt.Keys.RecurringStatus(), e.def.Name, b).Err() // for display only: the state is the truth
}
