package main

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dispatcher/dispatcher/internal/statuspage"
)

// countSampler samples this instance's per-queue counters of tasks
// published (dispatcher_tasks_dispatched_total) and errors by kind
// (dispatcher_errors_total) about once a second, keeping the last keep
// samples, for the status page's published-per-second and errors.
type countSampler struct {
	reg   prometheus.Gatherer
	every time.Duration
	keep  int

	mu      sync.Mutex
	samples map[string][]statuspage.Count
}

func newCountSampler(reg prometheus.Gatherer) *countSampler {
	return &countSampler{reg: reg, every: time.Second, keep: 300, samples: map[string][]statuspage.Count{}}
}

// Run samples every interval until ctx ends.
func (c *countSampler) Run(ctx context.Context) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	c.sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.sample(now)
		}
	}
}

func (c *countSampler) sample(now time.Time) {
	mfs, err := c.reg.Gather()
	if err != nil {
		return
	}
	got := map[string]*statuspage.Count{}
	count := func(queue string) *statuspage.Count {
		if got[queue] == nil {
			got[queue] = &statuspage.Count{At: now, Errors: map[string]float64{}}
		}
		return got[queue]
	}
	for _, mf := range mfs {
		name := mf.GetName()
		if name != "dispatcher_tasks_dispatched_total" && name != "dispatcher_errors_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var queue, kind string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "queue":
					queue = l.GetValue()
				case "kind":
					kind = l.GetValue()
				}
			}
			v := m.GetCounter().GetValue()
			if name == "dispatcher_errors_total" {
				count(queue).Errors[kind] += v
			} else {
				count(queue).Published += v
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for queue, s := range got {
		ss := append(c.samples[queue], *s)
		if len(ss) > c.keep {
			ss = append(ss[:0:0], ss[len(ss)-c.keep:]...)
		}
		c.samples[queue] = ss
	}
}

// counts returns a copy of the samples per queue, oldest first.
func (c *countSampler) counts() map[string][]statuspage.Count {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string][]statuspage.Count, len(c.samples))
	for q, ss := range c.samples {
		out[q] = append([]statuspage.Count(nil), ss...)
	}
	return out
}
