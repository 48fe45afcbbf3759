package scanner

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dispatcher/dispatcher/shard"
)

// Metrics of the scan loops, labelled by queue. A nil *Metrics records nothing.
type Metrics struct {
	dispatched *prometheus.CounterVec
	returned   *prometheus.CounterVec
	retried    *prometheus.CounterVec
	reaped     *prometheus.CounterVec
	dead       *prometheus.CounterVec
	dropped    *prometheus.CounterVec
	seconds    *prometheus.CounterVec
	undated    *prometheus.CounterVec
	misplaced  *prometheus.CounterVec
	errors     *prometheus.CounterVec
	sweeper    *prometheus.GaugeVec
	dozing     *prometheus.GaugeVec
	shards     *prometheus.GaugeVec
	shardsFrom *prometheus.GaugeVec
	left       *prometheus.GaugeVec
	retired    *prometheus.CounterVec
	batch      *prometheus.HistogramVec
	lateness   *prometheus.HistogramVec
	totals     *cachedGatherer
}

// NewMetrics registers the scanner's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
		reg.MustRegister(c)
		return c
	}
	m := &Metrics{
		dispatched: counter("dispatcher_tasks_dispatched_total", "Tasks the broker confirmed and that left Redis.", "queue"),
		returned:   counter("dispatcher_tasks_returned_total", "Claimed tasks handed back unpublished for any instance to claim at once (shutdown, broker connection lost).", "queue"),
		retried:    counter("dispatcher_tasks_retried_total", "Failed publishes (nack, unroutable, timeout, refused) scheduled for a retry with backoff.", "queue"),
		reaped:     counter("dispatcher_tasks_reaped_total", "Tasks whose lease ran out (their instance died or stalled) taken over by a claim.", "queue"),
		dead:       counter("dispatcher_tasks_dead_lettered_total", "Tasks moved to the dead-letter set.", "queue"),
		dropped:    counter("dispatcher_tasks_unroutable_dropped_total", "Tasks the broker returned as unroutable and that were forgotten unpublished (DISPATCHER_QUEUE_<NAME>_UNROUTABLE=drop).", "queue"),
		seconds:    counter("dispatcher_tasks_seconds_scores_total", "Tasks whose score looks like seconds, not milliseconds, since the epoch (dispatched at once, as due).", "queue"),
		undated:    counter("dispatcher_tasks_undated_scores_total", "Tasks scored 0 or less, -inf, or in seconds before 1973: no real due time (dispatched at once, as due; their lateness is not observed).", "queue"),
		misplaced:  counter("dispatcher_tasks_misplaced_total", "Tasks written by a producer hashing with another shard count than the queue's: dispatched from a shard other than theirs (one still on the old count while the count changes), or moved to theirs from a shard index beyond the queue's count (a producer hashing with a larger count).", "queue"),
		errors:     counter("dispatcher_errors_total", "Errors by kind: redis, wrongtype, nack, returned, timeout, refused, lost, not_connected, stopped, too_large, bad_properties, deadline, ack, other.", "queue", "kind"),
		sweeper: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatcher_sweeper", Help: "1 while this instance holds the queue's sweeper role (polls the shards for new tasks).",
		}, []string{"queue"}),
		dozing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatcher_queue_dozing", Help: "1 while the queue is empty and this instance, instead of sweeping it, looks at it with every other dozing queue in one Redis call per idle poll interval.",
		}, []string{"queue"}),
		shards: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatcher_queue_shards", Help: "The queue's shard count M as recorded in Redis: the one producers hash with.",
		}, []string{"queue"}),
		shardsFrom: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatcher_queue_reshard_from", Help: "While the queue's shard count changes (dispatcher reshard), the count it changes from; 0 otherwise.",
		}, []string{"queue"}),
		left: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatcher_queue_reshard_left",
			Help: "While the queue's shard count changes: what the mover's last pass left in the old layout (tasks due soon in a shard other than theirs, and what the shards being retired still hold); 0 otherwise.",
		}, []string{"queue"}),
		retired: counter("dispatcher_tasks_retired_moved_total", "Tasks moved out of shards a shrink retired: written by producers still hashing with the old, larger count, or left in flight there, their lease run out, by an instance that stopped.", "queue"),
		batch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dispatcher_claim_batch_size", Help: "Tasks taken per claim that took any.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}, []string{"queue"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dispatcher_dispatch_lateness_seconds", Help: "Publish time minus due time, by the Redis server's clock.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60, 300},
		}, []string{"queue"}),
	}
	reg.MustRegister(m.sweeper, m.dozing, m.shards, m.shardsFrom, m.left, m.batch, m.lateness)
	m.totals = &cachedGatherer{reg: prometheus.NewRegistry()}
	m.totals.reg.MustRegister(m.dispatched, m.errors, m.lateness)
	return m
}

// Totals gathers only the tasks dispatched, the errors and the lateness
// per queue: what the status page samples every second and the instance
// records carry, without collecting every metric of every queue. While
// none of them changed (idle queues) it answers with the last gathering:
// a thousand queues' histograms cost a gathering a ms of CPU.
func (m *Metrics) Totals() prometheus.Gatherer { return m.totals }

// cachedGatherer gathers reg again only after changed was called since its
// last gathering.
type cachedGatherer struct {
	reg *prometheus.Registry
	gen atomic.Uint64 // bumped after every change of a metric in reg

	mu      sync.Mutex
	last    []*dto.MetricFamily
	lastGen uint64
	ok      bool
}

// changed is called after a metric in reg changed.
func (g *cachedGatherer) changed() { g.gen.Add(1) }

// Gather returns reg's metrics; callers must not change them.
func (g *cachedGatherer) Gather() ([]*dto.MetricFamily, error) {
	// Read before gathering: a change after the read bumps gen past it, so
	// the next Gather gathers again.
	gen := g.gen.Load()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ok && gen == g.lastGen {
		return g.last, nil
	}
	mfs, err := g.reg.Gather()
	if err == nil {
		g.last, g.lastGen, g.ok = mfs, gen, true
	}
	return mfs, err
}

// queueMetrics are the Metrics of one queue, with the label looked up once
// rather than on every task. The zero value records nothing.
type queueMetrics struct {
	on                                               bool
	queue                                            string
	nDispatched, nReturned, nRetried, nReaped, nDead prometheus.Counter
	nDropped                                         prometheus.Counter
	nSeconds, nUndated, nMisplaced                   prometheus.Counter
	errors                                           *prometheus.CounterVec
	batch, lateness                                  prometheus.Observer
	sweeping, dozes                                  prometheus.Gauge
	totals                                           *cachedGatherer
}

func (m *Metrics) forQueue(queue string) queueMetrics {
	if m == nil {
		return queueMetrics{}
	}
	return queueMetrics{
		on: true, queue: queue, errors: m.errors,
		nDispatched: m.dispatched.WithLabelValues(queue), nReturned: m.returned.WithLabelValues(queue),
		nRetried: m.retried.WithLabelValues(queue), nReaped: m.reaped.WithLabelValues(queue),
		nDead: m.dead.WithLabelValues(queue), nDropped: m.dropped.WithLabelValues(queue), nSeconds: m.seconds.WithLabelValues(queue),
		nMisplaced: m.misplaced.WithLabelValues(queue), nUndated: m.undated.WithLabelValues(queue),
		batch: m.batch.WithLabelValues(queue), lateness: m.lateness.WithLabelValues(queue),
		sweeping: m.sweeper.WithLabelValues(queue), dozes: m.dozing.WithLabelValues(queue), totals: m.totals,
	}
}

func (q queueMetrics) add(c prometheus.Counter, n int) {
	if q.on && n > 0 {
		c.Add(float64(n))
		q.totals.changed()
	}
}

func (q queueMetrics) dispatched(n int)        { q.add(q.nDispatched, n) }
func (q queueMetrics) returned(n int)          { q.add(q.nReturned, n) }
func (q queueMetrics) retried(n int)           { q.add(q.nRetried, n) }
func (q queueMetrics) reaped(n int)            { q.add(q.nReaped, n) }
func (q queueMetrics) dead(n int)              { q.add(q.nDead, n) }
func (q queueMetrics) unroutableDropped(n int) { q.add(q.nDropped, n) }
func (q queueMetrics) secondsScore(n int)      { q.add(q.nSeconds, n) }
func (q queueMetrics) undatedScore(n int)      { q.add(q.nUndated, n) }
func (q queueMetrics) misplaced(n int)         { q.add(q.nMisplaced, n) }

// dozing marks the queue dozing (1) or awake (0).
func (q queueMetrics) dozing(v float64) {
	if q.on {
		q.dozes.Set(v)
	}
}

func (q queueMetrics) error(kind string, n int) {
	if q.on && n > 0 {
		q.errors.WithLabelValues(q.queue, kind).Add(float64(n))
		q.totals.changed()
	}
}

func (q queueMetrics) batchSize(n int) {
	if q.on {
		q.batch.Observe(float64(n))
	}
}

func (q queueMetrics) late(seconds float64) {
	if q.on {
		q.lateness.Observe(seconds)
		q.totals.changed()
	}
}

func (q queueMetrics) sweeper(on bool) {
	if q.on {
		v := 0.0
		if on {
			v = 1
		}
		q.sweeping.Set(v)
	}
}

// DeadLettered counts n tasks of queue moved to the dead-letter set by
// another component (the AMQP ingress's refused messages), so that
// dispatcher_tasks_dead_lettered_total and its alert see them too.
func (m *Metrics) DeadLettered(queue string, n int) {
	if m != nil && n > 0 {
		m.dead.WithLabelValues(queue).Add(float64(n))
	}
}

// layout shows the queue's layout in the gauges.
func (m *Metrics) layout(queue string, l shard.Layout) {
	if m != nil {
		m.shards.WithLabelValues(queue).Set(float64(l.Shards))
		m.shardsFrom.WithLabelValues(queue).Set(float64(l.From))
		m.retired.WithLabelValues(queue) // exported at 0 from the start
		if !l.Changing() {
			m.left.WithLabelValues(queue).Set(0)
		}
	}
}

// reshardLeft shows what a change's last pass left in the old layout.
func (m *Metrics) reshardLeft(queue string, n int64) {
	if m != nil {
		m.left.WithLabelValues(queue).Set(float64(n))
	}
}

// strayMoved counts tasks moved to their shards from indexes beyond the
// queue's shard count as misplaced.
func (m *Metrics) strayMoved(queue string, n int64) {
	if m != nil {
		m.misplaced.WithLabelValues(queue).Add(float64(n))
	}
}

// retiredMoved counts tasks moved out of retired shards.
func (m *Metrics) retiredMoved(queue string, n int64) {
	if m != nil {
		m.retired.WithLabelValues(queue).Add(float64(n))
	}
}
