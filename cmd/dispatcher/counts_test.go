package main

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCountSampler(t *testing.T) {
	reg := prometheus.NewRegistry()
	pub := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatcher_tasks_dispatched_total"}, []string{"queue"})
	errs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatcher_errors_total"}, []string{"queue", "kind"})
	reg.MustRegister(pub, errs)
	c := newCountSampler(reg)
	c.keep = 3
	at := time.Unix(1_800_000_000, 0)
	for n := range 5 {
		pub.WithLabelValues("a").Add(10)
		errs.WithLabelValues("a", "redis").Add(1)
		errs.WithLabelValues("a", "nack").Add(2)
		c.sample(at.Add(time.Duration(n) * time.Second))
	}
	got := c.counts()["a"]
	if len(got) != 3 {
		t.Fatalf("%d samples kept, want 3", len(got))
	}
	last := got[2]
	if !last.At.Equal(at.Add(4*time.Second)) || last.Published != 50 || last.Errors["redis"] != 5 || last.Errors["nack"] != 10 {
		t.Errorf("last sample %+v", last)
	}
	if got[0].Published != 30 {
		t.Errorf("oldest kept sample %+v, want the third", got[0])
	}
}
