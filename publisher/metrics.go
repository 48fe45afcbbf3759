package publisher

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics of the broker connection. A nil *Metrics records nothing.
type Metrics struct {
	up            prometheus.Gauge
	blockedG      prometheus.Gauge
	connectErrors prometheus.Counter
	connects      prometheus.Counter
	node          *prometheus.GaugeVec
	switches      prometheus.Counter
	batches       prometheus.Counter
}

// NewMetrics registers the publisher's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		up: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dispatcher_broker_connected", Help: "1 while a confirm-mode connection to the broker is up."}),
		blockedG: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dispatcher_broker_blocked", Help: "1 while the broker blocks the connection (connection.blocked: a memory or disk alarm)."}),
		connectErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatcher_broker_connect_errors_total", Help: "Failed attempts to connect to the broker."}),
		connects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatcher_broker_connects_total", Help: "Successful connections to the broker, first one included."}),
		node: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dispatcher_broker_node", Help: "1 for the broker node (host:port) the connection is up to, 0 for the other nodes of DISPATCHER_AMQP_URL."}, []string{"node"}),
		switches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatcher_broker_node_switches_total", Help: "Connections made to another node than the one before (a failover)."}),
		batches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dispatcher_broker_publish_batches_total", Help: "Publish calls (messages published together, each confirm waited for) in which the broker confirmed at least one message."}),
	}
	reg.MustRegister(m.up, m.blockedG, m.connectErrors, m.connects, m.node, m.switches, m.batches)
	return m
}

// nodes shows every node at 0 from the start, so a dashboard lists them all.
func (m *Metrics) nodes(ns []node) {
	if m == nil {
		return
	}
	for _, n := range ns {
		m.node.WithLabelValues(n.addr).Set(0)
	}
}

func (m *Metrics) switched() {
	if m != nil {
		m.switches.Inc()
	}
}

// batch counts one publish call that had a message confirmed.
func (m *Metrics) batch() {
	if m != nil {
		m.batches.Inc()
	}
}

func (m *Metrics) connectError() {
	if m != nil {
		m.connectErrors.Inc()
	}
}

func (m *Metrics) connected(up bool, node string) {
	if m == nil {
		return
	}
	if up {
		m.connects.Inc()
		m.up.Set(1)
		m.node.WithLabelValues(node).Set(1)
	} else {
		m.up.Set(0)
		m.node.WithLabelValues(node).Set(0)
		m.blockedG.Set(0) // a new connection starts unblocked
	}
}

func (m *Metrics) blocked(on bool) {
	if m == nil {
		return
	}
	if on {
		m.blockedG.Set(1)
	} else {
		m.blockedG.Set(0)
	}
}
