package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dispatcher/dispatcher/shard"
)

// dueSpread: the due tasks of a backlog are due over this span before the
// dispatchers start.
const dueSpread = 3000 // ms

// measurement is what the backlog and rate modes share: a point's keys,
// consumer and instances.
type measurement struct {
	r      *runner
	p      Point
	res    *Result
	keys   shard.Keys // of the bench queue, the one backlog tasks go to
	queues []string   // every queue the instances serve, the bench queue first
	rec    *recorder
	sink   *sink
	fleet  fleet
	// thr0 is the instances' cgroup throttling when their CPU was first
	// read (startUsage; nil: from their start, or no cap).
	thr0 []Throttle
	// traffic is how long a rate point's tasks are due over (its
	// duration), for the cadence of the floor; floor measures the floor
	// at the end (-floor).
	traffic time.Duration
	floor   bool
	// ingress is the queue's AMQP ingress (ingress mode), else nil.
	ingress *ingressSpec
}

func (r *runner) newMeasurement(p Point, expected int) (*measurement, error) {
	name := r.name(p.Mode)
	queues := queueNames(max(p.Queues, 1))
	if p.Mode == modeIngress {
		// A queue named after the point: its ingress queue,
		// dispatcher.ingress.<name>, must be no other run's.
		queues = []string{name}
	}
	m := &measurement{
		r: r, p: p, keys: shard.Keys{Prefix: name, Queue: queues[0]},
		queues: queues,
		res:    &Result{Point: p, Name: name, Scheduled: expected},
		rec:    newRecorder(expected, p.Shards, r.earlyUs),
	}
	if p.Mode == modeRate || p.Mode == modeIngress {
		m.rec.keepDue() // for the start of traffic
	}
	switch {
	case p.Mode == modeIngress:
		m.ingress = &ingressSpec{exchange: name + ".ingress", queueType: ingressQueueType(r.opt.QueueType), prefetch: r.opt.IngressPrefetch}
		m.rec.expectIngress(time.Duration(r.opt.Ahead).Milliseconds())
	case p.IDs:
		m.rec.expectIDs(p.Props)
	}
	// Each queue publishes with its name as routing key: the consumer's
	// queue is bound with all of them.
	sk, err := openSink(r.opt, name, m.queues, m.rec)
	if err != nil {
		return nil, err
	}
	m.sink = sk
	return m, nil
}

// queueKeys are the keys of every queue the instances serve, in the
// order of m.queues (the bench queue's first).
func (m *measurement) queueKeys() []shard.Keys {
	out := make([]shard.Keys, len(m.queues))
	for i, q := range m.queues {
		out[i] = shard.Keys{Prefix: m.keys.Prefix, Queue: q}
	}
	return out
}

func (m *measurement) spec() instanceSpec {
	return instanceSpec{
		binary: m.r.opt.Dispatcher, redisURL: m.r.opt.RedisURL, amqpURL: m.r.opt.AMQPURL,
		prefix: m.keys.Prefix, exchange: m.keys.Prefix, queues: m.queues, shards: m.p.Shards, batch: m.p.Batch,
		clientName: m.r.clientPrefix() + "-d", stamp: m.r.stamps, maxRate: m.p.MaxRate,
		limiter: m.r.limiter, ingress: m.ingress,
	}
}

// startUsage reads the instances' CPU (returned) and cgroup throttling
// (kept) at the start of what is measured.
func (m *measurement) startUsage() ([]float64, error) {
	cpu0, _, err := m.fleet.usage()
	if err != nil {
		return nil, err
	}
	m.thr0, err = m.fleet.throttles()
	return cpu0, err
}

// instanceFigures reads each instance's share of the work (tasks
// dispatched), its publish calls, its CPU as % of one core over the
// window and its throttling, and the cadence of the point's publishing.
func (m *measurement) instanceFigures(window time.Duration) error {
	res := m.res
	ms, err := m.fleet.each(metricDispatched, metricCalls, metricClaims)
	if err != nil {
		return err
	}
	var dispatched float64
	callsFrom := metricCalls
	for _, mm := range ms {
		if _, ok := mm[metricCalls]; !ok {
			callsFrom = metricClaims + " (claims: this dispatcher does not count its publish calls)"
		}
	}
	for _, mm := range ms {
		res.DispatchedEach = append(res.DispatchedEach, mm[metricDispatched])
		dispatched += mm[metricDispatched]
		if callsFrom == metricCalls {
			res.PublishCalls += mm[metricCalls]
		} else {
			res.PublishCalls += mm[metricClaims]
		}
	}
	res.PublishCallsFrom = callsFrom
	for _, n := range res.DispatchedEach {
		share := 0.0
		if dispatched > 0 {
			share = 100 * n / dispatched
		}
		res.SharePercentEach = append(res.SharePercentEach, share)
	}
	res.CPUWindowSeconds = window.Seconds()
	for _, c := range res.CPUSecondsEach {
		res.CPUPercentEach = append(res.CPUPercentEach, 100*c/window.Seconds())
	}
	thr, err := m.fleet.throttles()
	if err != nil {
		return err
	}
	for i, t := range thr {
		if m.thr0 != nil {
			t = t.minus(m.thr0[i])
		}
		res.ThrottleEach = append(res.ThrottleEach, t)
	}
	if m.traffic > 0 {
		res.cadence = &cadence{callsPerSec: res.PublishCalls / m.traffic.Seconds(), msgsPerSec: dispatched / m.traffic.Seconds(), callsFrom: callsFrom}
	}
	return nil
}

// close stops whatever still runs and removes the point's keys, queue and
// exchange.
func (m *measurement) close() {
	if m.fleet != nil {
		if err := m.fleet.stop(); err != nil {
			m.res.Errors = append(m.res.Errors, err.Error())
		}
		m.fleet = nil
	}
	if m.ingress != nil {
		if err := deleteIngress(m.sink.conn, m.queues[0], m.ingress.exchange); err != nil {
			m.r.warnf("%s: delete the ingress queue and exchange: %v", m.p, err)
		}
	}
	if err := m.sink.close(); err != nil {
		m.r.warnf("%s: delete queue and exchange: %v", m.p, err)
	}
	m.r.cleanKeys(m.keys.Prefix, m.queues, m.p.Shards)
}

// loadBacklog schedules the point's N tasks: the ones not due during the
// run first (due in an hour), then the W due now, spread over the last
// dueSpread ms, so that those are the newest when the dispatchers start.
func (m *measurement) loadBacklog(ctx context.Context, n, w int) error {
	var loaded atomic.Int64
	stop := m.r.prog.start(func() string {
		return fmt.Sprintf("%s: loading %s/%s", m.p, thousands(int(loaded.Load())), thousands(n))
	})
	defer stop()
	begin := time.Now()
	later := begin.Add(time.Hour).UnixMilli()
	err := load(ctx, m.r.rdb, m.keys, m.p, w, n,
		func(i int) int64 { return later + int64(i%60000) }, &loaded)
	if err != nil {
		return err
	}
	now := time.Now().UnixMilli()
	err = load(ctx, m.r.rdb, m.keys, m.p, 0, w,
		func(i int) int64 { return now - dueSpread + int64(i)*dueSpread/int64(w) }, &loaded)
	m.res.LoadSeconds = time.Since(begin).Seconds()
	return err
}

// wait waits for every expected task, with progress; a stall is recorded,
// not returned.
func (m *measurement) wait(ctx context.Context, extra func() string) error {
	start := time.Now()
	stop := m.r.prog.start(func() string {
		got := m.rec.unique.Load()
		line := fmt.Sprintf("%s: %s/%s received, %s/s", m.p, thousands(int(got)), thousands(m.rec.expected),
			thousands(int(float64(got)/time.Since(start).Seconds())))
		if d := m.rec.dups.Load(); d > 0 {
			line += fmt.Sprintf(", %d duplicates", d)
		}
		if extra != nil {
			line += extra()
		}
		return line
	})
	defer stop()
	var gone *instance
	err := m.r.waitFor(ctx, func() bool {
		gone = m.fleet.exited()
		return m.rec.missing() == 0 || gone != nil
	}, received(m.rec))
	if gone != nil {
		return fmt.Errorf("dispatcher pid %d exited during the run (%v):\n%s", gone.cmd.Process.Pid, gone.err, gone.out.String())
	}
	if errors.Is(err, errStalled) {
		m.res.Errors = append(m.res.Errors, fmt.Sprintf("no task arrived for %s; gave up with %d missing",
			time.Duration(m.r.opt.Stall), m.rec.missing()))
		return nil
	}
	return err
}

// finish settles the counts, reads Redis's and the instances' figures and
// stops the instances; before is Redis's counts at the start, own
// the commands the bench sent to each shard meanwhile (nil: none; indexed
// as produce returns them, queue by queue), cpu0 the
// instances' CPU at the start (nil: their whole life).
func (m *measurement) finish(ctx context.Context, before redisSnap, own []cmdStats, cpu0 []float64, began time.Time) error {
	res, rec := m.res, m.rec
	if n, err := settle(ctx, m.fleet, rec.unique.Load()); err != nil {
		return err
	} else if n < float64(rec.unique.Load()) {
		m.r.warnf("%s: the instances count %.0f tasks dispatched, the consumer got %d; Redis's figures may miss the last ones",
			m.p, n, rec.unique.Load())
	}
	var err error
	if res.Redis, err = m.redisUse(ctx, before, own, began); err != nil {
		return err
	}
	if err := fleetUse(m.fleet, cpu0, res); err != nil {
		return err
	}
	if err := m.instanceFigures(time.Since(began)); err != nil {
		return err
	}
	res.ClaimBatchMean = claimBatchMean(m.fleet)
	if err := m.fleet.stop(); err != nil {
		res.Errors = append(res.Errors, err.Error())
	}
	m.fleet = nil
	// The floor, its own deliveries going to a recorder of its own, once
	// every task has arrived and the instances are gone.
	if m.floor && res.cadence != nil && rec.missing() == 0 {
		f, err := m.r.measureFloor(ctx, m.sink, m.queues, m.p.Size, *res.cadence, m.traffic)
		if err != nil {
			return err
		}
		res.Floor = f
	}
	m.sink.stop()
	if err := m.sink.ackError(); err != nil {
		res.Errors = append(res.Errors, err.Error())
	}

	res.Delivered = int(rec.unique.Load())
	res.Missing = rec.missing()
	res.Duplicates, res.Unexpected = rec.dups.Load(), rec.unexpected.Load()
	res.Early, res.BadID, res.Malformed = rec.early.Load(), rec.badID.Load(), rec.malformed.Load()
	res.BadTaskID = rec.badTaskID.Load()
	res.Unstamped = rec.unstamped.Load()
	res.Seconds = rec.span().Seconds()
	res.PerSec = perSec(res.Delivered, rec.span())
	consumer, dispatch := rec.views(nil)
	res.Lateness, res.DispatchLateness = distOf(consumer), distOrNil(dispatch, true)
	if c, d, from, ok := rec.startWindow(time.Second); ok {
		res.FirstSecond = &Window{FromDueMs: from, Ms: time.Second.Milliseconds(), Tasks: len(c),
			Lateness: distNoCurve(c), DispatchLateness: distOrNil(d, false)}
	}
	if c, d, from, ms, ok := rec.afterWindow(time.Second); ok {
		res.AfterFirstSecond = &Window{FromDueMs: from, Ms: ms, Tasks: len(c), Lateness: distNoCurve(c), DispatchLateness: distOrNil(d, false)}
	}
	res.ShardLateness = shardDists(rec.late, rec.shardOf, m.p.Shards)
	res.ShardP99Median, res.ShardP99Worst, res.WorstShard = shardSpread(res.ShardLateness)
	if res.Delivered > 0 {
		per10k := 10000 / float64(res.Delivered)
		res.CmdsPerTask = float64(res.Redis.Commands) / float64(res.Delivered)
		res.ScriptsPerTask = float64(res.Redis.ScriptCalls) / float64(res.Delivered)
		res.CPUPer10k = res.CPUSeconds * per10k
		for _, c := range res.CPUSecondsEach {
			res.CPUPer10kEach = append(res.CPUPer10kEach, c*per10k)
		}
		if res.Redis.CPUSeconds != nil {
			v := *res.Redis.CPUSeconds * per10k
			res.RedisCPUPer10k = &v
		}
		for _, pu := range res.Redis.Primaries {
			pu.CmdsPerTask = float64(pu.Commands) / float64(res.Delivered)
		}
	}
	if res.Floor != nil {
		res.Floor.compare(res.CPUPer10k)
		res.Errors = append(res.Errors, res.Floor.Errors...)
	}
	return nil
}

// redisUse reads Redis's counts now and returns what the point cost Redis
// since before (taken at began), in all and per primary; ownCmds is what
// the bench sent to each shard itself (nil: nothing), indexed q*M+i for
// shard i of queue q (m.queues' order).
func (m *measurement) redisUse(ctx context.Context, before redisSnap, ownCmds []cmdStats, began time.Time) (RedisUse, error) {
	after, err := readCmdStats(ctx, m.r.rdb)
	if err != nil {
		return RedisUse{}, err
	}
	since := time.Since(began)
	// Where every shard of every queue is, alike indexed.
	var where []string
	for _, keys := range m.queueKeys() {
		where = append(where, m.r.shardPrimaries(ctx, keys, m.p.Shards, after)...)
	}
	own := map[string]map[string]int64{}
	for s, c := range ownCmds {
		for name, n := range c {
			if n > 0 {
				if own[where[s]] == nil {
					own[where[s]] = map[string]int64{}
				}
				own[where[s]][name] += n
			}
		}
	}
	u := redisUse(before, after, own)
	u.setSeconds(since.Seconds())
	others, err := otherClients(ctx, m.r.rdb, m.r.clientPrefix(), since)
	if err != nil {
		return u, err
	}
	for _, pu := range u.Primaries {
		pu.OtherClients = others[pu.Addr]
		u.OtherClients += pu.OtherClients
		pu.Shards = countOf(where, pu.Addr)
	}
	return u, nil
}

// runBacklog: N tasks pending, W of them due, when K dispatchers start;
// throughput over the W against the ceiling.
func (r *runner) runBacklog(ctx context.Context, p Point) (*Result, error) {
	c, err := r.ceiling(ctx, p)
	if err != nil {
		return nil, err
	}
	m, err := r.newMeasurement(p, p.Window)
	if err != nil {
		return nil, err
	}
	defer m.close()
	if err := m.loadBacklog(ctx, p.Backlog, p.Window); err != nil {
		return m.res, err
	}
	before, err := readCmdStats(ctx, r.rdb)
	if err != nil {
		return m.res, err
	}
	began := time.Now()
	if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
		return m.res, err
	}
	if err := m.wait(ctx, nil); err != nil {
		return m.res, err
	}
	if first := m.rec.firstNs.Load(); first > 0 {
		m.res.StartupMs = float64(first-began.UnixNano()) / 1e6
	}
	if err := m.finish(ctx, before, nil, nil, began); err != nil {
		return m.res, err
	}
	m.res.Ceiling = c.PerSec
	if c.PerSec > 0 {
		m.res.Ratio = m.res.PerSec / c.PerSec
	}
	return m.res, nil
}

// ceiling returns the ceiling for the messages of point p (their size,
// and the headers tasks with ids and properties carry), measuring it first
// if there is none yet (or always, with -ceiling-each).
func (r *runner) ceiling(ctx context.Context, p Point) (*Ceiling, error) {
	key := ceilingKey{p.Size, p.IDs, p.IDs && p.Props}
	if c := r.ceilings[key]; c != nil && !r.opt.CeilingEach {
		return c, nil
	}
	c, err := r.measureCeiling(ctx, key)
	if err != nil {
		return nil, err
	}
	r.ceilings[key] = c
	r.rep.Ceilings = append(r.rep.Ceilings, c)
	for _, t := range c.Tried {
		r.prog.printf("ceiling size=%d%s %s window=%d: %s msgs/s at the consumer (%s confirmed/s), latency p50 %s ms p99 %s ms\n",
			p.Size, c.form().formText(), c.QueueType, t.Window, thousands(int(t.PerSec)), thousands(int(t.ConfirmedPerSec)), fmtMs(t.Latency.P50), fmtMs(t.Latency.P99))
		if t.Missing > 0 || t.Nacked > 0 || t.Returned > 0 || t.Duplicates > 0 || t.BadHeaders > 0 {
			r.rep.Failures = append(r.rep.Failures, fmt.Sprintf("ceiling size=%d%s window=%d: %d missing, %d nacked, %d returned, %d duplicates, %d with headers not their message's",
				p.Size, c.form().formText(), t.Window, t.Missing, t.Nacked, t.Returned, t.Duplicates, t.BadHeaders))
		}
	}
	return c, nil
}
