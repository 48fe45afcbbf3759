package bench

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// search runs a rateSearch against a machine that holds every rate up to
// capacity, and returns the rates it tried and the highest that held.
func search(start, capacity, maxSteps int, precision float64) (tried []int, held int) {
	s := newRateSearch(start, minScaleRate, maxScaleRate, maxSteps, precision)
	for {
		r, ok := s.next()
		if !ok {
			return tried, s.held
		}
		tried = append(tried, r)
		s.record(r, r <= capacity)
	}
}

func TestRateSearch(t *testing.T) {
	for _, c := range []struct {
		start, capacity, maxSteps int
	}{
		{2000, 1234, 20},    // down, then bisect
		{500, 7300, 20},     // up, then bisect
		{2000, 2000, 20},    // exactly the start
		{1000, 999_999, 30}, // up to near the top
	} {
		tried, held := search(c.start, c.capacity, c.maxSteps, 0.1)
		if tried[0] != c.start {
			t.Errorf("%+v: first try %d", c, tried[0])
		}
		// The answer holds, and the next rate tried above it failed
		// within 10%: the highest that held is within 10% of capacity.
		if held > c.capacity || float64(held)*1.1 < float64(c.capacity) {
			t.Errorf("%+v: found %d after %v", c, held, tried)
		}
		if len(tried) > c.maxSteps {
			t.Errorf("%+v: %d steps", c, len(tried))
		}
		seen := map[int]bool{}
		for _, r := range tried {
			if seen[r] {
				t.Errorf("%+v: %d tried twice in %v", c, r, tried)
			}
			seen[r] = true
		}
	}

	// The first steps double or halve the rate.
	if tried, _ := search(2000, 300, 3, 0.1); !slices.Equal(tried, []int{2000, 1000, 500}) {
		t.Errorf("down: %v", tried)
	}
	if tried, _ := search(500, 100_000, 3, 0.1); !slices.Equal(tried, []int{500, 1000, 2000}) {
		t.Errorf("up: %v", tried)
	}
	// Bisecting: between 1,000 (held) and 2,000 (failed), 1,500, and so
	// on, rounded to two digits.
	if tried, held := search(2000, 1100, 20, 0.1); !slices.Equal(tried, []int{2000, 1000, 1500, 1300, 1200, 1100}) || held != 1100 {
		t.Errorf("bisect: %v, %d", tried, held)
	}
	// Out of steps: the best so far.
	if tried, held := search(2000, 1100, 4, 0.1); len(tried) != 4 || held != 1000 {
		t.Errorf("4 steps: %v, %d", tried, held)
	}
	// Nothing holds: it stops at the slowest rate; everything holds: at
	// the fastest.
	if tried, held := search(400, 0, 20, 0.1); held != 0 || tried[len(tried)-1] != minScaleRate {
		t.Errorf("none holds: %v, %d", tried, held)
	}
	if tried, held := search(400_000, maxScaleRate, 20, 0.1); held != maxScaleRate || len(tried) != 3 {
		t.Errorf("all hold: %v, %d", tried, held)
	}
}

func TestRoundRate(t *testing.T) {
	for in, want := range map[int]int{55: 55, 150: 150, 1250: 1300, 1149: 1100, 23456: 23000, 999_999: 1_000_000} {
		if got := roundRate(in); got != want {
			t.Errorf("roundRate(%d) = %d, want %d", in, got, want)
		}
	}
}

func TestJudge(t *testing.T) {
	after := func(dispatchP99, consumerP99 float64) *Window {
		return &Window{Tasks: 100, Lateness: Dist{Count: 100, P99: consumerP99}, DispatchLateness: &Dist{Count: 100, P99: dispatchP99}}
	}
	target := 50 * time.Millisecond
	for _, c := range []struct {
		name   string
		res    Result
		stamps bool
		held   bool
		p99    float64
		why    string
	}{
		{"held", Result{AfterFirstSecond: after(40, 80)}, true, true, 40, ""},
		{"over", Result{AfterFirstSecond: after(60, 70)}, true, false, 60, "p99 60.0 ms over 50.0 ms"},
		{"consumer view", Result{AfterFirstSecond: after(10, 70)}, false, false, 70, "p99 70.0 ms"},
		{"overloaded", Result{Scheduled: 8000, Abandoned: 3000, AfterFirstSecond: after(10, 10)}, true, false, 10, "overloaded: 3,000 of 8,000 tasks not dispatched 1.05s after"},
		{"missing", Result{Missing: 2, AfterFirstSecond: after(10, 10)}, true, false, 10, "2 tasks missing"},
		{"errors", Result{Errors: []string{"boom"}, AfterFirstSecond: after(10, 10)}, true, false, 10, "boom"},
		{"nothing", Result{}, true, false, 0, "no lateness measured"},
	} {
		held, p99, why := judge(&c.res, c.stamps, target)
		if held != c.held || p99 != c.p99 || !strings.Contains(why, c.why) || (c.held && why != "") {
			t.Errorf("%s: %v, %v, %q; want %v, %v, %q", c.name, held, p99, why, c.held, c.p99, c.why)
		}
	}
}
