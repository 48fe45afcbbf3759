package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/statuspage"
)

// ingressSet holds the queues' ingresses once they are made, for the
// status page, /readyz and the records, which start before them.
type ingressSet struct {
	mu sync.Mutex
	gs []*ingress.Ingress
}

func (s *ingressSet) set(gs []*ingress.Ingress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gs = gs
}

// statuses are the ingresses' states now; nil before they are made.
func (s *ingressSet) statuses() []ingress.Status {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	gs := s.gs
	s.mu.Unlock()
	out := make([]ingress.Status, len(gs))
	for n, g := range gs {
		out[n] = g.Status()
	}
	return out
}

// totals adds the ingresses' counts to the counters' totals, for the
// records.
func (s *ingressSet) totals(tot func() map[string]instances.Totals) func() map[string]instances.Totals {
	return func() map[string]instances.Totals {
		out := tot()
		for _, st := range s.statuses() {
			t := out[st.Queue]
			t.Ingress = instances.IngressTotals{Ingested: st.Ingested, Errors: st.Errors}
			out[st.Queue] = t
		}
		return out
	}
}

// record is the state of the queue's ingress for its record, nil if the
// queue has none (the counts are added from the totals).
func (s *ingressSet) record(queue string) *instances.Ingress {
	for _, st := range s.statuses() {
		if st.Queue != queue {
			continue
		}
		in := &instances.Ingress{Exchange: st.Exchange, Consuming: st.Consuming, Ready: -1, OldestMs: st.OldestAge.Milliseconds()}
		if !st.Consuming {
			in.Err = or(st.Err, "not connected yet")
		} else if st.ReadErr == "" {
			in.Ready = st.Ready
		}
		return in
	}
	return nil
}

// readiness lists, for /readyz, what of the ingresses makes this instance
// not ready and which are behind (ingress.Status.Readiness).
func (s *ingressSet) readiness(after time.Duration) (notReady, behind []string) {
	for _, st := range s.statuses() {
		nr, b := st.Readiness(after)
		if nr != "" {
			notReady = append(notReady, nr)
		}
		if b != "" {
			behind = append(behind, b)
		}
	}
	return notReady, behind
}

// page is what the status page shows of the ingresses.
func (s *ingressSet) page(after time.Duration) []statuspage.Ingress {
	var out []statuspage.Ingress
	for _, st := range s.statuses() {
		nr, b := st.Readiness(after)
		p := statuspage.Ingress{Queue: st.Queue, Exchange: st.Exchange, IngressQueue: st.IngressQueue, Consuming: st.Consuming,
			Since: st.Since, Err: st.Err, Ready: -1, Consumers: st.Consumers, ReadAt: st.ReadAt, Held: st.Held,
			OldestAge: st.OldestAge, NotReady: nr, Behind: b}
		if st.Consuming && st.ReadErr == "" {
			p.Ready = st.Ready
		}
		if !st.Consuming && p.Err == "" {
			p.Err = "not connected yet"
		}
		out = append(out, p)
	}
	return out
}

// ingressLine says, for /readyz, a queue's ingress as a whole from the
// records, "" if no live instance runs one.
func ingressLine(queue string, recs []instances.Record) string {
	s := instances.AddIngress(recs)
	if s == nil {
		return ""
	}
	line := fmt.Sprintf("queue %s: ingress %s -> %s: %d of %s consuming", queue, s.Exchange, ingress.QueueName(queue), s.Consuming, plural(s.Instances, "instance", "instances"))
	if s.Ready >= 0 {
		line += fmt.Sprintf("; %d ready", s.Ready)
	}
	if s.OldestMs > 0 {
		line += fmt.Sprintf("; oldest message waiting %s", age(time.Duration(s.OldestMs)*time.Millisecond))
	}
	line += fmt.Sprintf("; ingested %s/s over the last %s", statuspage.FmtRate(s.Rate), (time.Duration(s.SpanMs) * time.Millisecond).Round(time.Second))
	if e := s.ErrorText(); e != "" {
		line += "; errors: " + e
	}
	for _, nc := range s.NotConsuming {
		line += fmt.Sprintf("; not consuming on %s: %s", nc.ID, nc.Err)
	}
	return line
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}
