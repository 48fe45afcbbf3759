package scanner

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestTotalsGatherAgainOnlyAfterAChange: the totals (sampled every second
// for the status page and the instance records) are gathered again only
// after a task was dispatched, an error counted or a lateness observed;
// otherwise the last gathering is answered.
func TestTotalsGatherAgainOnlyAfterAChange(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	q := m.forQueue("q")
	value := func() float64 {
		t.Helper()
		mfs, err := m.Totals().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "dispatcher_tasks_dispatched_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	q.dispatched(3)
	if v := value(); v != 3 {
		t.Fatalf("dispatched %v, want 3", v)
	}
	a, _ := m.Totals().Gather()
	b, _ := m.Totals().Gather()
	if &a[0] != &b[0] {
		t.Fatal("gathered again with nothing changed")
	}
	for _, change := range []func(){func() { q.dispatched(2) }, func() { q.error("nack", 1) }, func() { q.late(0.5) }} {
		change()
		c, _ := m.Totals().Gather()
		if &c[0] == &b[0] {
			t.Fatal("a change was not gathered")
		}
		b = c
	}
	if v := value(); v != 5 {
		t.Fatalf("dispatched %v, want 5", v)
	}
}
