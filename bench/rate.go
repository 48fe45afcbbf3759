package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dispatcher/dispatcher/internal/wait"
)

// warmUp lets freshly started instances finish their first sweep before
// anything is measured.
const warmUp = 500 * time.Millisecond

// overloadGrace is how long past the target a scale step waits, after
// the last due time, before it judges the instances overloaded.
const overloadGrace = time.Second

// rateRun is how a rate run goes besides its point.
type rateRun struct {
	// cutAfter, when not 0, cuts the run short (a scale step) when the
	// instances have not dispatched 99% of its tasks cutAfter plus
	// overloadGrace after the last due time: the rest would be later
	// than cutAfter, more than the 1% a p99 allows. What is left is
	// counted as abandoned, not missing.
	cutAfter time.Duration
	// floor measures the floor after the point (-floor).
	floor bool
}

// runRate: K ready dispatchers, a producer that only ZADDs rate tasks a
// second, each a second ahead of its due time, spread evenly over the
// point's queues; lateness is the headline.
func (r *runner) runRate(ctx context.Context, p Point) (*Result, error) {
	return r.runRateFor(ctx, p, time.Duration(r.opt.Duration), rateRun{floor: r.opt.Floor})
}

// runRateFor runs a rate point whose tasks are scheduled over d.
func (r *runner) runRateFor(ctx context.Context, p Point, d time.Duration, how rateRun) (*Result, error) {
	total := int(int64(p.Rate) * d.Milliseconds() / 1000)
	m, err := r.newMeasurement(p, total)
	if err != nil {
		return nil, err
	}
	defer m.close()
	m.traffic, m.floor = d, how.floor
	if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
		return m.res, err
	}
	if err := m.fleet.waitReady(ctx); err != nil {
		return m.res, err
	}
	if !sleepCtx(ctx, warmUp) {
		return m.res, ctx.Err()
	}
	cpu0, err := m.startUsage()
	if err != nil {
		return m.res, err
	}
	before, err := readCmdStats(ctx, r.rdb)
	if err != nil {
		return m.res, err
	}
	began := time.Now()
	var scheduled atomic.Int64
	type produced struct {
		own []cmdStats
		err error
	}
	done := make(chan produced, 1)
	waitCtx, stopWaiting := context.WithCancel(ctx)
	defer stopWaiting()
	go func() {
		z, err := produce(ctx, r.rdb, m.queueKeys(), p, d, began, &scheduled,
			time.Duration(r.opt.Ahead), r.opt.Wake)
		if err != nil {
			stopWaiting() // what was not scheduled will not come
		}
		done <- produced{z, err}
	}()
	var overloaded atomic.Bool
	if how.cutAfter > 0 {
		lastDue := began.Add(time.Duration(r.opt.Ahead) + d)
		fl := m.fleet
		go func() {
			if !sleepCtx(waitCtx, time.Until(lastDue.Add(how.cutAfter+overloadGrace))) {
				return
			}
			if n, err := fl.sum(metricDispatched); err == nil && n < 0.99*float64(total) {
				overloaded.Store(true)
				stopWaiting()
			}
		}()
	}
	waitErr := m.wait(waitCtx, func() string {
		return fmt.Sprintf(", %s scheduled", thousands(int(scheduled.Load())))
	})
	out := <-done
	if out.err != nil {
		return m.res, out.err
	}
	if overloaded.Load() && ctx.Err() == nil {
		waitErr = nil
	}
	if waitErr != nil {
		return m.res, waitErr
	}
	if err := m.finish(ctx, before, out.own, cpu0, began); err != nil {
		return m.res, err
	}
	if overloaded.Load() {
		m.res.Abandoned, m.res.Missing = m.res.Missing, 0
	}
	return m.res, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool { return wait.For(ctx, d) }
