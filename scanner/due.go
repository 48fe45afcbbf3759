package scanner

import (
	"time"
)

// The sweeper learns when each shard next needs a claim from sweeps,
// claims' answers and wake-ups, and sleeps until the first of them; how
// often it sweeps follows how much news the sweeps bring. Those due times
// and the sweep interval change on every answer, so they are kept here,
// apart from the loop that only asks which shards are due and how long it
// may sleep.

// dueTimes is what the loop knows of when each shard next needs a claim,
// and how often the shards are swept. Owned by Run's goroutine.
type dueTimes struct {
	shards    int
	poll      time.Duration // Options.PollInterval
	idle      time.Duration // Options.IdlePollInterval
	lookahead time.Duration // Options.Lookahead
	clock     *serverClock

	every     time.Duration     // current sweep interval, PollInterval..IdlePollInterval
	known     map[int]int64     // shard -> server ms at which it next needs a claim
	notedAt   map[int]time.Time // shard -> when a wake-up last told of it
	badUntil  map[int]time.Time // shard -> left alone until, for trouble of its own
	claimedAt map[int]time.Time // shard -> when a claim of it last answered
}

func newDueTimes(shards int, poll, idle, lookahead time.Duration, clock *serverClock) *dueTimes {
	return &dueTimes{shards: shards, poll: poll, idle: idle, lookahead: lookahead, clock: clock, every: poll,
		known: map[int]int64{}, notedAt: map[int]time.Time{}, badUntil: map[int]time.Time{}, claimedAt: map[int]time.Time{}}
}

// noteNext records when shard i next needs a claim.
func (d *dueTimes) noteNext(i int, pending, lease any) {
	p, okP := parseScore(pending)
	l, okL := parseScore(lease)
	p -= d.claimEarly()
	switch {
	case okP && okL:
		d.known[i] = min(p, l)
	case okP:
		d.known[i] = p
	case okL:
		d.known[i] = l
	default:
		delete(d.known, i)
	}
}

// noteAnswer takes in what a claim (claim true) or sweep of shard i, sent
// at sent, answered: when the shard's earliest pending task and earliest
// lease are due.
func (d *dueTimes) noteAnswer(i int, pending, lease any, sent time.Time, claim bool) {
	if claim {
		d.claimedAt[i] = time.Now()
	}
	was, had := d.known[i]
	d.noteNext(i, pending, lease)
	if had && d.notedAt[i].After(sent) {
		// A wake-up came after this job was sent: Redis may have run it
		// before the producer's ZADD, so its answer does not overrule
		// the due time the wake-up gave.
		if at, ok := d.known[i]; !ok || was < at {
			d.known[i] = was
		}
	}
	if at, has := d.known[i]; !claim && has && (!had || at < was) && at+d.claimEarly()-d.clock.serverNow(i) < d.idleEvery().Milliseconds() {
		// A task appeared, or one due earlier than any known, due
		// sooner than a quiet queue's sweeps come: the queue's
		// producers schedule tasks that wait for the sweeps, so sweep
		// often. Tasks scheduled further ahead are found in time by
		// the slower sweeps (steady traffic scheduled ahead stays
		// cheap). Counted to the due time, not to the claim a quarter
		// look-ahead before it: a task ZADDed twice the slow interval
		// ahead (found with at least that interval to go) must not
		// keep its queue swept at the fast one.
		d.hot()
	}
}

// heard takes in the due times that wake-ups told of (shard -> server ms).
func (d *dueTimes) heard(soon map[int]int64) {
	now := time.Now()
	for i, at := range soon {
		d.notedAt[i] = now
		at -= d.claimEarly()
		if cur, ok := d.known[i]; !ok || at < cur {
			d.known[i] = at
		}
	}
}

// dueNow makes shard i need a claim at once.
func (d *dueTimes) dueNow(i int) { d.known[i] = 0 }

// drop forgets when shard i next needs a claim: a sweep finds out again.
func (d *dueTimes) drop(i int) { delete(d.known, i) }

// forget drops what the loop knows of the shards' due times, but for
// the shards whose last claim went unanswered (the keys of unanswered):
// those are claimed again at once whatever else the instance does.
func (d *dueTimes) forget(unanswered map[int]string) {
	clear(d.known)
	clear(d.claimedAt)
	for i := range unanswered {
		d.known[i] = 0
	}
}

// claimEarly is how long before its earliest pending task is due a shard
// is claimed, in ms: a quarter of the look-ahead, so that each claim takes
// at least three quarters of the look-ahead's worth of the shard's tasks
// (a claim every ms at a steady rate otherwise) and has a quarter to come
// back before the first of them is due.
func (d *dueTimes) claimEarly() int64 { return d.lookahead.Milliseconds() / 4 }

// dueIn is how long until known shard i's earliest task is due, ms (its
// claim comes claimEarly before).
func (d *dueTimes) dueIn(i int) (int64, bool) {
	at, ok := d.known[i]
	return at + d.claimEarly() - d.clock.serverNow(i), ok
}

// ahead reports whether every shard's earliest task is due later than
// a coalesced round trip takes (a few ms): then its claim can share one.
func (d *dueTimes) ahead(shards []int) bool {
	for _, i := range shards {
		if in, ok := d.dueIn(i); !ok || in <= coalesceAhead.Milliseconds() {
			return false
		}
	}
	return d.lookahead > 0
}

// coalesceAhead is how long before its first task is due a claim may still
// go through the Coalescer (which waits 2 ms for company).
const coalesceAhead = 5 * time.Millisecond

// wait is how long from now until known shard i needs a claim and is not
// set aside.
func (d *dueTimes) wait(i int, now time.Time) time.Duration {
	at := d.known[i]
	// In µs: waking up to a ms early only to sleep a whole ms more
	// made tasks late by up to 2 ms.
	w := time.Hour // far off (a score of +inf is 2^62 ms): no overflow
	if at-d.clock.serverNow(i) < time.Hour.Milliseconds() {
		w = time.Duration(at*1000-d.clock.serverNowUs(i)) * time.Microsecond
	}
	if bad := d.badUntil[i]; bad.After(now) {
		w = max(w, bad.Sub(now))
	}
	return w
}

// setAside leaves shard i alone for a while (trouble of its own, paused).
func (d *dueTimes) setAside(i int, until time.Time) { d.badUntil[i] = until }

// aside reports whether shard i is left alone now.
func (d *dueTimes) aside(i int, now time.Time) bool { return now.Before(d.badUntil[i]) }

// sweepable lists the shards a sweep reads: all but those left alone for
// trouble of their own.
func (d *dueTimes) sweepable() []int {
	now := time.Now()
	var out []int
	for i := 0; i < d.shards; i++ {
		if !now.Before(d.badUntil[i]) {
			out = append(out, i)
		}
	}
	return out
}

// claimedSince reports whether a sweep of shard i can be skipped: a claim
// of it answered after t (the last sweep) and the next claim of it is due
// before the next sweep, so that claim reads the shard first. A claim's
// answer is only as fresh as the claim: standing in for a sweep for longer
// would let a task added after it wait for the sweep after next.
func (d *dueTimes) claimedSince(i int, t time.Time) bool {
	at, ok := d.claimedAt[i]
	if !ok || t.IsZero() || !at.After(t) {
		return false
	}
	next, ok := d.known[i]
	return ok && next <= d.clock.serverNow(i)+d.every.Milliseconds()
}

// nextSweep is when shards last swept at last are next swept.
func (d *dueTimes) nextSweep(last time.Time) time.Time { return gridNext(last, d.every) }

// cool stretches the sweep interval after a sweep: each sweep that brings
// no news (hot) doubles it, up to IdlePollInterval. So a quiet queue costs
// Redis a few reads per shard a second whatever the poll interval, while
// one in use is swept every PollInterval.
func (d *dueTimes) cool() {
	d.every = min(2*d.every, d.idleEvery())
}

// idleEvery is the sweep interval of a quiet queue.
func (d *dueTimes) idleEvery() time.Duration { return max(d.idle, d.poll) }

// hot brings the sweep interval back to PollInterval: a sweep found a task
// due sooner than a quiet queue's sweeps would have found it, or a
// producer or another instance sent a wake-up. Such a queue is likely to
// get more tasks at short notice from producers that send no wake-up, and
// those wait for a sweep.
func (d *dueTimes) hot() { d.every = d.poll }

// gridNext is the first multiple of every (counted from Go's zero time, the
// same in every process) after t. Sweeps and role renewals fall due on this
// grid, so those of many queues fall due together and share a round trip.
func gridNext(t time.Time, every time.Duration) time.Time {
	if every <= 0 || t.IsZero() {
		return t
	}
	// Add, not Truncate: t keeps its monotonic reading, so a step of the
	// wall clock does not stop sweeps or renewals for the length of the step.
	return t.Add(every - time.Duration(t.UnixNano()%int64(every)))
}
