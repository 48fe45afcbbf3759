package tests

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/config"
)

// TestRateLimit drains a backlog under DISPATCHER_QUEUE_<NAME>_MAX_RATE with
// 1, 2 and 4 instances: every task arrives, none early, and the instances
// together keep to the limit. The achieved rate and the busiest second are
// logged (RATE lines), by the publish stamps; the check allows the bucket's
// burst (a tenth of a second's worth) and a tenth more, since this is a
// shared machine.
func TestRateLimit(t *testing.T) {
	const rate, n = 200.0, 800 // 4 s of work
	for _, instances := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(instances), func(t *testing.T) {
			h := newHarness(t, queueSpec{Name: "rl", Shards: 8})
			h.extra[config.QueuePrefix("rl")+"_MAX_RATE"] = fmt.Sprint(rate)
			// Measured where the limit acts: when each batch's publish began
			// (the consumer's receipts bunch up on a loaded machine).
			h.extra["DISPATCHER_STAMP_PUBLISHED"] = "true"
			// The backlog is there before any instance starts: an outage.
			want := scheduleSpread(t, h.producer("rl"), "r", n, time.Now().Add(-time.Minute), time.Second)
			var ps []*proc
			for range instances {
				ps = append(ps, h.start())
			}
			for _, p := range ps {
				waitLogged(t, p, "broker connected", 15*time.Second)
			}
			got := h.collect("rl", n, 30*time.Second)
			ids, _ := countIDs(got)
			if miss := missing(want, ids); len(miss) > 0 {
				t.Fatalf("%d of %d tasks missing", len(miss), n)
			}
			at := publishTimes(t, got)
			span := at[len(at)-1].Sub(at[0])
			achieved := float64(len(at)-1) / span.Seconds()
			most := busiestSecond(at)
			t.Logf("RATE instances=%d limit=%.0f/s tasks=%d drained_in=%s achieved=%.1f/s (%.3f of the limit) busiest_second=%d",
				instances, rate, n, span.Round(time.Millisecond), achieved, achieved/rate, most)
			if burst := rate / 10; float64(most) > 1.1*rate+burst {
				t.Errorf("%d tasks in one second with a limit of %.0f/s (burst %.0f)", most, rate, burst)
			}
			if achieved > 1.1*rate {
				t.Errorf("drained at %.1f tasks/s with a limit of %.0f/s", achieved, rate)
			}
		})
	}
}

// TestRateLimitBurstClaimedAhead: tasks due at one instant, scheduled well
// ahead, with a look-ahead of 2 s, go out within the rate limit from their
// due time on. (Claims used to take the tokens when they claimed ahead, so
// everything claimed before the instant went out at it: 159 tasks in the
// first second at a limit of 100.)
func TestRateLimitBurstClaimedAhead(t *testing.T) {
	const rate, n = 100.0, 300
	h := newHarness(t, queueSpec{Name: "rb", Shards: 4})
	h.extra[config.QueuePrefix("rb")+"_MAX_RATE"] = fmt.Sprint(rate)
	h.extra["DISPATCHER_LOOKAHEAD"] = "2s"
	h.extra["DISPATCHER_STAMP_PUBLISHED"] = "true"
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	due := time.Now().Add(4 * time.Second).Truncate(time.Millisecond)
	want := scheduleSpread(t, h.producer("rb"), "b", n, due, 0)
	got := h.collect("rb", n, 30*time.Second)
	ids, _ := countIDs(got)
	if miss := missing(want, ids); len(miss) > 0 {
		t.Fatalf("%d of %d tasks missing", len(miss), n)
	}
	at := publishTimes(t, got)
	most := busiestSecond(at)
	t.Logf("RATE burst limit=%.0f/s tasks=%d due at one instant, look-ahead 2s: busiest_second=%d, first publish %s after the due time",
		rate, n, most, at[0].Sub(due).Round(time.Millisecond))
	if burst := rate / 10; float64(most) > 1.1*rate+burst {
		t.Errorf("%d tasks in one second with a limit of %.0f/s (burst %.0f)", most, rate, burst)
	}
	if at[0].Before(due) {
		t.Errorf("first publish %s before the due time", due.Sub(at[0]))
	}
}

// publishTimes returns when each distinct task's publish began
// (x-published-us), in order.
func publishTimes(t *testing.T, got []received) []time.Time {
	t.Helper()
	var at []time.Time
	seen := map[string]bool{}
	for _, r := range got {
		us, ok := r.d.Headers["x-published-us"].(int64)
		if !ok {
			t.Fatalf("delivery without x-published-us: %v", r.d.Headers)
		}
		if !seen[r.d.MessageId] {
			seen[r.d.MessageId] = true
			at = append(at, time.UnixMicro(us))
		}
	}
	sort.Slice(at, func(a, b int) bool { return at[a].Before(at[b]) })
	return at
}

// busiestSecond is the most publishes in a window of one second, anywhere.
func busiestSecond(at []time.Time) int {
	most := 0
	for a, b := 0, 0; a < len(at); a++ {
		for b < len(at) && at[b].Sub(at[a]) < time.Second {
			b++
		}
		most = max(most, b-a)
	}
	return most
}
