package monitor

import (
	"context"
	"time"

	"github.com/dispatcher/dispatcher/internal/forecast"
)

// HerdSeconds is how many seconds of draining one second's tasks may
// take before they are a thundering herd worth a warning.
const HerdSeconds = 10

// defaultForecastEvery is how often the swept queues' next minute is
// counted when Options.ForecastEvery is 0.
const defaultForecastEvery = 10 * time.Second

// pageForecastEvery is how often a page load may read the hour ahead of
// the queues: not on every reload.
const pageForecastEvery = 20 * time.Second

// Ahead is what falls due in the next minute of a swept queue.
type Ahead struct {
	ReadAt     time.Time // local clock; zero if never counted
	NextMinute int64     // tasks due in the next 60 s (from the current second)
	Peak       forecast.Peak
	// Drain is the rate the queue is taken to drain at (tasks/s) and
	// DrainFrom the setting it comes from; Herd that Peak holds more
	// than HerdSeconds of it.
	Drain     float64
	DrainFrom string
	Herd      bool
	Err       string
}

// drain is the queue's drain rate for the herd warning.
func (m *Monitor) drain(queue string) (float64, string) {
	if m.opt.DrainRate != nil {
		if r, from := m.opt.DrainRate(queue); r > 0 {
			return r, from
		}
	}
	return 1000, "default DRAIN_RATE"
}

// herdLimit is the most tasks one second may hold without a warning.
func herdLimit(drain float64) int64 { return int64(HerdSeconds * drain) }

// lookAhead counts, for the swept queues whose count is due, the tasks
// falling due in the next minute and its busiest second, exports them
// and warns of a herd. Only shards whose earliest pending task (from the
// last read of the queue's state) falls within the minute are asked: an
// idle queue, or one whose tasks are all further ahead, costs Redis
// nothing; the others one script call per such shard, and one more per
// shard with tasks in the minute for its seconds.
func (m *Monitor) lookAhead(ctx context.Context) {
	every := m.opt.ForecastEvery
	if every <= 0 {
		every = defaultForecastEvery
	}
	now := time.Now()
	type job struct {
		v      *queueView
		opt    forecast.Options
		fromMs int64
	}
	var jobs []job
	m.mu.Lock()
	for _, v := range m.queues {
		if !v.Swept || v.ReadAt.IsZero() || now.Before(v.nextAhead) {
			continue
		}
		v.nextAhead = now.Add(every - m.opt.Interval/4)
		fromMs := now.Add(v.offset).UnixMilli() / 1000 * 1000
		j := job{v: v, fromMs: fromMs, opt: forecast.Options{Prefix: m.opt.KeyPrefix, Queue: v.target.Name, Refine: 1}}
		for _, s := range v.State.Shards {
			if s.Err == "" && s.NextDueMs > 0 && s.NextDueMs < fromMs+time.Minute.Milliseconds() {
				j.opt.Shards = append(j.opt.Shards, s.Index)
			}
		}
		jobs = append(jobs, j)
	}
	m.mu.Unlock()
	for _, j := range jobs {
		a := Ahead{Peak: forecast.Peak{Exact: true}}
		if len(j.opt.Shards) > 0 {
			rctx, cancel := context.WithTimeout(ctx, readTimeout)
			f, err := forecast.Read(rctx, m.rdb, j.opt, forecast.Window{FromMs: j.fromMs, Span: time.Minute, Step: time.Minute})
			cancel()
			if err != nil {
				a.Err = err.Error()
			}
			a.NextMinute, a.Peak = f.Total, f.Peak
		}
		a.ReadAt = time.Now()
		a.Drain, a.DrainFrom = m.drain(j.v.target.Name)
		a.Herd = a.Peak.Tasks > herdLimit(a.Drain)
		m.mu.Lock()
		if j.v.Swept {
			m.applyAhead(j.v, a, j.fromMs)
		}
		m.mu.Unlock()
	}
}

// applyAhead exports a count of the next minute and warns of a herd once:
// the same herd, counted again every ForecastEvery while it comes, falls
// in the same second of the Redis clock.
func (m *Monitor) applyAhead(v *queueView, a Ahead, fromMs int64) {
	v.Ahead = a
	name := v.target.Name
	m.dueNextMinute.WithLabelValues(name).Set(float64(a.NextMinute))
	m.peakSecond.WithLabelValues(name).Set(float64(a.Peak.Tasks))
	m.herd.WithLabelValues(name).Set(b2f(a.Herd))
	if !a.Herd {
		v.herdAt = 0
		return
	}
	if v.herdAt != a.Peak.FromMs {
		m.log.Warn("thundering herd ahead: more tasks fall due in one second than the queue drains in 10 s",
			"queue", name, "tasks", a.Peak.Tasks, "due_at", time.UnixMilli(a.Peak.FromMs).UTC().Format("2006-01-02T15:04:05Z"),
			"in", time.Duration(a.Peak.FromMs-fromMs)*time.Millisecond, "drain_rate", a.Drain, "drain_rate_from", a.DrainFrom,
			"due_next_minute", a.NextMinute)
	}
	v.herdAt = a.Peak.FromMs
}

// pageForecasts reads the hour ahead, by the minute, of the queues whose
// last one is older than pageForecastEvery, for the status page. A page
// load that finds another one reading goes on with the figures there are.
func (m *Monitor) pageForecasts(ctx context.Context) {
	select {
	case m.forecasting <- struct{}{}:
		defer func() { <-m.forecasting }()
	default:
		return
	}
	now := time.Now()
	var vs []*queueView
	var opts []forecast.Options
	m.mu.Lock()
	for _, v := range m.queues {
		if now.Sub(v.forecastAt) < pageForecastEvery || len(v.State.Shards) == 0 {
			continue
		}
		o := forecast.Options{Prefix: m.opt.KeyPrefix, Queue: v.target.Name, Refine: 4}
		for i := range v.State.Shards {
			o.Shards = append(o.Shards, i)
		}
		vs, opts = append(vs, v), append(opts, o)
	}
	m.mu.Unlock()
	for n, v := range vs {
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		f, err := forecast.Read(rctx, m.rdb, opts[n], forecast.Window{Span: time.Hour, Step: time.Minute})
		cancel()
		m.mu.Lock()
		v.forecastAt, v.ForecastErr = time.Now(), ""
		if err != nil {
			v.ForecastErr = err.Error()
		} else {
			v.Forecast = &f
		}
		m.mu.Unlock()
	}
}
