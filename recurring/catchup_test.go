package recurring

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// choice is following's answer as the tests compare it.
type choice struct {
	at      time.Time
	skipped int
	floor   bool // skipped is a floor (counting stopped)
}

func choose(s *Schedule, cursor, now time.Time) choice {
	c := s.following(cursor, now)
	if c.lost {
		panic("the search for the catch-up's occurrence failed")
	}
	return choice{at: c.at, skipped: c.skipped, floor: c.floor}
}

// counted counts a schedule's calls of Next and, past its budget, answers
// "no further occurrence", so that a search that would walk millions of
// occurrences ends at once and the test fails on the count and the answer.
type counted struct {
	cron.Schedule
	calls, budget int
}

func (c *counted) Next(t time.Time) time.Time {
	c.calls++
	if c.calls > c.budget {
		return time.Time{}
	}
	return c.Schedule.Next(t)
}

// countCalls makes s count its expression's Next calls.
func countCalls(s *Schedule, budget int) *counted {
	if s.wall != nil { // a fixed-hour expression is read on the wall clock
		c := &counted{Schedule: s.wall, budget: budget}
		s.wall = c
		return c
	}
	c := &counted{Schedule: s.cron, budget: budget}
	s.cron = c
	return c
}

func sec(n int) time.Duration { return time.Duration(n) * time.Second }

// TestCatchUpLatestLongOutage: 2.1 M seconds behind, "latest" fires the
// latest occurrence at or before now, once; the search stopped after a
// million steps and fired the one it had reached (then, from there, the
// next stale one).
func TestCatchUpLatestLongOutage(t *testing.T) {
	cursor := utc("2026-01-01T00:00:00Z")
	now := cursor.Add(sec(2_100_000) + 500*time.Millisecond)
	for _, tc := range []struct {
		cron   string
		want   choice
		budget int
	}{
		{"@every 1s", choice{at: cursor.Add(sec(2_100_000)), skipped: 2_099_999}, 100},
		// Counting the skipped ones of a cron expression stops at 10,000.
		{"* * * * * *", choice{at: cursor.Add(sec(2_100_000)), skipped: 10_000, floor: true}, 100_000},
	} {
		s := mustParse(t, Def{Cron: tc.cron})
		c := countCalls(s, tc.budget)
		got := choose(s, cursor, now)
		if c.calls > tc.budget {
			t.Errorf("%s: more than %d occurrences computed", tc.cron, tc.budget)
		}
		if !got.at.Equal(tc.want.at) || got.skipped != tc.want.skipped || got.floor != tc.want.floor {
			t.Errorf("%s: fires %s (%s before now), skipped %d (floor %v); want %s, skipped %d (floor %v)", tc.cron,
				got.at.Format(time.RFC3339), now.Sub(got.at), got.skipped, got.floor, tc.want.at.Format(time.RFC3339), tc.want.skipped, tc.want.floor)
		}
	}
}

// TestCatchUpAllFiresAtMostMax steps "all" as the materialiser does, each
// occurrence from the one before, with exactly 2*MaxCatchUp+1 missed: the
// most recent MaxCatchUp fire, oldest first, and no other.
func TestCatchUpAllFiresAtMostMax(t *testing.T) {
	cursor := utc("2026-01-01T00:00:00Z")
	missed := 2*MaxCatchUp + 1
	now := cursor.Add(sec(missed) + 500*time.Millisecond)
	for _, expr := range []string{"@every 1s", "* * * * * *"} {
		s := mustParse(t, Def{Cron: expr, CatchUp: CatchUpAll})
		var fired []time.Time
		skipped := 0
		for c := cursor; len(fired) <= missed; {
			got := choose(s, c, now)
			if got.at.After(now) {
				break
			}
			fired = append(fired, got.at)
			skipped += got.skipped
			c = got.at
		}
		want := cursor.Add(sec(missed - MaxCatchUp + 1))
		if len(fired) != MaxCatchUp || !fired[0].Equal(want) || skipped != missed-MaxCatchUp {
			t.Errorf("%s, %d missed: %d fired from %s, %d skipped; want %d from %s, %d skipped", expr, missed,
				len(fired), fired[0].Format(time.RFC3339), skipped, MaxCatchUp, want.Format(time.RFC3339), missed-MaxCatchUp)
		}
		for i := 1; i < len(fired); i++ {
			if fired[i].Sub(fired[i-1]) != time.Second {
				t.Fatalf("%s: %s fired after %s", expr, fired[i], fired[i-1])
			}
		}
	}
}

// TestCatchUpAllSlides: while a long "all" catch-up is delivered, more
// occurrences fall due (1.5 for each one fired, then 0.5 once the queue
// keeps up): each step keeps the most recent MaxCatchUp at or before its
// now, so no more than MaxCatchUp ever wait, none fires twice or out of
// order, and every one up to the end fired or was skipped.
func TestCatchUpAllSlides(t *testing.T) {
	cursor := utc("2026-01-01T00:00:00Z")
	for _, expr := range []string{"@every 1s", "* * * * * *"} {
		s := mustParse(t, Def{Cron: expr, CatchUp: CatchUpAll})
		now := cursor.Add(sec(1500) + 500*time.Millisecond)
		c, fired, skipped := cursor, 0, 0
		for step := 0; ; step++ {
			if step == 20_000 {
				t.Fatalf("%s: never caught up", expr)
			}
			got := choose(s, c, now)
			if !got.at.After(c) {
				t.Fatalf("%s: fires %s after %s", expr, got.at, c)
			}
			if got.at.After(now) {
				break
			}
			if waiting := int(now.Sub(got.at)/time.Second) + 1; waiting > MaxCatchUp {
				t.Fatalf("%s: %d waiting at %s", expr, waiting, now)
			}
			c, fired, skipped = got.at, fired+1, skipped+got.skipped
			if step < 1000 {
				now = now.Add(1500 * time.Millisecond)
			} else {
				now = now.Add(500 * time.Millisecond)
			}
		}
		if total := int(c.Sub(cursor) / time.Second); fired+skipped != total || skipped <= 500 {
			t.Errorf("%s: %d fired and %d skipped of %d", expr, fired, skipped, total)
		}
		t.Logf("%s: %d fired, %d skipped", expr, fired, skipped)
	}
}

// TestCatchUpWorkBounded: a schedule a year behind costs no more to catch
// up than one a day behind: the policies' choice computes a bounded number
// of occurrences, counted (the walk computed all 31 M of @every 1s).
func TestCatchUpWorkBounded(t *testing.T) {
	cursor := utc("2025-01-01T00:00:00Z")
	year := 365 * 24 * 3600
	now := cursor.Add(sec(year) + 11*time.Hour + 500*time.Millisecond)
	last := cursor.Add(sec(year) + 11*time.Hour)
	// Every 10 s from 09:00 to 09:59:50 in Berlin (on the wall clock), a
	// year behind: the last 1,000 are 280 on 30 December and 360 on each
	// of the next two days.
	berlin := func(s string) time.Time {
		loc, _ := time.LoadLocation("Europe/Berlin")
		t, _ := time.ParseInLocation("2006-01-02 15:04:05", s, loc)
		return t
	}
	for _, tc := range []struct {
		cron, tz, policy string
		want             choice
		budget           int
	}{
		{"*/10 * 9 * * *", "Europe/Berlin", CatchUpLatest, choice{at: berlin("2026-01-01 09:59:50"), skipped: 10_000, floor: true}, 100_000},
		{"*/10 * 9 * * *", "Europe/Berlin", CatchUpAll, choice{at: berlin("2025-12-30 09:13:20"), skipped: 10_000, floor: true}, 100_000},
		{"*/10 * 9 * * *", "Europe/Berlin", CatchUpSkip, choice{at: berlin("2026-01-02 09:00:00"), skipped: 10_000, floor: true}, 100_000},
		{"@every 1s", "", CatchUpAll, choice{at: last.Add(-sec(MaxCatchUp - 1)), skipped: year + 11*3600 - MaxCatchUp}, 100},
		{"@every 1s", "", CatchUpLatest, choice{at: last, skipped: year + 11*3600 - 1}, 100},
		{"@every 1s", "", CatchUpSkip, choice{at: last.Add(time.Second), skipped: year + 11*3600}, 100},
		{"* * * * * *", "", CatchUpAll, choice{at: last.Add(-sec(MaxCatchUp - 1)), skipped: 10_000, floor: true}, 100_000},
		{"* * * * * *", "", CatchUpSkip, choice{at: last.Add(time.Second), skipped: 10_000, floor: true}, 100_000},
	} {
		s := mustParse(t, Def{Cron: tc.cron, TZ: tc.tz, CatchUp: tc.policy})
		c := countCalls(s, tc.budget)
		got := choose(s, cursor, now)
		if c.calls > tc.budget {
			t.Errorf("%s %s: more than %d occurrences computed", tc.cron, tc.policy, tc.budget)
		}
		t.Logf("%s %s %s: %d occurrences computed", tc.cron, tc.tz, tc.policy, c.calls)
		if !got.at.Equal(tc.want.at) || got.skipped != tc.want.skipped || got.floor != tc.want.floor {
			t.Errorf("%s %s: fires %s, skipped %d (floor %v); want %s, skipped %d (floor %v)", tc.cron, tc.policy,
				got.at.Format(time.RFC3339), got.skipped, got.floor, tc.want.at.Format(time.RFC3339), tc.want.skipped, tc.want.floor)
		}
	}
}

// TestCatchUpBursty: every second of the first day of each month, a year
// behind and two weeks past the last burst: the windows back from now
// find nothing for two weeks, then 86,400 in a day; the search still
// computes a bounded number of occurrences.
func TestCatchUpBursty(t *testing.T) {
	cursor := utc("2025-01-01T00:00:00Z")
	now := utc("2026-01-15T12:00:00Z").Add(500 * time.Millisecond)
	last := utc("2026-01-01T23:59:59Z")
	for _, tc := range []struct {
		policy string
		want   choice
	}{
		{CatchUpLatest, choice{at: last, skipped: 10_000, floor: true}},
		{CatchUpAll, choice{at: last.Add(-sec(MaxCatchUp - 1)), skipped: 10_000, floor: true}},
		{CatchUpSkip, choice{at: utc("2026-02-01T00:00:00Z"), skipped: 10_000, floor: true}},
	} {
		s := mustParse(t, Def{Cron: "* * * 1 * *", CatchUp: tc.policy})
		c := countCalls(s, 100_000)
		got := choose(s, cursor, now)
		t.Logf("%s: %d occurrences computed", tc.policy, c.calls)
		if c.calls > c.budget {
			t.Errorf("%s: more than %d occurrences computed", tc.policy, c.budget)
		}
		if !got.at.Equal(tc.want.at) || got.skipped != tc.want.skipped || got.floor != tc.want.floor {
			t.Errorf("%s: fires %s, skipped %d (floor %v); want %s, skipped %d (floor %v)", tc.policy,
				got.at.Format(time.RFC3339), got.skipped, got.floor, tc.want.at.Format(time.RFC3339), tc.want.skipped, tc.want.floor)
		}
	}
}

// liar is an every-second expression whose Next contradicts itself from
// a on: from there it says nothing comes before far, except from a+5s;
// and from the second before a it jumps to a+5s. The latest occurrence at
// or before a time between a+6s and far cannot be told.
type liar struct{ a, far time.Time }

func (l liar) Next(t time.Time) time.Time {
	switch {
	case t.Equal(l.a.Add(5 * time.Second)):
		return l.a.Add(6 * time.Second)
	case !t.Before(l.a) && t.Before(l.far):
		return l.far
	case !t.Before(l.a.Add(-time.Second)) && t.Before(l.a):
		return l.a.Add(5 * time.Second)
	}
	return t.Truncate(time.Second).Add(time.Second)
}

// TestCatchUpLost: a search that cannot find the policy's occurrence
// fires none of the stale ones: the first occurrence after now.
func TestCatchUpLost(t *testing.T) {
	cursor := utc("2026-01-01T00:00:00Z")
	now := cursor.Add(time.Hour)
	for _, policy := range []string{CatchUpLatest, CatchUpAll, CatchUpSkip} {
		s := mustParse(t, Def{Cron: "* * * * * *", CatchUp: policy})
		s.cron = liar{a: cursor.Add(30 * time.Minute), far: now.Add(time.Hour)}
		c := s.following(cursor, now)
		if !c.lost || !c.at.Equal(now.Add(time.Hour)) || c.skipped == 0 {
			t.Errorf("%s: %+v; want lost, at %s, some skipped", policy, c, now.Add(time.Hour))
		}
	}
}

// walked is following's choice worked out the slow way, as the
// materialiser's steps walk a schedule: missed are the occurrences after
// the cursor up to now, each from the one before.
func walked(s *Schedule, missed []time.Time, now time.Time) choice {
	if !missed[0].Before(now.Add(-s.grace)) {
		return choice{at: missed[0]}
	}
	last := len(missed) - 1
	switch s.CatchUp {
	case CatchUpAll:
		if len(missed) <= MaxCatchUp {
			return choice{at: missed[0]}
		}
		return choice{at: missed[len(missed)-MaxCatchUp], skipped: len(missed) - MaxCatchUp}
	case CatchUpSkip:
		return choice{at: s.next(missed[last]), skipped: len(missed)}
	}
	return choice{at: missed[last], skipped: last}
}

// TestCatchUpMatchesWalk compares the policies' choice, searched, with
// the walk of every occurrence, for expressions dense and sparse, even
// and bursty, by elapsed time and on the wall clock, across DST changes,
// with outages from one occurrence to 2,600 (short of countLimit, so the
// counts are exact; the walk is slow for hourly expressions in a zone).
func TestCatchUpMatchesWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	starts := []time.Time{
		utc("2026-03-28T20:00:00Z"), utc("2026-10-24T20:00:00Z"), // Europe's DST changes
		utc("2026-03-07T20:00:00Z"), utc("2026-11-01T02:00:00Z"), // America's
		utc("2026-04-04T12:00:00Z"), // Australia's autumn
	}
	for _, tc := range []struct {
		cron, tz string
		most     int // occurrences missed at most
	}{
		{"@every 7s", "Europe/Berlin", 2600},
		{"* * * * * *", "", 2600},
		{"*/15 * * * * *", "America/New_York", 2600},
		{"0 * * * *", "Europe/Berlin", 1100},
		{"30 * * * *", "Australia/Sydney", 600},
		{"30 2 * * *", "Europe/Berlin", 1100},
		{"*/10 * 2 * * *", "Europe/Berlin", 2600},
		{"0 9 * * 1-5", "America/New_York", 1100},
		{"*/30 * 0 1 * *", "", 1800}, // 120 in the first hour of each month, then nothing
		{"0 0 29 2 *", "", 5},        // every four years
	} {
		var policies []*Schedule
		for _, policy := range []string{CatchUpLatest, CatchUpAll, CatchUpSkip} {
			policies = append(policies, mustParse(t, Def{Cron: tc.cron, TZ: tc.tz, CatchUp: policy, Grace: "0s"}))
		}
		s := policies[0]
		for k := range 12 {
			var from time.Time
			if k < len(starts) {
				from = starts[k].Add(-time.Duration(rng.Int64N(int64(48 * time.Hour))))
			} else {
				from = utc("2024-01-01T00:00:00Z").Add(time.Duration(rng.Int64N(int64(3 * 365 * 24 * time.Hour))))
			}
			cursor := s.next(from)
			// now: between the n-th occurrence after the cursor and the
			// next; n a few, about MaxCatchUp, or any up to most.
			n := min(tc.most, []int{1 + rng.IntN(50), MaxCatchUp - 2 + rng.IntN(5), 1 + rng.IntN(tc.most)}[k%3])
			var missed []time.Time
			for at := cursor; len(missed) < n; {
				at = s.next(at)
				missed = append(missed, at)
			}
			now := missed[n-1].Add(time.Duration(rng.Int64N(int64(s.next(missed[n-1]).Sub(missed[n-1])))))
			for _, s := range policies {
				want := walked(s, missed, now)
				c := s.following(cursor, now)
				got := choice{at: c.at, skipped: c.skipped, floor: c.floor}
				if c.lost || !got.at.Equal(want.at) || got.skipped != want.skipped || got.floor {
					t.Errorf("%s %s %s, cursor %s, now %s (%d after it): fires %s, skipped %d (floor %v, lost %v); the walk: %s, skipped %d",
						tc.cron, tc.tz, s.CatchUp, cursor.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339Nano), n,
						got.at.UTC().Format(time.RFC3339), got.skipped, got.floor, c.lost, want.at.UTC().Format(time.RFC3339), want.skipped)
				}
			}
		}
	}
}
