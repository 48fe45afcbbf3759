package instances

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Ingress is what an instance says of a queue's AMQP ingress it runs
// (package ingress), in its record.
type Ingress struct {
	Exchange  string `json:"exchange"`
	Consuming bool   `json:"consuming"`
	// Err says why it does not consume, when it does not.
	Err string `json:"error,omitempty"`
	// Ready is the messages ready in the ingress queue at its last read,
	// -1 if it has none (not consuming, or not read yet).
	Ready int64 `json:"ready"`
	// OldestMs is the age of the oldest message not yet in Redis as it
	// knows it, in ms, when the record was written.
	OldestMs int64 `json:"oldest_age_ms"`
	// Over the record's span: the tasks it wrote, and the messages it
	// refused or failed to write, by cause.
	Ingested int64            `json:"ingested"`
	Errors   map[string]int64 `json:"errors,omitempty"`
}

// IngressTotals are an instance's ingress counters of one queue since it
// started.
type IngressTotals struct {
	Ingested int64
	Errors   map[string]int64
}

// IngressSum is a queue's ingress as a whole, from the live records that
// have one.
type IngressSum struct {
	Exchange string
	// Instances run it; Consuming of them consume the ingress queue.
	Instances, Consuming int
	// Ready is the most any of them read (-1 if none did); OldestMs the
	// oldest age any of them knows.
	Ready    int64
	OldestMs int64
	// Rate is the tasks written per second lately, all together; Errors
	// by cause over the records' spans, SpanMs the longest.
	Rate   float64
	Errors map[string]int64
	SpanMs int64
	// NotConsuming lists the instances that do not consume, with why.
	NotConsuming []NotConsuming
}

// NotConsuming is an instance that does not consume the ingress queue.
type NotConsuming struct {
	ID  string `json:"instance"`
	Err string `json:"error"`
}

// AddIngress adds up the ingress of the records; nil if none has one.
func AddIngress(recs []Record) *IngressSum {
	var s *IngressSum
	for _, r := range recs {
		in := r.Ingress
		if in == nil {
			continue
		}
		if s == nil {
			s = &IngressSum{Ready: -1, Errors: map[string]int64{}}
		}
		s.Exchange = in.Exchange
		s.Instances++
		if in.Consuming {
			s.Consuming++
		} else {
			s.NotConsuming = append(s.NotConsuming, NotConsuming{ID: r.ID, Err: in.Err})
		}
		s.Ready = max(s.Ready, in.Ready)
		s.OldestMs = max(s.OldestMs, in.OldestMs)
		if r.SpanMs > 0 {
			s.Rate += float64(in.Ingested) / (float64(r.SpanMs) / 1000)
		}
		s.SpanMs = max(s.SpanMs, r.SpanMs)
		for c, n := range in.Errors {
			s.Errors[c] += n
		}
	}
	if s != nil {
		sort.Slice(s.NotConsuming, func(a, b int) bool { return s.NotConsuming[a].ID < s.NotConsuming[b].ID })
	}
	return s
}

// ErrorCount is the errors of all causes.
func (s *IngressSum) ErrorCount() int64 {
	var n int64
	for _, v := range s.Errors {
		n += v
	}
	return n
}

// ErrorText says the errors by cause, most first: "bad_header 3, redis 1";
// "" if none.
func (s *IngressSum) ErrorText() string {
	cs := slices.Collect(maps.Keys(s.Errors))
	sort.Slice(cs, func(a, b int) bool {
		if s.Errors[cs[a]] != s.Errors[cs[b]] {
			return s.Errors[cs[a]] > s.Errors[cs[b]]
		}
		return cs[a] < cs[b]
	})
	var out []string
	for _, c := range cs {
		if s.Errors[c] > 0 {
			out = append(out, fmt.Sprintf("%s %d", c, s.Errors[c]))
		}
	}
	return strings.Join(out, ", ")
}

// ingressDelta is the ingress counts between two readings; a cause the
// earlier lacks counts from zero.
func ingressDelta(from, to IngressTotals) (int64, map[string]int64) {
	var errs map[string]int64
	for c, n := range to.Errors {
		if d := n - from.Errors[c]; d > 0 {
			if errs == nil {
				errs = map[string]int64{}
			}
			errs[c] = d
		}
	}
	return max(to.Ingested-from.Ingested, 0), errs
}
