package recurring

import (
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
	at, k := s.following(cursor, now)
	return choice{at: at, skipped: k}
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

// TestCatchUpWorkBounded: a schedule a year behind costs no more to catch
// up than one a day behind: the policies' choice computes a bounded number
// of occurrences, counted (the walk computed all 31 M of @every 1s).
func TestCatchUpWorkBounded(t *testing.T) {
	cursor := utc("2025-01-01T00:00:00Z")
	year := 365 * 24 * 3600
	now := cursor.Add(sec(year) + 500*time.Millisecond)
	last := cursor.Add(sec(year))
	for _, tc := range []struct {
		cron, policy string
		want         choice
		budget       int
	}{
		{"@every 1s", CatchUpAll, choice{at: last.Add(-sec(MaxCatchUp - 1)), skipped: year - MaxCatchUp}, 100},
		{"@every 1s", CatchUpLatest, choice{at: last, skipped: year - 1}, 100},
		{"@every 1s", CatchUpSkip, choice{at: last.Add(time.Second), skipped: year}, 100},
		{"* * * * * *", CatchUpAll, choice{at: last.Add(-sec(MaxCatchUp - 1)), skipped: 10_000, floor: true}, 100_000},
		{"* * * * * *", CatchUpSkip, choice{at: last.Add(time.Second), skipped: 10_000, floor: true}, 100_000},
	} {
		s := mustParse(t, Def{Cron: tc.cron, CatchUp: tc.policy})
		c := countCalls(s, tc.budget)
		got := choose(s, cursor, now)
		if c.calls > tc.budget {
			t.Errorf("%s %s: more than %d occurrences computed", tc.cron, tc.policy, tc.budget)
		}
		if !got.at.Equal(tc.want.at) || got.skipped != tc.want.skipped || got.floor != tc.want.floor {
			t.Errorf("%s %s: fires %s, skipped %d (floor %v); want %s, skipped %d (floor %v)", tc.cron, tc.policy,
				got.at.Format(time.RFC3339), got.skipped, got.floor, tc.want.at.Format(time.RFC3339), tc.want.skipped, tc.want.floor)
		}
	}
}
