package scanner

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A quiet queue's sweeps stretch out, doubling per sweep without news up to
// IdlePollInterval; news brings them back to PollInterval at once.
func TestSweepIntervalStretchesAndSnapsBack(t *testing.T) {
	d := newDueTimes(0, 50*time.Millisecond, 500*time.Millisecond, 0, nil)
	d.hot()
	var got []time.Duration
	for i := 0; i < 6; i++ {
		got = append(got, d.every)
		d.cool()
	}
	want := []time.Duration{50, 100, 200, 400, 500, 500}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("sweep intervals %v, want %v ms", got, want)
		}
	}
	d.hot()
	if d.every != 50*time.Millisecond {
		t.Errorf("after news: %v, want the poll interval", d.every)
	}
	// An idle interval under the poll interval (or 0) means no stretching.
	d = newDueTimes(0, time.Second, 500*time.Millisecond, 0, nil)
	d.hot()
	d.cool()
	if d.every != time.Second {
		t.Errorf("idle interval below the poll interval: %v, want 1s", d.every)
	}
}

// Sweeps fall due on a grid shared by every queue (and process), so that
// those of many queues share a round trip.
func TestGridNext(t *testing.T) {
	every := 500 * time.Millisecond
	base := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct{ at, want time.Duration }{
		{0, 500 * time.Millisecond},
		{1, 500 * time.Millisecond},
		{499 * time.Millisecond, 500 * time.Millisecond},
		{500 * time.Millisecond, time.Second},
		{730 * time.Millisecond, time.Second},
	} {
		if got := gridNext(base.Add(c.at), every); !got.Equal(base.Add(c.want)) {
			t.Errorf("gridNext(+%v) = +%v, want +%v", c.at, got.Sub(base), c.want)
		}
	}
	if got := gridNext(time.Time{}, every); !got.Before(base) {
		t.Errorf("never swept: next sweep %v, want long past", got)
	}
	// The monotonic reading stays (String shows it as m=...), so that a
	// step of the wall clock does not move the next sweep.
	if got := gridNext(time.Now(), every); !strings.Contains(got.String(), "m=") {
		t.Errorf("gridNext dropped the monotonic clock: %v", got)
	}
}

// The server reads its clock somewhere within a round trip, and the
// estimate takes the midpoint: a slow round trip (a loaded server or
// network) is off by up to half of it. It must not replace a recent
// estimate from a fast one (found with the bench's x-published-us stamps:
// up to 10 ms ahead of the real time under load).
func TestClockEstimateKeepsTheFastestRoundTrip(t *testing.T) {
	local := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	const skewMs = 5000 // the server's clock is 5 s ahead of the local one
	s := newServerClock(1, func() time.Time { return local })
	truth := func() int64 { return local.UnixMilli() + skewMs }

	// A fast round trip: 200 µs, the clock read in its middle.
	before := local
	after := before.Add(200 * time.Microsecond)
	s.observe(0, (before.Add(100*time.Microsecond).UnixMilli()+skewMs)*1000+500, before, after)
	// A slow one a little later: 40 ms, the clock read right at its start.
	local = local.Add(time.Second)
	before, after = local, local.Add(40*time.Millisecond)
	s.observe(0, (before.UnixMilli()+skewMs)*1000+500, before, after)
	if d := s.serverNow(0) - truth(); d < -1 || d > 1 {
		t.Errorf("server clock estimate off by %d ms after a slow round trip", d)
	}
	// Much later, when the fast estimate may have drifted, a slower sample
	// is taken: the estimate follows the server's clock.
	local = local.Add(time.Minute)
	before, after = local, local.Add(2*time.Millisecond)
	s.observe(0, (before.Add(time.Millisecond).UnixMilli()+skewMs+3)*1000+500, before, after) // the server's clock drifted 3 ms
	if d := s.serverNow(0) - truth(); d < 2 || d > 4 {
		t.Errorf("estimate off by %d ms from the drifted server clock's 3 ms ahead", d)
	}
	// The local clock is stepped 5 s back; the next sample, slow as it is,
	// shows the kept offset wrong and replaces it at once.
	before, after = local, local.Add(2*time.Millisecond)
	s.observe(0, (before.Add(time.Millisecond).UnixMilli()+skewMs+3)*1000+500, before, after)
	local = local.Add(-5 * time.Second)
	before, after = local, local.Add(5*time.Millisecond)
	s.observe(0, (before.Add(2500*time.Microsecond).UnixMilli()+skewMs+3+5000)*1000+500, before, after)
	if d := s.serverNow(0) - (local.UnixMilli() + skewMs + 3 + 5000); d < -3 || d > 3 {
		t.Errorf("after a 5 s step of the local clock, the estimate is off by %d ms", d)
	}
}

// A primary whose every shard is set aside (badUntil) has nothing to
// sweep: the loop must still wait a sweep interval for it, not wake every
// ms (found in review).
func TestNothingToSweepDoesNotSpin(t *testing.T) {
	s := New(nil, nil, Options{Queue: "q", Shards: 1, BatchSize: 10, PollInterval: 50 * time.Millisecond,
		Lease: 30 * time.Second})
	s.role.leader, s.role.leading = true, true // a renewal on its way: not what wakes the loop
	s.prim.node("")
	s.due.setAside(0, time.Now().Add(5*time.Second))
	launched := 0
	s.sweep(context.Background(), func(claimJob) { launched++ })
	if launched != 0 {
		t.Fatalf("%d jobs launched for a set-aside shard", launched)
	}
	// Its next sweep is a grid point ahead (not long past, which makes
	// idleDelay answer its 1 ms minimum on every turn).
	if due := s.sweepDue(s.prim.node("")); !due.After(time.Now()) {
		t.Errorf("primary with nothing to sweep is due again at once (%v)", due)
	}
}

// A wake-up that arrives while a claim of its shard is on its way must
// survive that claim's answer: Redis may have run the claim before the
// producer's ZADD (another client's pipeline is not atomic), and its
// answer, "nothing pending", would otherwise erase the due time the
// wake-up gave, leaving the task to the next sweep (an hour later in
// TestWakeUpFromPython, where this was seen).
func TestWakeUpSurvivesAClaimSentBeforeIt(t *testing.T) {
	s := New(nil, nil, Options{Queue: "q", Shards: 4, BatchSize: 10, PollInterval: time.Hour})
	s.role.leader, s.role.leading = true, true // no role renewal in this test
	job := claimJob{shards: []int{2}, tokens: []string{"t"}, limit: 10, sent: time.Now()}
	time.Sleep(time.Millisecond)
	s.wake.notes.due(2, 1_000)
	busy := false
	s.takeNotes(context.Background(), &busy)
	if s.due.known[2] != 1_000 {
		t.Fatalf("the wake-up was not taken in: known %v", s.due.known)
	}
	now := time.Now()
	s.absorb(claimDone{job: job, vals: [][]any{{int64(900), "", "", int64(0), "5000"}}, errs: []error{nil},
		before: []time.Time{now}, after: []time.Time{now}})
	if at, ok := s.due.known[2]; !ok || at != 1_000 {
		t.Errorf("after the answer of a claim sent before the wake-up: known[2] = %v (%v), want 1000", at, ok)
	}
	// An answer to a claim sent after the wake-up is the truth.
	job.sent = time.Now()
	s.absorb(claimDone{job: job, vals: [][]any{{int64(1100), "", "", int64(0), "6000"}}, errs: []error{nil},
		before: []time.Time{now}, after: []time.Time{now}})
	if at, ok := s.due.known[2]; ok {
		t.Errorf("a later claim found nothing pending, yet known[2] = %v", at)
	}
}

// A sweep that finds a task due sooner than a quiet queue's sweeps come
// brings them back to PollInterval; one due later, though claimed a
// quarter look-ahead before that, leaves them slow: tasks ZADDed twice
// the slow interval ahead are found in time by the slow sweeps.
func TestSweepHotCountsToTheDueTime(t *testing.T) {
	base := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	clock := newServerClock(1, func() time.Time { return base })
	nowMs := clock.serverNow(0)
	for _, c := range []struct {
		inMs int64
		hot  bool
	}{{490, true}, {510, false}, {1000, false}} {
		d := newDueTimes(1, 50*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond, clock)
		d.every = d.idleEvery()
		d.noteAnswer(0, strconv.FormatInt(nowMs+c.inMs, 10), nil, base, false)
		if got := d.every == d.poll; got != c.hot {
			t.Errorf("task due in %d ms: swept every %v, want hot %v", c.inMs, d.every, c.hot)
		}
	}
}
