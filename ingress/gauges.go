package ingress

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Causes of dispatcher_ingress_errors_total: the series of each exist,
// at 0, from the start, so that rate() and increase() see the first one.
var Causes = []string{"bad_header", "too_large", "too_late", "redis", "unstored"}

// gauges export the state of every ingress watched, read when scraped:
// the age goes on growing between two reads of the queue.
type gauges struct {
	ready, age, consuming *prometheus.Desc

	mu sync.Mutex
	gs []*Ingress
}

func newGauges() *gauges {
	l := []string{"queue"}
	return &gauges{
		ready: prometheus.NewDesc("dispatcher_ingress_ready_messages",
			"Messages ready (not yet delivered to any instance) in the queue's ingress queue dispatcher.ingress.<queue>, read by a passive queue.declare every DISPATCHER_STATS_INTERVAL; exported while this instance consumes it. Every consuming instance exports it: aggregate with max by (queue).", l, nil),
		age: prometheus.NewDesc("dispatcher_ingress_oldest_message_age_seconds",
			"How long the oldest ingress message not yet written to Redis has waited, as far as this instance knows: from its broker receive time (header timestamp_in_ms) if it has one, else from when this instance took it; 0 when none waits. Aggregate with max by (queue).", l, nil),
		consuming: prometheus.NewDesc("dispatcher_ingress_consuming",
			"1 while this instance consumes the queue's ingress queue.", l, nil),
	}
}

func (c *gauges) watch(g *Ingress) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gs = append(c.gs, g)
}

func (c *gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.ready
	ch <- c.age
	ch <- c.consuming
}

func (c *gauges) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	gs := append([]*Ingress(nil), c.gs...)
	c.mu.Unlock()
	for _, g := range gs {
		s := g.Status()
		on := 0.0
		if s.Consuming {
			on = 1
		}
		ch <- prometheus.MustNewConstMetric(c.consuming, prometheus.GaugeValue, on, s.Queue)
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, s.OldestAge.Seconds(), s.Queue)
		if s.Consuming && s.Ready >= 0 && s.ReadErr == "" {
			ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, float64(s.Ready), s.Queue)
		}
	}
}

// watch makes g's gauges exported and its counters' series exist.
func (m *Metrics) watch(g *Ingress) {
	if m == nil {
		return
	}
	m.gauges.watch(g)
	m.in.WithLabelValues(g.opt.Queue)
	for _, c := range Causes {
		m.errs.WithLabelValues(g.opt.Queue, c)
	}
}

// ingestedN counts n tasks written to Redis.
func (g *Ingress) ingestedN(n int) {
	g.opt.Metrics.ingested(g.opt.Queue, n)
	g.obs.count("", n)
}

// failed counts n messages refused, or failing to be written, by cause.
func (g *Ingress) failed(cause string, n int) {
	g.opt.Metrics.errors(g.opt.Queue, cause, n)
	g.obs.count(cause, n)
}
