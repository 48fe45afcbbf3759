// Package instances keeps, per queue, a small record of every live
// instance serving it in Redis: who it is (id, host, pid, version), whether
// it sweeps the queue, what it published lately and how late. Every
// instance writes its records every few seconds, in one pipeline for all
// its queues; any instance's status page and /readyz read them to show the
// queue as a whole, not only what the instance itself did.
//
// The records of queue Q are the fields of one hash, P:{Q}:instances
// (shard.Keys.Instances), so that on Redis Cluster they live on one node
// with the queue's other {Q} keys. A record not renewed for TTL is gone:
// readers skip it, the next write prunes it, and the hash expires TTL
// after its last write.
package instances

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

const (
	// Every is how often an instance writes its records.
	Every = 5 * time.Second
	// TTL is how long a record lives without being renewed: three writes
	// missed.
	TTL = 4 * Every
	// Window is how far back a record's figures look ("lately").
	Window = time.Minute
	// SlotSpan and Slots: a record carries what it published per SlotSpan
	// over the last Slots of them (5 minutes), for the status page's chart.
	SlotSpan = Every
	Slots    = 60
)

// Record is what one instance says of one queue.
type Record struct {
	ID     string `json:"-"` // the instance's id, host:pid:random
	SeenMs int64  `json:"-"` // when it was written, by the Redis clock

	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Version string `json:"version"`
	// Sweeps: the instance holds the queue's sweeper role.
	Sweeps bool `json:"sweeps,omitempty"`
	// Paused is, on the sweeping instance's record, how many of the
	// queue's shards `dispatcher pause` held at its last read of them.
	Paused int `json:"paused,omitempty"`

	// Over the last SpanMs (Window, or since the instance started if that
	// is shorter): tasks the broker confirmed, errors met, and the
	// dispatch lateness of the tasks published, by bucket.
	SpanMs    int64 `json:"span_ms"`
	Published int64 `json:"published"`
	Errors    int64 `json:"errors,omitempty"`
	Late      Late  `json:"late,omitempty"`

	// Slots are the tasks published per SlotSpan, oldest first; the last
	// slot ends at EndMs (Redis clock, a multiple of SlotSpan).
	EndMs int64   `json:"end_ms,omitempty"`
	Slots []int64 `json:"slots,omitempty"`

	// Ingress is the queue's AMQP ingress on this instance, if it runs it.
	Ingress *Ingress `json:"ingress,omitempty"`
}

// Rate is what the record says the instance published per second lately.
func (r Record) Rate() float64 {
	if r.SpanMs <= 0 {
		return 0
	}
	return float64(r.Published) / (float64(r.SpanMs) / 1000)
}

// Bucket is one bucket of a lateness histogram: Count tasks published at
// most UpTo seconds late (and, in a Late, later than the bucket before).
type Bucket struct {
	UpTo  float64 // seconds; +Inf for the last
	Count uint64
}

// Late is a lateness histogram by bucket, not cumulative, sorted by UpTo;
// empty buckets may be left out. In JSON it is an object from the upper
// bound ("0.005", "+Inf") to the count, so that readers need not know the
// writer's buckets.
type Late []Bucket

func (l Late) MarshalJSON() ([]byte, error) {
	m := make(map[string]uint64, len(l))
	for _, b := range l {
		if b.Count > 0 {
			m[strconv.FormatFloat(b.UpTo, 'g', -1, 64)] = b.Count
		}
	}
	return json.Marshal(m)
}

func (l *Late) UnmarshalJSON(data []byte) error {
	var m map[string]uint64
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	out := make(Late, 0, len(m))
	for k, n := range m {
		up, err := strconv.ParseFloat(k, 64)
		if err != nil {
			return fmt.Errorf("lateness bucket %q: %w", k, err)
		}
		out = append(out, Bucket{UpTo: up, Count: n})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].UpTo < out[b].UpTo })
	*l = out
	return nil
}

// Total is the number of tasks in the histogram.
func (l Late) Total() uint64 {
	var n uint64
	for _, b := range l {
		n += b.Count
	}
	return n
}

// Quantile is the upper bound of the bucket holding the q-th quantile
// (0 < q ≤ 1): "p99 at most this late". ok is false for an empty histogram.
func (l Late) Quantile(q float64) (upTo float64, ok bool) {
	total := l.Total()
	if total == 0 {
		return 0, false
	}
	want := uint64(math.Ceil(q * float64(total)))
	var cum uint64
	for _, b := range l {
		if cum += b.Count; cum >= max(want, 1) {
			return b.UpTo, true
		}
	}
	return l[len(l)-1].UpTo, true
}

// add merges o into l.
func (l Late) add(o Late) Late {
	by := map[float64]uint64{}
	for _, b := range l {
		by[b.UpTo] += b.Count
	}
	for _, b := range o {
		by[b.UpTo] += b.Count
	}
	out := make(Late, 0, len(by))
	for up, n := range by {
		out = append(out, Bucket{UpTo: up, Count: n})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].UpTo < out[b].UpTo })
	return out
}

// encode is a record as its hash field's value holds it, without the
// "<seen_ms> " the write puts first.
func encode(r Record) (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encode the record of %s: %w", r.ID, err)
	}
	return string(b), nil
}

// decode reads a field's value, "<seen_ms> <JSON>".
func decode(id, v string) (Record, error) {
	seen, js, ok := strings.Cut(v, " ")
	var r Record
	ms, err := strconv.ParseInt(seen, 10, 64)
	if !ok || err != nil {
		return r, fmt.Errorf("record of %s: want \"<seen_ms> <JSON>\", got %.40q", id, v)
	}
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		return r, fmt.Errorf("record of %s: %w", id, err)
	}
	r.ID, r.SeenMs = id, ms
	return r, nil
}

// Sum is a queue as a whole: its live records added up.
type Sum struct {
	Instances int
	// Sweeper is the id of the instance whose record says it sweeps the
	// queue ("" if none does), Paused what that record says.
	Sweeper string
	Paused  int
	// Published and Errors over the records' spans; Rate is the sum of
	// each instance's rate, SpanMs the longest span.
	Published, Errors int64
	Rate              float64
	SpanMs            int64
	Late              Late
	// Slots are the tasks published per SlotSpan by all instances, oldest
	// first, the last ending at EndMs; zero if no record had any.
	EndMs int64
	Slots []int64
}

// Add adds the records up.
func Add(recs []Record) Sum {
	var s Sum
	var sweeperSeen int64
	for _, r := range recs {
		s.Instances++
		// Right after the role moved, two records may say so for a few
		// seconds: the later one is right.
		if r.Sweeps && (s.Sweeper == "" || r.SeenMs > sweeperSeen) {
			s.Sweeper, s.Paused, sweeperSeen = r.ID, r.Paused, r.SeenMs
		}
		s.Published += r.Published
		s.Errors += r.Errors
		s.Rate += r.Rate()
		s.SpanMs = max(s.SpanMs, r.SpanMs)
		s.Late = s.Late.add(r.Late)
		s.EndMs = max(s.EndMs, r.EndMs)
	}
	if s.EndMs == 0 {
		return s
	}
	slot := SlotSpan.Milliseconds()
	s.Slots = make([]int64, Slots)
	last := s.EndMs / slot
	for _, r := range recs {
		for k, n := range r.Slots {
			idx := r.EndMs/slot - int64(len(r.Slots)-1-k)
			if at := Slots - 1 - int(last-idx); at >= 0 && at < Slots {
				s.Slots[at] += n
			}
		}
	}
	return s
}

// QuantileText says the q-th quantile: "≤5ms", or ">300s" past the last
// finite bound; "" for an empty histogram.
func (l Late) QuantileText(q float64) string {
	up, ok := l.Quantile(q)
	if !ok {
		return ""
	}
	if !math.IsInf(up, 1) {
		return "≤" + seconds(up)
	}
	top := 0.0
	for _, b := range l {
		if !math.IsInf(b.UpTo, 1) {
			top = b.UpTo
		}
	}
	return ">" + seconds(top)
}

func seconds(s float64) string {
	if s < 1 {
		return strconv.FormatFloat(s*1000, 'g', -1, 64) + "ms"
	}
	return strconv.FormatFloat(s, 'g', -1, 64) + "s"
}
