package bench

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
)

// Scale mode's bounds: the slowest rate it tries (a step of 8 s then has
// some 800 tasks, enough for a p99) and the fastest.
const (
	minScaleRate = 100
	maxScaleRate = 1_000_000
)

// ScaleResult is one scale point: for one instance count (and the other
// settings), the highest steady rate whose lateness p99 held the target,
// found by short rate runs (Steps).
type ScaleResult struct {
	Point
	TargetP99Ms float64 `json:"target_p99_ms"`
	// View is the lateness judged: "dispatch" (x-published-us), or
	// "consumer" when the dispatcher does not stamp.
	View        string  `json:"view"`
	StepSeconds float64 `json:"step_seconds"`
	// BestRate is the highest rate that held (0: none did), BestStep
	// its step (-1: none), whose figures hold the instances' shares and
	// CPU; Best is that step's result.
	BestRate int          `json:"best_rate"`
	BestStep int          `json:"best_step"`
	Best     *Result      `json:"-"`
	Steps    []*ScaleStep `json:"steps"`
	// Floor is the AMQP library's floor at Best's cadence (-floor).
	Floor  *Floor   `json:"floor,omitempty"`
	Errors []string `json:"errors,omitempty"`
}

// ScaleStep is one rate run of a scale point and its verdict.
type ScaleStep struct {
	Rate int  `json:"rate"`
	Held bool `json:"held"`
	// P99Ms is the judged view's p99 over the tasks due after the
	// first second; Why says why a step did not hold.
	P99Ms  float64 `json:"p99_ms"`
	Why    string  `json:"why,omitempty"`
	Result *Result `json:"result"`
}

// rateSearch finds the highest rate that holds: from start it doubles
// the rate until one fails (or halves it until one holds), then bisects
// between the highest that held and the lowest that failed until they
// are within precision of each other, in at most maxSteps runs. It
// assumes that a rate holds when a higher one did.
type rateSearch struct {
	start, minRate, maxRate int
	precision               float64
	maxSteps, steps         int
	held, failed            int // highest that held, lowest that failed; 0: none yet
}

func newRateSearch(start, minRate, maxRate, maxSteps int, precision float64) *rateSearch {
	return &rateSearch{start: min(max(start, minRate), maxRate), minRate: minRate, maxRate: maxRate,
		maxSteps: maxSteps, precision: precision}
}

// next is the rate to try next; ok is false when the search is over.
func (s *rateSearch) next() (rate int, ok bool) {
	if s.steps >= s.maxSteps {
		return 0, false
	}
	switch {
	case s.held == 0 && s.failed == 0:
		return s.start, true
	case s.failed == 0: // every one held so far
		if s.held >= s.maxRate {
			return 0, false
		}
		return min(2*s.held, s.maxRate), true
	case s.held == 0: // every one failed so far
		if s.failed <= s.minRate {
			return 0, false
		}
		return max(s.failed/2, s.minRate), true
	}
	if float64(s.failed) <= float64(s.held)*(1+s.precision) {
		return 0, false
	}
	mid := roundRate((s.held + s.failed) / 2)
	if mid <= s.held || mid >= s.failed {
		mid = (s.held + s.failed) / 2
	}
	if mid <= s.held || mid >= s.failed {
		return 0, false
	}
	return mid, true
}

// record takes a run's verdict.
func (s *rateSearch) record(rate int, held bool) {
	s.steps++
	if held {
		s.held = max(s.held, rate)
	} else if s.failed == 0 || rate < s.failed {
		s.failed = rate
	}
}

// roundRate rounds a rate to two significant digits, as a person would
// pick it.
func roundRate(r int) int {
	if r < 100 {
		return r
	}
	unit := int(math.Pow(10, math.Floor(math.Log10(float64(r)))-1))
	return (r + unit/2) / unit * unit
}

// judge says whether a step held the target: every task dispatched (not
// cut short, none missing), no error, and the view's p99 over the tasks
// due after the first second within the target.
func judge(res *Result, stamps bool, target time.Duration) (held bool, p99Ms float64, why string) {
	w := res.AfterFirstSecond
	var d *Dist
	if w != nil {
		d = &w.Lateness
		if stamps {
			d = w.DispatchLateness
		}
	}
	if d != nil {
		p99Ms = d.P99
	}
	targetMs := float64(target) / float64(time.Millisecond)
	switch {
	case res.Abandoned > 0:
		return false, p99Ms, fmt.Sprintf("overloaded: %s of %s tasks not dispatched %s after the last due time",
			thousands(res.Abandoned), thousands(res.Scheduled), target+overloadGrace)
	case res.Missing > 0:
		return false, p99Ms, fmt.Sprintf("%s tasks missing", thousands(res.Missing))
	case len(res.Errors) > 0:
		return false, p99Ms, res.Errors[0]
	case d == nil || d.Count == 0:
		return false, p99Ms, "no lateness measured after the first second"
	case p99Ms > targetMs:
		return false, p99Ms, fmt.Sprintf("p99 %s ms over %s ms", fmtMs(p99Ms), fmtMs(targetMs))
	}
	return true, p99Ms, ""
}

// runScale searches the highest rate that holds for the point's instance
// count; a later count starts at 1.5 times the best of the one before.
func (r *runner) runScale(ctx context.Context, p Point) (*ScaleResult, error) {
	step := time.Duration(r.opt.ScaleStep)
	target := time.Duration(r.opt.ScaleP99)
	sr := &ScaleResult{Point: p, TargetP99Ms: float64(target) / float64(time.Millisecond), View: "dispatch", StepSeconds: step.Seconds(), BestStep: -1}
	if !r.stamps {
		sr.View = "consumer"
	}
	start := r.opt.Rates[0]
	if r.scaleBest > 0 {
		start = roundRate(r.scaleBest * 3 / 2)
	}
	search := newRateSearch(start, minScaleRate, maxScaleRate, r.opt.ScaleSteps, r.opt.ScalePrecision)
	for {
		rate, ok := search.next()
		if !ok {
			break
		}
		sp := p
		sp.Mode, sp.Rate = modeRate, rate
		r.prog.printf("  step %d: %s\n", search.steps+1, sp)
		res, err := r.runRateFor(ctx, sp, step, rateRun{cutAfter: target})
		if err != nil {
			return sr, err
		}
		held, p99, why := judge(res, r.stamps, target)
		search.record(rate, held)
		sr.Steps = append(sr.Steps, &ScaleStep{Rate: rate, Held: held, P99Ms: p99, Why: why, Result: res})
		// Missing, duplicate or early tasks fail the run, as elsewhere
		// (a step cut short has abandoned tasks, not missing ones).
		sr.Errors = append(sr.Errors, res.failures()...)
		verdict := "held"
		if !held {
			verdict = "did not hold: " + why
		}
		r.prog.printf("    => %s/s: %s p99 %s ms after the first second; %s\n", thousands(rate), sr.View, fmtMs(p99), verdict)
		if held && rate > sr.BestRate {
			sr.BestRate, sr.Best, sr.BestStep = rate, res, len(sr.Steps)-1
		}
	}
	r.scaleBest = sr.BestRate
	if r.opt.Floor && sr.Best != nil {
		f, err := r.floorAfter(ctx, sr.Best, step)
		if err != nil {
			return sr, err
		}
		sr.Floor = f
	}
	return sr, nil
}

// floorAfter measures the floor at a finished point's cadence, on an
// exchange and consumer queue of its own (the point's are gone), set up
// as the point's were.
func (r *runner) floorAfter(ctx context.Context, res *Result, d time.Duration) (*Floor, error) {
	if res.cadence == nil {
		return nil, fmt.Errorf("%s: no cadence for the floor", res.Point)
	}
	name := r.name("floor")
	keys := queueNames(max(res.Queues, 1))
	sk, err := openSink(r.opt, name, keys, newRecorder(0, 1, r.earlyUs))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := sk.close(); err != nil {
			r.warnf("floor: delete queue and exchange: %v", err)
		}
	}()
	f, err := r.measureFloor(ctx, sk, keys, res.Size, *res.cadence, d)
	if err != nil {
		return nil, err
	}
	f.compare(res.CPUPer10k)
	r.prog.printf("    => %s\n", floorText(f))
	return f, nil
}

// scaleText is a scale point's summary line.
func scaleText(sr *ScaleResult) string {
	if sr.Best == nil {
		return fmt.Sprintf("  => %s: no rate held %s p99 ≤ %s ms", sr.Point, sr.View, fmtMs(sr.TargetP99Ms))
	}
	b := sr.Best
	return fmt.Sprintf("  => %s: highest rate that held %s/s (%s p99 %s ms), shares %s, CPU %% of a core %s",
		sr.Point, thousands(sr.BestRate), sr.View, fmtMs(sr.Steps[sr.BestStep].P99Ms),
		joinFloats(b.SharePercentEach, "%.0f%%"), joinFloats(b.CPUPercentEach, "%.1f"))
}

func joinFloats(vs []float64, format string) string {
	if len(vs) == 0 {
		return "-"
	}
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(parts, " / ")
}
