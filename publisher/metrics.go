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
	}
	reg.MustRegister(m.up, m.blockedG, m.connectErrors, m.connects)
	return m
}

func (m *Metrics) connectError() {
	if m != nil {
		m.connectErrors.Inc()
	}
}

func (m *Metrics) connected(up bool) {
	if m == nil {
		return
	}
	if up {
		m.connects.Inc()
		m.up.Set(1)
	} else {
		m.up.Set(0)
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
