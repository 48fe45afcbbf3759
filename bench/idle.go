package bench

import (
	"context"
	"fmt"
	"time"
)

// runIdle: K ready dispatchers with nothing due (an empty queue, or only
// tasks due in an hour) for the idle duration; what they cost Redis.
func (r *runner) runIdle(ctx context.Context, p Point) (*IdleResult, error) {
	// The consumer's queue is bound so that the exchange exists as the
	// dispatcher expects; anything it receives was dispatched too early.
	m, err := r.newMeasurement(p, 0)
	if err != nil {
		return nil, err
	}
	defer m.close()
	res := &IdleResult{Point: p, Name: m.keys.Prefix}
	if p.Backlog > 0 {
		if err := m.loadBacklog(ctx, p.Backlog, 0); err != nil {
			return res, err
		}
	}
	// With no instance (the background point) the fleet stays empty.
	if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
		return res, err
	}
	if err := m.fleet.waitReady(ctx); err != nil {
		return res, err
	}
	if !sleepCtx(ctx, 2*warmUp) {
		return res, ctx.Err()
	}
	cpu0, _, err := m.fleet.usage()
	if err != nil {
		return res, err
	}
	before, err := readCmdStats(ctx, r.rdb)
	if err != nil {
		return res, err
	}
	began := time.Now()
	stop := r.prog.start(func() string {
		now, err := readCmdStats(ctx, r.rdb)
		if err != nil {
			return fmt.Sprintf("%s: %v", p, err)
		}
		u := redisUse(before, now, nil)
		u.setSeconds(time.Since(began).Seconds())
		return fmt.Sprintf("%s: %.0f Redis commands/s, Redis CPU %s%%", p, float64(u.Commands)/u.Seconds, fmtPct(u.CPUPercent))
	})
	ok := sleepCtx(ctx, time.Duration(r.opt.Idle))
	stop()
	if !ok {
		return res, ctx.Err()
	}
	if res.Redis, err = m.redisUse(ctx, before, nil, began); err != nil {
		return res, err
	}
	res.Seconds = res.Redis.Seconds
	use := &Result{}
	if err := fleetUse(m.fleet, cpu0, use); err != nil {
		return res, err
	}
	res.CmdsPerSec = float64(res.Redis.Commands) / res.Seconds
	res.ScriptsPerSec = float64(res.Redis.ScriptCalls) / res.Seconds
	res.RedisCPUPercent = res.Redis.CPUPercent
	if p.Instances > 0 {
		res.CmdsPerSecPerInstance = res.CmdsPerSec / float64(p.Instances)
		res.CPUPercent = use.CPUSeconds / res.Seconds / float64(p.Instances) * 100
		for _, c := range use.CPUSecondsEach {
			res.CPUPercentEach = append(res.CPUPercentEach, c/res.Seconds*100)
		}
	}
	res.PeakRSSMB = use.PeakRSSMB
	if err := m.fleet.stop(); err != nil {
		res.Errors = append(res.Errors, err.Error())
	}
	m.fleet = nil
	m.sink.stop()
	if err := m.sink.ackError(); err != nil {
		res.Errors = append(res.Errors, err.Error())
	}
	res.Unexpected = m.rec.unexpected.Load() + m.rec.malformed.Load()
	return res, nil
}

func (res *IdleResult) failures() []string {
	var out []string
	if res.Unexpected > 0 {
		out = append(out, fmt.Sprintf("%s: %d tasks dispatched although none was due", res.Point, res.Unexpected))
	}
	for _, e := range res.Errors {
		out = append(out, res.Point.String()+": "+e)
	}
	return out
}
