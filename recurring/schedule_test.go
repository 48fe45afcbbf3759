package recurring

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func mustParse(t *testing.T, d Def) *Schedule {
	t.Helper()
	if d.Queue == "" {
		d.Queue, d.Name = "q", "s"
	}
	s, err := Parse(d)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// occurrences lists the n occurrences after from.
func occurrences(s *Schedule, from time.Time, n int) []string {
	var out []string
	for t := from; len(out) < n; {
		t = s.NextAfter(t)
		out = append(out, t.UTC().Format(time.RFC3339))
	}
	return out
}

// TestDSTOccurrences checks daily and hourly schedules across both DST
// changes of a year in two named zones against occurrences worked out by
// hand (pure arithmetic: the clock is the argument).
func TestDSTOccurrences(t *testing.T) {
	for _, tc := range []struct {
		name, cron, tz, from string
		want                 []string
	}{
		{"daily 09:00 Berlin, spring", "0 9 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z",
			[]string{"2026-03-28T08:00:00Z", "2026-03-29T07:00:00Z", "2026-03-30T07:00:00Z"}},
		{"daily 09:00 Berlin, autumn", "0 9 * * *", "Europe/Berlin", "2026-10-23T12:00:00Z",
			[]string{"2026-10-24T07:00:00Z", "2026-10-25T08:00:00Z", "2026-10-26T08:00:00Z"}},
		// 02:30 does not exist on 29 March: it runs at the jump, 03:00 CEST.
		{"daily 02:30 Berlin, skipped hour", "30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z",
			[]string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"}},
		// 02:30 happens twice on 25 October: it runs once, in the first pass (CEST).
		{"daily 02:30 Berlin, repeated hour", "30 2 * * *", "Europe/Berlin", "2026-10-23T12:00:00Z",
			[]string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"}},
		// Every hour at :30 runs by elapsed time: twice in the repeated hour.
		{"hourly :30 Berlin, repeated hour", "30 * * * *", "Europe/Berlin", "2026-10-24T23:00:00Z",
			[]string{"2026-10-24T23:30:00Z", "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-25T02:30:00Z"}},
		// and skips the hour that does not exist.
		{"hourly :30 Berlin, skipped hour", "30 * * * *", "Europe/Berlin", "2026-03-28T23:45:00Z",
			[]string{"2026-03-29T00:30:00Z", "2026-03-29T01:30:00Z", "2026-03-29T02:30:00Z"}},
		{"daily 01:30 New York, autumn (01:30 twice)", "30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z",
			[]string{"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"}},
		{"daily 02:30 New York, spring (02:30 skipped)", "30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z",
			[]string{"2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"}},
		{"seconds field", "*/15 * * * * *", "", "2026-01-01T00:00:05Z",
			[]string{"2026-01-01T00:00:15Z", "2026-01-01T00:00:30Z"}},
		{"@every 90s", "@every 90s", "Europe/Berlin", "2026-03-29T00:59:00Z",
			[]string{"2026-03-29T01:00:30Z", "2026-03-29T01:02:00Z"}},
		{"@daily in a zone", "@daily", "Asia/Tokyo", "2026-05-01T00:00:00Z",
			[]string{"2026-05-01T15:00:00Z", "2026-05-02T15:00:00Z"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustParse(t, Def{Cron: tc.cron, TZ: tc.tz})
			got := occurrences(s, utc(tc.from), len(tc.want))
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("occurrences after %s:\n got %v\nwant %v", tc.from, got, tc.want)
			}
		})
	}
}

// TestDSTNoOccurrenceTwice walks a daily fixed-time schedule in every zone
// the test knows over two years, one step at a time as the materialiser
// does (each occurrence from the one before): strictly increasing, one per
// local day.
func TestDSTNoOccurrenceTwice(t *testing.T) {
	for _, tz := range []string{"Europe/Berlin", "America/New_York", "Australia/Sydney", "Europe/London", "America/Santiago"} {
		for _, expr := range []string{"30 2 * * *", "0 0 * * *", "59 1 * * *"} {
			s := mustParse(t, Def{Cron: expr, TZ: tz})
			days := map[string]bool{}
			prev := utc("2026-01-01T00:00:00Z")
			for range 730 {
				n := s.NextAfter(prev)
				if !n.After(prev) {
					t.Fatalf("%s %s: %s after %s", tz, expr, n, prev)
				}
				day := n.In(s.loc).Format("2006-01-02")
				if days[day] {
					t.Fatalf("%s %s: two occurrences on %s (%s)", tz, expr, day, n)
				}
				days[day] = true
				prev = n
			}
			if len(days) != 730 {
				t.Errorf("%s %s: %d days", tz, expr, len(days))
			}
		}
	}
}

// TestCatchUp checks the outage policies' choice after an outage.
func TestCatchUp(t *testing.T) {
	cursor := utc("2026-01-01T00:00:00Z") // the last occurrence materialised
	every10 := Def{Cron: "@every 10s", Grace: "5s"}
	for _, tc := range []struct {
		policy      string
		now         string
		want        string
		wantSkipped int
	}{
		{"latest", "2026-01-01T00:00:12Z", "2026-01-01T00:00:10Z", 0}, // 2s late: within the grace
		{"skip", "2026-01-01T00:00:14Z", "2026-01-01T00:00:10Z", 0},
		{"latest", "2026-01-01T00:00:55Z", "2026-01-01T00:00:50Z", 4}, // 10..40 skipped, 50 fires
		{"all", "2026-01-01T00:00:55Z", "2026-01-01T00:00:10Z", 0},    // every one, in turn
		{"skip", "2026-01-01T00:00:55Z", "2026-01-01T00:01:00Z", 5},   // none of 10..50
		{"", "2026-01-01T00:00:55Z", "2026-01-01T00:00:50Z", 4},       // the default is latest
		{"all", "2026-01-02T00:00:00Z", "2026-01-01T21:13:30Z", 7640}, // the last MaxCatchUp of 8,640
	} {
		d := every10
		d.CatchUp = tc.policy
		s := mustParse(t, d)
		c := s.following(cursor, utc(tc.now))
		got, skipped := c.at, c.skipped
		if !got.Equal(utc(tc.want)) || skipped != tc.wantSkipped {
			t.Errorf("%s at %s: %s (skipped %d), want %s (skipped %d)", tc.policy, tc.now, got.UTC().Format(time.RFC3339), skipped, tc.want, tc.wantSkipped)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct {
		d    Def
		want string
	}{
		{Def{Name: "a", Cron: "61 * * * *"}, `q/a: cron "61 * * * *"`},
		{Def{Name: "a", Cron: "* * *"}, `q/a: cron "* * *"`},
		{Def{Name: "a", Cron: "0 9 * * *", TZ: "Mars/Olympus"}, `q/a: time zone "Mars/Olympus": unknown`},
		{Def{Name: "a", Cron: "@every 100ms"}, "whole seconds"},
		{Def{Name: "a", Cron: "@every 1500ms"}, "whole seconds"},
		{Def{Name: "a", Cron: "CRON_TZ=Europe/Berlin 0 9 * * *"}, "give the zone as tz"},
		{Def{Name: "a", Cron: "@daily", CatchUp: "sometimes"}, `catchup "sometimes"`},
		{Def{Name: "a", Cron: "@daily", Grace: "soon"}, `grace "soon"`},
		{Def{Name: "a b", Cron: "@daily"}, `name "a b"`},
		{Def{Name: "a", Cron: "@daily", Properties: `{"priority": 300}`}, "q/a: properties: priority 300"},
		{Def{Name: "a", Cron: "@daily", Properties: `{"prio": 3}`}, `q/a: properties: unknown field "prio"`},
		{Def{Name: "a", Cron: "@daily", Properties: `{"headers": {"x-task-id": "t"}}`}, `q/a: properties: headers: "x-task-id" is reserved`},
		{Def{Name: "a", Cron: "@daily", Properties: `{"content_type": 5}`}, `q/a: properties: field "content_type"`},
		{Def{Name: "a", Cron: "@daily", Properties: `["x"]`}, "q/a: properties are not a JSON object"},
		{Def{Name: "a", Cron: "@daily", Properties: `{"deadline_ms": 1900000000000}`}, "q/a: properties: deadline_ms 1900000000000"},
	} {
		tc.d.Queue = "q"
		_, err := Parse(tc.d)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%+v) = %v, want an ErrInvalid containing %q", tc.d, err, tc.want)
		}
	}
	if _, err := Parse(Def{Queue: "q", Name: "a", Cron: "* * * * * *"}); err != nil {
		t.Errorf("every second: %v", err)
	}
	if s, err := Parse(Def{Queue: "q", Name: "a", Cron: "@daily", Properties: `{"routing_key": "r", "priority": 5}`}); err != nil || string(s.Props()) != `{"routing_key":"r","priority":5}` {
		t.Errorf("with properties: %v, props %s", err, s.Props())
	}
	if s, err := Parse(Def{Queue: "q", Name: "a", Cron: "@daily", Properties: `{}`}); err != nil || s.Props() != nil {
		t.Errorf("with empty properties: %v, props %q (want none written)", err, s.Props())
	}
}
