package scanner

import "github.com/prometheus/client_golang/prometheus"

// Metrics of the scan loops, labelled by queue. A nil *Metrics records nothing.
type Metrics struct {
	dispatched *prometheus.CounterVec
	returned   *prometheus.CounterVec
	retried    *prometheus.CounterVec
	reaped     *prometheus.CounterVec
	dead       *prometheus.CounterVec
	errors     *prometheus.CounterVec
	batch      *prometheus.HistogramVec
	lateness   *prometheus.HistogramVec
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
		returned:   counter("dispatcher_tasks_returned_total", "Claimed tasks put back to pending unpublished (shutdown, broker connection lost).", "queue"),
		retried:    counter("dispatcher_tasks_retried_total", "Failed publishes (nack, unroutable, timeout, refused) scheduled for a retry with backoff.", "queue"),
		reaped:     counter("dispatcher_tasks_reaped_total", "Tasks whose lease ran out (their instance died) returned to pending.", "queue"),
		dead:       counter("dispatcher_tasks_dead_lettered_total", "Tasks moved to the dead-letter set.", "queue"),
		errors:     counter("dispatcher_errors_total", "Errors by kind: redis, wrongtype, nack, returned, timeout, refused, lost, not_connected, stopped, too_large, ack, other.", "queue", "kind"),
		batch: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dispatcher_claim_batch_size", Help: "Tasks taken per claim that took any.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 14),
		}, []string{"queue"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dispatcher_dispatch_lateness_seconds", Help: "Publish time minus due time, by the Redis server's clock.",
			Buckets: []float64{.001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60, 300},
		}, []string{"queue"}),
	}
	reg.MustRegister(m.batch, m.lateness)
	return m
}

// queueMetrics are the Metrics curried to one queue.
type queueMetrics struct {
	m     *Metrics
	queue string
}

func (q queueMetrics) add(c func(*Metrics) *prometheus.CounterVec, n int) {
	if q.m != nil && n > 0 {
		c(q.m).WithLabelValues(q.queue).Add(float64(n))
	}
}

func (q queueMetrics) dispatched(n int) {
	q.add(func(m *Metrics) *prometheus.CounterVec { return m.dispatched }, n)
}
func (q queueMetrics) returned(n int) {
	q.add(func(m *Metrics) *prometheus.CounterVec { return m.returned }, n)
}
func (q queueMetrics) retried(n int) {
	q.add(func(m *Metrics) *prometheus.CounterVec { return m.retried }, n)
}
func (q queueMetrics) reaped(n int) {
	q.add(func(m *Metrics) *prometheus.CounterVec { return m.reaped }, n)
}
func (q queueMetrics) dead(n int) {
	q.add(func(m *Metrics) *prometheus.CounterVec { return m.dead }, n)
}

func (q queueMetrics) error(kind string, n int) {
	if q.m != nil && n > 0 {
		q.m.errors.WithLabelValues(q.queue, kind).Add(float64(n))
	}
}

func (q queueMetrics) batchSize(n int) {
	if q.m != nil {
		q.m.batch.WithLabelValues(q.queue).Observe(float64(n))
	}
}

func (q queueMetrics) late(seconds float64) {
	if q.m != nil {
		q.m.lateness.WithLabelValues(q.queue).Observe(seconds)
	}
}
