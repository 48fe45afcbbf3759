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

// runRate: K ready dispatchers, a producer that only ZADDs rate tasks a
// second, each a second ahead of its due time, spread evenly over the
// point's queues; lateness is the headline.
func (r *runner) runRate(ctx context.Context, p Point) (*Result, error) {
	d := time.Duration(r.opt.Duration)
	total := int(int64(p.Rate) * d.Milliseconds() / 1000)
	m, err := r.newMeasurement(p, total)
	if err != nil {
		return nil, err
	}
	defer m.close()
	if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
		return m.res, err
	}
	if err := m.fleet.waitReady(ctx); err != nil {
		return m.res, err
	}
	if !sleepCtx(ctx, warmUp) {
		return m.res, ctx.Err()
	}
	cpu0, _, err := m.fleet.usage()
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
	waitErr := m.wait(waitCtx, func() string {
		return fmt.Sprintf(", %s scheduled", thousands(int(scheduled.Load())))
	})
	out := <-done
	if out.err != nil {
		return m.res, out.err
	}
	if waitErr != nil {
		return m.res, waitErr
	}
	if err := m.finish(ctx, before, out.own, cpu0, began); err != nil {
		return m.res, err
	}
	return m.res, nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool { return wait.For(ctx, d) }
