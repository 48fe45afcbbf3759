package recurring

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the schedules' gauges, kept by the instance that
// materialises each queue (its sweeper); the others have none.
type Metrics struct {
	next     *prometheus.GaugeVec
	last     *prometheus.GaugeVec
	paused   *prometheus.GaugeVec
	failing  *prometheus.GaugeVec
	occurred *prometheus.CounterVec
	skipped  *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	lbl := []string{"queue", "schedule"}
	m := &Metrics{
		next: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dispatcher_recurring_next_due_timestamp_seconds",
			Help: "Due time of the schedule's next occurrence (pending, or to be materialised), Unix seconds."}, lbl),
		last: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dispatcher_recurring_last_due_timestamp_seconds",
			Help: "Due time of the schedule's last occurrence that left pending (claimed or cancelled), Unix seconds."}, lbl),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dispatcher_recurring_paused",
			Help: "1 while the schedule is paused."}, lbl),
		failing: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "dispatcher_recurring_failing",
			Help: "1 while the schedule cannot be materialised (invalid definition, Redis refusing, a task with the same body in the way)."}, lbl),
		occurred: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatcher_recurring_occurrences_total",
			Help: "Occurrences of recurring schedules materialised as pending tasks by this instance."}, []string{"queue"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatcher_recurring_skipped_total",
			Help: "Occurrences missed during an outage and not fired, by the schedules' catch-up policy."}, []string{"queue"}),
	}
	if reg != nil {
		reg.MustRegister(m.next, m.last, m.paused, m.failing, m.occurred, m.skipped)
	}
	return m
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (m *Metrics) show(queue, name string, st Status, paused bool) {
	if m == nil {
		return
	}
	if st.NextMs > 0 && !paused {
		m.next.WithLabelValues(queue, name).Set(float64(st.NextMs) / 1000)
	} else {
		m.next.DeleteLabelValues(queue, name)
	}
	if st.LastMs > 0 {
		m.last.WithLabelValues(queue, name).Set(float64(st.LastMs) / 1000)
	}
	m.paused.WithLabelValues(queue, name).Set(b2f(paused))
	m.failing.WithLabelValues(queue, name).Set(b2f(st.Error != ""))
}

func (m *Metrics) forget(queue, name string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.GaugeVec{m.next, m.last, m.paused, m.failing} {
		v.DeleteLabelValues(queue, name)
	}
}

func (m *Metrics) forgetQueue(queue string) {
	if m == nil {
		return
	}
	for _, v := range []*prometheus.GaugeVec{m.next, m.last, m.paused, m.failing} {
		v.DeletePartialMatch(prometheus.Labels{"queue": queue})
	}
}

func (m *Metrics) materialised(queue string, skipped int) {
	if m == nil {
		return
	}
	m.occurred.WithLabelValues(queue).Inc()
	if skipped > 0 {
		m.skipped.WithLabelValues(queue).Add(float64(skipped))
	}
}
