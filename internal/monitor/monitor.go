// Package monitor keeps the state of the queues an instance sweeps: it
// reads them from Redis (queuestate) every interval, exports the figures
// as gauges, and watches for stalls, when a due task has waited longer
// than the stall threshold. Only the sweeping instance of a queue reads
// and exports it, so the Redis cost does not grow with instances and
// max by (queue) aggregates them in PromQL.
package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/forecast"
	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/shard"
)

// Options configure a Monitor.
type Options struct {
	Queues    []queuestate.Target
	KeyPrefix string
	// Interval is how often the swept queues are read.
	Interval time.Duration
	// StallAfter is how long the oldest due task may wait before the queue
	// counts as stalled.
	StallAfter time.Duration
	// Sweeping reports whether this instance sweeps the queue now.
	Sweeping func(queue string) bool
	// Dozing, if set, reports whether the queue dozes now (empty, its
	// pending and in-flight sets looked at every IDLE_POLL_INTERVAL by
	// the instance's idle watch, which wakes it when any appears), and
	// how many times it has woken from a doze. Its quiet reads stretch
	// to dozingReads intervals, and it is read at the first tick after
	// it woke, even if it dozes again by then.
	Dozing func(queue string) (dozing bool, wakes uint64)
	// Waiting says what this instance sees holding the queue up (the
	// broker, Redis, its publishes), for the stall report.
	Waiting func(queue string) []string
	// Layout, if set, is the queue's layout now, whose shards are read
	// (it changes with `dispatcher reshard`); else Queues' shard count.
	Layout func(queue string) shard.Layout
	// DrainRate, if set, is the rate (tasks/s) a queue is taken to drain
	// at for the herd warning, and the setting it comes from; else 1000.
	DrainRate func(queue string) (rate float64, from string)
	// ForecastEvery is how often a swept queue's next minute is counted
	// (0: every 10 s).
	ForecastEvery time.Duration
	Registerer    prometheus.Registerer
	Logger        *slog.Logger
}

// historyLen is how many samples of each queue are kept for the status
// page: 5 minutes at the default interval.
const historyLen = 300

// Sample is one reading of a queue, for the status page's picture.
type Sample struct {
	At      time.Time
	Age     time.Duration
	Due     int64
	Pending int64
}

// View is what an instance knows of one queue.
type View struct {
	State   queuestate.Queue
	ReadAt  time.Time // local clock; zero if never read
	Err     string    // why the last read failed, "" if it did not
	Swept   bool      // this instance sweeps it (and exports its gauges)
	History []Sample  // oldest first
	// StalledSince is when the oldest due task passed StallAfter; zero
	// while the queue is not stalled.
	StalledSince time.Time
	// Stalled: watched here and stalled, or swept by another instance and
	// past the same threshold (not paused).
	Stalled bool
	Waiting []string
	// Ahead is the next minute of a swept queue, counted every
	// ForecastEvery.
	Ahead Ahead
	// Forecast is the hour ahead by the minute, read for the status page
	// (at most every pageForecastEvery); nil if never read. ForecastErr
	// says why the last read failed.
	Forecast    *forecast.Forecast
	ForecastErr string
	// Drain, DrainFrom and HerdLimit: the queue's drain rate for the herd
	// warning, its setting, and the most tasks one second may hold
	// without a warning.
	Drain     float64
	DrainFrom string
	HerdLimit int64
}

type queueView struct {
	View
	target  queuestate.Target
	lastLog time.Time
	// Each shard's figures at its last good read, and the Redis clock
	// minus the local one then: a shard that cannot be read shows these,
	// with its oldest due age going on growing, so that a primary that
	// went down (or a key overwritten) does not make a late queue look on
	// time.
	lastGood []queuestate.Shard
	offset   time.Duration
	every    time.Duration // current read interval, Interval..quietMax
	next     time.Time     // next read while swept
	dozing   bool          // the queue dozed at the last tick (Options.Dozing)
	wakes    uint64        // and had woken so many times
	// nextAhead is the next count of the minute ahead; herdAt the second
	// of the herd last warned of, 0 if none is coming; forecastAt when
	// the page's hour ahead was read.
	nextAhead  time.Time
	herdAt     int64
	forecastAt time.Time
	// undated is, per shard, the first task with no real due time a read
	// found and when: its lateness counts from then (see undatedAges).
	undated []undatedSeen
	// farWarned is when tasks scored after year 5138 were last warned of.
	farWarned time.Time
	// pauseKnown: a read while swept found how many shards were paused,
	// pausedWas; the next one that finds otherwise logs the change.
	pauseKnown bool
	pausedWas  int
}

// undatedSeen is the first undated task of a shard and when it was first
// seen there.
type undatedSeen struct {
	task  queuestate.Scored
	since time.Time
}

// quietReads is how far the reads of a quiet queue stretch out: each read
// that finds the same figures as the last, and nothing due, doubles the
// interval up to quietReads × Interval; any change brings it back. A
// queue nobody uses then costs Redis little, while one in use, and any
// with a due task (the watchdog's concern), is read every Interval.
const quietReads = 8

// dozingReads is quietReads for a queue that dozes. Its pending and
// in-flight sets are already looked at every IDLE_POLL_INTERVAL (a task
// wakes it, and a woken queue is read at the next tick), so its reads only
// keep the rest fresh: dead letters an operator purged, and a watch on the
// doze itself. A thousand idle queues' reads every 8 s were a fifth of an
// idle instance's CPU in its profile, and of its Redis commands.
const dozingReads = 30

// Monitor reads and watches the queues. Run it once.
type Monitor struct {
	rdb    redis.UniversalClient
	opt    Options
	log    *slog.Logger
	gauges []*prometheus.GaugeVec
	// the gauges, by what they show
	pending, due, inflight, expired, dead, age, broken, stalled, paused, retried, retriedAge *prometheus.GaugeVec
	dueNextMinute, peakSecond, herd                                                          *prometheus.GaugeVec

	reading     chan struct{} // one read at a time; a page load gives up waiting with its context
	forecasting chan struct{} // one read of the page's forecasts at a time
	mu          sync.Mutex
	queues      []*queueView
	byName      map[string]*queueView // the queues, by name: Paused is asked once per queue
	lastFailLog time.Time
}

// New returns a Monitor of opt.Queues and registers its gauges.
func New(rdb redis.UniversalClient, opt Options) *Monitor {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	m := &Monitor{rdb: rdb, opt: opt, log: opt.Logger, reading: make(chan struct{}, 1), forecasting: make(chan struct{}, 1)}
	gauge := func(name, help string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help + " Exported by the queue's sweeping instance only: aggregate with max by (queue)."}, []string{"queue"})
		m.gauges = append(m.gauges, g)
		if opt.Registerer != nil {
			opt.Registerer.MustRegister(g)
		}
		return g
	}
	m.pending = gauge("dispatcher_queue_pending_tasks", "Tasks scheduled in Redis and not yet claimed, due or not.")
	m.due = gauge("dispatcher_queue_due_tasks", "Pending tasks whose due time has come (by the Redis clock).")
	m.inflight = gauge("dispatcher_queue_inflight_tasks", "Tasks claimed and not yet confirmed by the broker (retries waiting for their backoff included).")
	m.expired = gauge("dispatcher_queue_expired_leases", "In-flight tasks whose lease or retry backoff ran out, waiting for the next claim to hand them out again.")
	m.dead = gauge("dispatcher_queue_dead_tasks", "Tasks in the queue's dead-letter sets.")
	m.age = gauge("dispatcher_queue_oldest_due_age_seconds", "How long the earliest task that is due and not yet delivered (pending, or retried after a failed publish) has been due: now minus its due time, 0 when none is due.")
	m.retried = gauge("dispatcher_queue_retried_tasks", "In-flight tasks with a failed publish (nack, unroutable, no confirm, refused) recorded, waiting out their backoff or being published again.")
	m.retriedAge = gauge("dispatcher_queue_oldest_retried_age_seconds", "How long the earliest retried task has been due: now minus its due time, 0 when none is retried.")
	m.broken = gauge("dispatcher_queue_broken_shards", "Shards whose keys could not be read (a key of the wrong type, an unreachable primary).")
	m.stalled = gauge("dispatcher_queue_stalled", "1 while the oldest due task, pending or retried, has waited longer than DISPATCHER_STALL_AFTER (a paused queue does not count as stalled).")
	m.paused = gauge("dispatcher_queue_paused", "1 while `dispatcher pause` holds the queue (any of its shards).")
	m.dueNextMinute = gauge("dispatcher_queue_due_next_minute_tasks", "Pending tasks falling due in the next 60 s (from the current second of the Redis clock), counted every 10 s.")
	m.peakSecond = gauge("dispatcher_queue_due_peak_second_tasks", "The most pending tasks falling due in any one second of the next minute, counted every 10 s.")
	m.herd = gauge("dispatcher_queue_herd_ahead", "1 while a second of the next minute holds more tasks than the queue drains in 10 s (at the lower of DISPATCHER_QUEUE_<NAME>_MAX_RATE and _DRAIN_RATE): a thundering herd is coming.")
	m.byName = make(map[string]*queueView, len(opt.Queues))
	for _, t := range opt.Queues {
		m.queues = append(m.queues, &queueView{target: t, View: View{State: queuestate.Queue{Name: t.Name}}})
		if m.byName[t.Name] == nil {
			m.byName[t.Name] = m.queues[len(m.queues)-1]
		}
	}
	return m
}

// Run reads the swept queues every Interval until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	t := time.NewTicker(m.opt.Interval)
	defer t.Stop()
	for {
		m.refresh(ctx)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// refresh reads the queues this instance sweeps, exports them and checks
// them for stalls; a queue it no longer sweeps stops being exported here.
func (m *Monitor) refresh(ctx context.Context) {
	var swept []*queueView
	now := time.Now()
	m.mu.Lock()
	for _, v := range m.queues {
		on := m.opt.Sweeping != nil && m.opt.Sweeping(v.target.Name)
		if v.Swept && !on {
			m.unexport(v)
		}
		if on && !v.Swept {
			v.every, v.next, v.nextAhead = 0, time.Time{}, time.Time{} // read it at once, as news
		}
		var dozing bool
		var wakes uint64
		if on && m.opt.Dozing != nil {
			dozing, wakes = m.opt.Dozing(v.target.Name)
		}
		if on && v.Swept && wakes != v.wakes {
			v.every, v.next = m.opt.Interval, time.Time{} // woken since the last tick: read it at once
		}
		v.Swept, v.dozing, v.wakes = on, dozing, wakes
		if on && !now.Before(v.next) {
			swept = append(swept, v)
		}
	}
	m.mu.Unlock()
	m.read(ctx, swept)
	m.lookAhead(ctx)
}

// readTimeout bounds one read: a primary that stopped answering must not
// hold up the page and the other queues for long.
const readTimeout = 2 * time.Second

// read reads the queues of vs in one round trip and applies the result.
// It waits for a read under way to end, or gives up when ctx does.
func (m *Monitor) read(ctx context.Context, vs []*queueView) {
	if len(vs) == 0 {
		return
	}
	select {
	case m.reading <- struct{}{}:
		defer func() { <-m.reading }()
	case <-ctx.Done():
		return
	}
	targets := make([]queuestate.Target, len(vs))
	layouts := make([]*shard.Layout, len(vs))
	for n, v := range vs {
		targets[n] = v.target
		if m.opt.Layout != nil {
			l := m.opt.Layout(v.target.Name)
			targets[n].Shards, layouts[n] = l.Span(), &l
		}
	}
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	states, err := queuestate.Read(rctx, m.rdb, m.opt.KeyPrefix, targets)
	cancel()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	for n, v := range vs {
		var st queuestate.Queue
		if err != nil {
			// Nothing read: every shard counts as unreadable, with its last
			// known figures.
			v.Err = err.Error()
			st = queuestate.Queue{Name: v.target.Name, Shards: make([]queuestate.Shard, targets[n].Shards),
				Sweeper: v.State.Sweeper, ReadAt: v.State.ReadAt}
			for i := range st.Shards {
				st.Shards[i] = queuestate.Shard{Index: i, Err: "not read: " + err.Error()}
			}
		} else {
			v.Err, st = "", states[n]
		}
		st.Layout = layouts[n]
		v.carry(&st, now)
		v.undatedAges(&st, now)
		if quiet(v.State, st) && v.every > 0 {
			most := quietReads * m.opt.Interval
			if v.dozing {
				most = dozingReads * m.opt.Interval
			}
			v.every = min(2*v.every, most)
		} else {
			v.every = m.opt.Interval
		}
		// Less a little: a read due at the next tick must not miss it.
		v.next = now.Add(v.every - m.opt.Interval/4)
		v.State, v.ReadAt = st, now
		v.History = append(v.History, Sample{At: now, Age: v.State.OldestDueAge, Due: v.State.Due, Pending: v.State.Pending})
		if len(v.History) > historyLen {
			v.History = append(v.History[:0], v.History[len(v.History)-historyLen:]...)
		}
		if v.Swept {
			m.export(v)
			m.watch(v, now)
			m.warnFar(v, now)
			if err == nil {
				m.pauseNews(v)
			}
		}
	}
	if err != nil && ctx.Err() == nil && now.Sub(m.lastFailLog) > 10*time.Second {
		m.lastFailLog = now
		args := []any{"err", err}
		if strings.Contains(err.Error(), "NOPERM") || strings.Contains(err.Error(), "can't run this command") {
			args = append(args, "hint", "the Redis ACL user needs +zcard, +zcount and +hlen for these reads (docs/how-it-works.md#redis-acls)")
		}
		m.log.Warn("cannot read the queues' state; they show their last known figures", args...)
	}
}

// carry keeps each readable shard's figures as its last good ones and
// gives each unreadable shard its last good figures (its error kept), with
// the oldest due age grown by the time since; then it sums the queue again.
func (v *queueView) carry(st *queuestate.Queue, now time.Time) {
	if len(v.lastGood) != len(st.Shards) {
		v.lastGood = make([]queuestate.Shard, len(st.Shards))
	}
	read := false
	for _, sh := range st.Shards {
		read = read || sh.Err == ""
	}
	if read { // ReadAt is the Redis clock of this read
		v.offset = st.ReadAt.Sub(now)
	}
	serverNow := now.Add(v.offset).UnixMilli()
	for i, sh := range st.Shards {
		if sh.Err == "" {
			v.lastGood[i] = sh
			continue
		}
		old := v.lastGood[i]
		old.Index, old.Err = i, sh.Err
		old.Grow(serverNow)
		st.Shards[i] = old
	}
	st.Sum()
}

// undatedAges counts the lateness of a shard's tasks with no real due
// time (0, negative, -inf, seconds before 1973) from when a read first
// found its first one there, not from 1970: a task due "since ever" that
// is dispatched at once is not late, and one that waits is late by that
// wait. The same first task (member and score) keeps its time; another
// starts anew. A shard that cannot be read keeps its last, whose age goes
// on growing. After the sweeping instance changes, the count starts again.
func (v *queueView) undatedAges(st *queuestate.Queue, now time.Time) {
	if len(v.undated) != len(st.Shards) {
		v.undated = make([]undatedSeen, len(st.Shards))
	}
	for i := range st.Shards {
		sh := &st.Shards[i]
		seen := &v.undated[i]
		switch {
		case sh.Err != "":
		case sh.FirstUndated == nil:
			*seen = undatedSeen{}
		case seen.since.IsZero() || seen.task != *sh.FirstUndated:
			*seen = undatedSeen{task: *sh.FirstUndated, since: now}
		}
		if !seen.since.IsZero() {
			sh.OldestDueAge = max(sh.OldestDueAge, now.Sub(seen.since))
			sh.AgeSeconds = sh.OldestDueAge.Seconds()
		}
	}
	st.Sum()
}

// farEvery is how often the tasks of a queue scored after year 5138 are
// warned of, while there are any.
const farEvery = 10 * time.Minute

// warnFar warns, every farEvery, of the shards holding tasks scored after
// year 5138: micro- or nanoseconds written for ms, or +inf. They wait in
// pending until then (+inf forever); a line per shard (at most 8), with
// its key, count, and last task's member and score.
func (m *Monitor) warnFar(v *queueView, now time.Time) {
	q := v.State
	if q.Far == 0 || (!v.farWarned.IsZero() && now.Sub(v.farWarned) < farEvery) {
		return
	}
	v.farWarned = now
	k := shard.Keys{Prefix: m.opt.KeyPrefix, Queue: q.Name}
	told := 0
	for _, sh := range q.Shards {
		if sh.Far == 0 || sh.LastFar == nil {
			continue
		}
		if told == 8 {
			m.log.Warn("more shards hold tasks scored after year 5138", "queue", q.Name, "far_future", q.Far)
			break
		}
		told++
		m.log.Warn("tasks scored after year 5138 (micro- or nanoseconds written for ms, or +inf): they wait in pending until then, +inf forever",
			"queue", q.Name, "shard", sh.Index, "key", k.Pending(sh.Index), "far_future", sh.Far,
			"member", sh.LastFar.Member, "score", sh.LastFar.Score, "due", farDue(sh.LastFar.Score))
	}
}

// farDue says when a score far in the future falls due: "year 57970",
// or "never" (+inf and beyond 2^53 ms).
func farDue(score string) string {
	f, err := strconv.ParseFloat(score, 64)
	if err != nil {
		return "?"
	}
	ms, never := shard.DueOf(f)
	if never {
		return "never"
	}
	return "year " + strconv.Itoa(time.UnixMilli(ms).UTC().Year())
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// quiet reports whether a read found a queue as before, with nothing due
// (a retried task is due).
func quiet(was, is queuestate.Queue) bool {
	return is.Due == 0 && is.Retried == 0 && is.Broken == 0 && is.Paused == was.Paused && is.Pending == was.Pending && is.Inflight == was.Inflight &&
		is.Expired == was.Expired && is.Dead == was.Dead && is.NextDueMs == was.NextDueMs && is.Broken == was.Broken
}

func (m *Monitor) export(v *queueView) {
	q := v.State
	l := q.Name
	m.pending.WithLabelValues(l).Set(float64(q.Pending))
	m.due.WithLabelValues(l).Set(float64(q.Due))
	m.inflight.WithLabelValues(l).Set(float64(q.Inflight))
	m.expired.WithLabelValues(l).Set(float64(q.Expired))
	m.dead.WithLabelValues(l).Set(float64(q.Dead))
	m.age.WithLabelValues(l).Set(q.OldestDueAge.Seconds())
	m.retried.WithLabelValues(l).Set(float64(q.Retried))
	m.retriedAge.WithLabelValues(l).Set(q.RetriedAge.Seconds())
	m.broken.WithLabelValues(l).Set(float64(q.Broken))
	m.paused.WithLabelValues(l).Set(b2f(q.Paused > 0))
}

// pauseNews logs, once each, that the swept queue was found paused
// (`dispatcher pause`) or resumed since the last read: the claims only say
// "paused" while tasks are due, and nothing says a resume.
func (m *Monitor) pauseNews(v *queueView) {
	q := v.State
	switch {
	case q.Paused > 0 && (!v.pauseKnown || v.pausedWas == 0):
		m.log.Info("queue paused: no instance claims its tasks until `dispatcher resume`", "queue", q.Name,
			"paused_shards", q.Paused, "shards", len(q.Shards), "due", q.Due)
	case q.Paused == 0 && v.pauseKnown && v.pausedWas > 0:
		m.log.Info("queue resumed: its tasks are claimed again", "queue", q.Name, "due", q.Due)
	}
	v.pauseKnown, v.pausedWas = true, q.Paused
}

// Paused is how many of a queue's shards were paused at this instance's
// last read of it while sweeping it; known is false if it does not sweep
// the queue or has not read it since it took the role.
func (m *Monitor) Paused(queue string) (shards int, known bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v := m.byName[queue]; v != nil && v.Swept && v.pauseKnown {
		return v.pausedWas, true
	}
	return 0, false
}

// unexport drops a queue's gauges when another instance took the sweeping
// over: two instances exporting it would be fine for max by (queue), a
// stale copy forever would not.
func (m *Monitor) unexport(v *queueView) {
	for _, g := range m.gauges {
		g.DeleteLabelValues(v.target.Name)
	}
	v.StalledSince, v.Waiting = time.Time{}, nil
	v.Ahead, v.herdAt = Ahead{}, 0
	v.pauseKnown = false
}

// watch is the stall watchdog: it logs at error level when the queue's
// oldest due task passes StallAfter (again every StallAfter while it
// stays so), and once when it recovers.
func (m *Monitor) watch(v *queueView, now time.Time) {
	q := v.State
	// A stall ends when the age is back under half the threshold: a queue
	// hovering around it would otherwise log a stall and its end every read.
	limit := m.opt.StallAfter
	if !v.StalledSince.IsZero() {
		limit /= 2
	}
	// A paused queue is held on purpose: late, not stalled.
	if q.OldestDueAge <= limit || q.Paused > 0 {
		if !v.StalledSince.IsZero() {
			m.log.Info("queue no longer stalled", "queue", q.Name, "stalled_for", now.Sub(v.StalledSince).Round(time.Millisecond),
				"oldest_due_age", q.OldestDueAge.Round(time.Millisecond), "due", q.Due)
		}
		v.StalledSince, v.Waiting = time.Time{}, nil
		m.stalled.WithLabelValues(q.Name).Set(0)
		return
	}
	m.stalled.WithLabelValues(q.Name).Set(1)
	if m.opt.Waiting != nil {
		v.Waiting = m.opt.Waiting(q.Name)
	}
	if q.Broken > 0 {
		v.Waiting = append(v.Waiting, "cannot read "+brokenShards(q, 4)+" (last known figures shown)")
	}
	msg := "queue stalled: its oldest due task waits longer than DISPATCHER_STALL_AFTER"
	switch {
	case v.StalledSince.IsZero():
		v.StalledSince = now
	case now.Sub(v.lastLog) >= m.opt.StallAfter:
		msg = "queue still stalled"
	default:
		return
	}
	v.lastLog = now
	m.log.Error(msg, "queue", q.Name, "oldest_due_age", q.OldestDueAge.Round(time.Millisecond),
		"stall_after", m.opt.StallAfter, "due", q.Due, "inflight", q.Inflight, "retried", q.Retried,
		"oldest_retried_age", q.RetriedAge.Round(time.Millisecond), "late_shards", lateShards(q, 8),
		"waiting_on", strings.Join(v.Waiting, "; "))
}

// Stalls describes the stalled queues this instance sweeps, one line
// each, for /readyz.
func (m *Monitor) Stalls() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, v := range m.queues {
		if !v.Swept || v.StalledSince.IsZero() {
			continue
		}
		line := fmt.Sprintf("queue %s: stalled for %s: oldest due task %s late (shards %s)", v.State.Name,
			time.Since(v.StalledSince).Round(time.Second), v.State.OldestDueAge.Round(time.Millisecond), lateShards(v.State, 8))
		if q := v.State; q.Retried > 0 {
			line += fmt.Sprintf("; %d retried after failed publishes, the oldest %s late", q.Retried, q.RetriedAge.Round(time.Millisecond))
		}
		if len(v.Waiting) > 0 {
			line += "; waiting on: " + strings.Join(v.Waiting, "; ")
		}
		out = append(out, line)
	}
	return out
}

// Views returns what the instance knows of every queue, reading from
// Redis first the ones it does not sweep (so every instance's status page
// shows every queue) when their last read is older than the interval.
func (m *Monitor) Views(ctx context.Context) []View {
	var stale []*queueView
	m.mu.Lock()
	for _, v := range m.queues {
		if !v.Swept && time.Since(v.ReadAt) >= m.opt.Interval {
			stale = append(stale, v)
		}
	}
	m.mu.Unlock()
	m.read(ctx, stale)
	m.pageForecasts(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]View, len(m.queues))
	for n, v := range m.queues {
		out[n] = v.View
		out[n].Drain, out[n].DrainFrom = m.drain(v.target.Name)
		out[n].HerdLimit = herdLimit(out[n].Drain)
		out[n].History = append([]Sample(nil), v.History...)
		out[n].Waiting = append([]string(nil), v.Waiting...)
		out[n].Stalled = !v.StalledSince.IsZero() ||
			(!v.Swept && v.State.OldestDueAge > m.opt.StallAfter && v.State.Paused == 0)
	}
	return out
}

// lateShards lists up to n shards with a due task, the latest first:
// "3 (42s), 7 (40s), and 2 more".
func lateShards(q queuestate.Queue, n int) string {
	late := q.Late()
	var parts []string
	for k, s := range late {
		if k == n {
			parts = append(parts, "and "+strconv.Itoa(len(late)-n)+" more")
			break
		}
		parts = append(parts, fmt.Sprintf("%d (%s)", s.Index, s.OldestDueAge.Round(time.Second)))
	}
	return strings.Join(parts, ", ")
}

// brokenShards lists the unreadable shards by error, at most n of each:
// "shards 0, 1, 2 and 13 more: not read: dial tcp ...".
func brokenShards(q queuestate.Queue, n int) string {
	errs, by := q.BrokenShards()
	var parts []string
	for _, e := range errs {
		idx := by[e]
		list := queuestate.JoinIndexes(idx, n)
		word := "shards "
		if len(idx) == 1 {
			word = "shard "
		}
		parts = append(parts, word+list+": "+e)
	}
	return strings.Join(parts, "; ")
}
