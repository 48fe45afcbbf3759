package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/statuspage"
)

// counterTotals reads this instance's counters per queue from reg for its
// records: tasks confirmed, errors of any kind, and the dispatch lateness
// histogram.
func counterTotals(reg prometheus.Gatherer) func() map[string]instances.Totals {
	return func() map[string]instances.Totals {
		out := map[string]instances.Totals{}
		mfs, err := reg.Gather()
		if err != nil {
			return out
		}
		for _, mf := range mfs {
			name := mf.GetName()
			if name != "dispatcher_tasks_dispatched_total" && name != "dispatcher_errors_total" && name != "dispatcher_dispatch_lateness_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				var queue string
				for _, l := range m.GetLabel() {
					if l.GetName() == "queue" {
						queue = l.GetValue()
					}
				}
				t := out[queue]
				switch name {
				case "dispatcher_tasks_dispatched_total":
					t.Published += m.GetCounter().GetValue()
				case "dispatcher_errors_total":
					t.Errors += m.GetCounter().GetValue()
				default:
					h := m.GetHistogram()
					for _, b := range h.GetBucket() {
						t.Late = append(t.Late, instances.Bucket{UpTo: b.GetUpperBound(), Count: b.GetCumulativeCount()})
					}
					t.Late = append(t.Late, instances.Bucket{UpTo: math.Inf(1), Count: h.GetSampleCount()})
				}
				out[queue] = t
			}
		}
		return out
	}
}

// hostPID are the host name and process id an instance's records carry.
func hostPID() (string, int) {
	host, _ := os.Hostname()
	return host, os.Getpid()
}

// fleetEvery is how long the records read for the status page and
// /readyz are reused: page reloads and probes do not add reads.
const fleetEvery = 2 * time.Second

// fleet reads what the records of every live instance say of the served
// queues, this instance's own up to the moment.
type fleet struct {
	rdb    redis.UniversalClient
	prefix string
	queues []string
	self   *instances.Recorder
	id     string

	mu     sync.Mutex // one read at a time; the others wait and reuse it
	readAt time.Time
	last   []instances.Queue
}

func (f *fleet) read(ctx context.Context) []instances.Queue {
	f.mu.Lock()
	if time.Since(f.readAt) >= fleetEvery {
		f.last = instances.Read(ctx, f.rdb, f.prefix, f.queues, instances.TTL)
		f.readAt = time.Now()
	}
	since := time.Since(f.readAt).Milliseconds()
	qs := make([]instances.Queue, len(f.last))
	for n, q := range f.last {
		q.Records = append([]instances.Record(nil), q.Records...)
		if q.NowMs > 0 {
			q.NowMs += since
		}
		qs[n] = q
	}
	f.mu.Unlock()
	own := f.self.Current()
	for n := range qs {
		q := &qs[n]
		rec, ok := own[q.Name]
		if !ok {
			continue
		}
		if q.NowMs == 0 {
			q.NowMs = rec.SeenMs
		}
		replaced := false
		for i := range q.Records {
			if q.Records[i].ID == f.id {
				q.Records[i], replaced = rec, true
			}
		}
		if !replaced {
			q.Records = append(q.Records, rec)
		}
	}
	return qs
}

// wholeLines say, for /readyz, each queue as a whole: its live instances,
// what they published lately and how late, who sweeps it, and whether it
// is paused; then each instance.
func wholeLines(qs []instances.Queue, self string) []string {
	var out []string
	type inst struct {
		r      instances.Record
		sweeps []string
		nowMs  int64
	}
	by := map[string]*inst{}
	var ids []string
	for _, q := range qs {
		s := instances.Add(q.Records)
		line := fmt.Sprintf("queue %s: %s", q.Name, plural(s.Instances, "live instance", "live instances"))
		if s.Sweeper != "" {
			line += ", swept by " + s.Sweeper
		} else {
			line += ", swept by none of them"
		}
		line += fmt.Sprintf("; published %s/s over the last %s", statuspage.FmtRate(s.Rate), (time.Duration(s.SpanMs) * time.Millisecond).Round(time.Second))
		if p50 := s.Late.QuantileText(0.5); p50 != "" {
			line += fmt.Sprintf("; lateness p50 %s, p99 %s", p50, s.Late.QuantileText(0.99))
		}
		if s.Errors > 0 {
			line += fmt.Sprintf("; %d errors", s.Errors)
		}
		if q.Err != nil {
			line += "; the other instances' records cannot be read: " + q.Err.Error()
		}
		out = append(out, line)
		if l := ingressLine(q.Name, q.Records); l != "" {
			out = append(out, l)
		}
		if s.Paused > 0 {
			out = append(out, fmt.Sprintf("queue %s: paused (%d shards): nothing is claimed until `dispatcher resume --queue %s`", q.Name, s.Paused, q.Name))
		}
		for _, r := range q.Records {
			in := by[r.ID]
			if in == nil {
				in = &inst{}
				by[r.ID] = in
				ids = append(ids, r.ID)
			}
			if r.SeenMs >= in.r.SeenMs {
				in.r, in.nowMs = r, q.NowMs
			}
			if r.Sweeps {
				in.sweeps = append(in.sweeps, q.Name)
			}
		}
	}
	for _, id := range ids {
		in := by[id]
		name := "instance " + id
		if id == self {
			name += " (this one)"
		}
		sweeps := "nothing"
		if len(in.sweeps) > 0 {
			sweeps = strings.Join(in.sweeps, ", ")
		}
		seen := "now"
		if ago := time.Duration(in.nowMs-in.r.SeenMs) * time.Millisecond; ago >= 100*time.Millisecond {
			seen = ago.Round(100*time.Millisecond).String() + " ago"
		}
		out = append(out, fmt.Sprintf("%s: host %s, pid %d, version %s; sweeps %s; last seen %s",
			name, in.r.Host, in.r.PID, in.r.Version, sweeps, seen))
	}
	return out
}
