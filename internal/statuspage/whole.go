package statuspage

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/dispatcher/dispatcher/internal/instances"
)

// whole is one queue across the instances serving it, from their records.
type whole struct {
	Read bool   // records read (this instance's own at least)
	Err  string // why the other instances' records could not be read
	Sum  instances.Sum
	Span time.Duration // the figures' span: the last minute, or less for young instances
	// P50 and P99 of the dispatch lateness ("≤2ms"), "" without tasks.
	P50, P99 string
	Rows     []queueInstance
}

// queueInstance is what one instance did for the queue lately.
type queueInstance struct {
	ID        string
	This      bool
	Sweeps    bool
	Rate      float64
	Published int64
	Errors    int64
	P50, P99  string
	Seen      string // how long ago its record was written
}

// instanceRow is one live instance, over the queues this one serves.
type instanceRow struct {
	ID, Host, Version string
	PID               int
	This              bool
	Sweeps            []string // the queues it sweeps
	Queues            int      // of the queues shown, how many it serves
	Rate              float64  // published per second lately, all those queues
	Seen              string
}

func wholeOf(q instances.Queue, read bool, self string) whole {
	w := whole{Read: read && len(q.Records) > 0}
	if q.Err != nil {
		w.Err = q.Err.Error()
	}
	w.Sum = instances.Add(q.Records)
	w.Span = time.Duration(w.Sum.SpanMs) * time.Millisecond
	w.P50, w.P99 = w.Sum.Late.QuantileText(0.5), w.Sum.Late.QuantileText(0.99)
	for _, r := range q.Records {
		w.Rows = append(w.Rows, queueInstance{ID: r.ID, This: r.ID == self, Sweeps: r.Sweeps, Rate: r.Rate(),
			Published: r.Published, Errors: r.Errors, P50: r.Late.QuantileText(0.5), P99: r.Late.QuantileText(0.99),
			Seen: seenAgo(q.NowMs, r.SeenMs)})
	}
	return w
}

// instanceRows lists the live instances of all queues, this one first.
func instanceRows(qs []instances.Queue, self string) []instanceRow {
	by := map[string]*instanceRow{}
	seen := map[string]int64{}
	now := map[string]int64{}
	for _, q := range qs {
		for _, r := range q.Records {
			ir := by[r.ID]
			if ir == nil {
				ir = &instanceRow{ID: r.ID, Host: r.Host, PID: r.PID, Version: r.Version, This: r.ID == self}
				by[r.ID] = ir
			}
			ir.Queues++
			ir.Rate += r.Rate()
			if r.Sweeps {
				ir.Sweeps = append(ir.Sweeps, q.Name)
			}
			if r.SeenMs > seen[r.ID] {
				seen[r.ID], now[r.ID] = r.SeenMs, q.NowMs
			}
		}
	}
	out := make([]instanceRow, 0, len(by))
	for id, ir := range by {
		ir.Seen = seenAgo(now[id], seen[id])
		out = append(out, *ir)
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].This != out[b].This {
			return out[a].This
		}
		return out[a].ID < out[b].ID
	})
	return out
}

// seenAgo is how long before nowMs seenMs was, both by the Redis clock.
func seenAgo(nowMs, seenMs int64) string {
	if nowMs == 0 || seenMs == 0 {
		return ""
	}
	d := time.Duration(nowMs-seenMs) * time.Millisecond
	if d < 100*time.Millisecond {
		return "now"
	}
	return fmtDur(d) + " ago"
}

// cumulative turns a histogram of the last minute into cumulative buckets
// ending with +Inf, as latBars draws them, in the union of its bounds
// and those of this instance's histogram (own, cumulative), so that the
// picture has every bucket, empty ones included.
func cumulative(late instances.Late, own []Bucket) []Bucket {
	by := map[float64]uint64{math.Inf(1): 0}
	for _, b := range own {
		by[b.UpTo] += 0
	}
	for _, b := range late {
		by[b.UpTo] += b.Count
	}
	bounds := make([]float64, 0, len(by))
	for up := range by {
		bounds = append(bounds, up)
	}
	sort.Float64s(bounds)
	if len(bounds) == 1 && by[math.Inf(1)] == 0 {
		return nil // nothing to draw, and no bucket known
	}
	out := make([]Bucket, len(bounds))
	var cum uint64
	for n, up := range bounds {
		cum += by[up]
		out[n] = Bucket{UpTo: up, Count: cum}
	}
	return out
}

// published is the picture of what the queue published per second: all
// instances together per slot from their records, and this instance per
// second from its own counters, on one time axis.
type published struct {
	Queue string // SVG polyline points, all instances
	This  string // this instance, when others serve the queue too
	Top   float64
	Span  time.Duration
	Empty bool
}

// publishedChart draws s's slots (their ends by the Redis clock, now at
// nowMs) and this instance's samples cs (by the local clock, now at now)
// over the last Slots × SlotSpan.
func publishedChart(s instances.Sum, nowMs int64, cs []Count, now time.Time) published {
	span := instances.Slots * instances.SlotSpan
	p := published{Span: span, Empty: s.EndMs == 0 && len(cs) < 3}
	if p.Empty {
		return p
	}
	type point struct {
		ago  time.Duration
		rate float64
	}
	var queue, this []point
	slot := instances.SlotSpan
	for k, n := range s.Slots {
		end := s.EndMs - int64(len(s.Slots)-1-k)*slot.Milliseconds()
		queue = append(queue, point{time.Duration(nowMs-end) * time.Millisecond, float64(n) / slot.Seconds()})
	}
	if s.Instances > 1 || s.EndMs == 0 {
		for n := 1; n < len(cs); n++ {
			if dt := cs[n].At.Sub(cs[n-1].At).Seconds(); dt > 0 {
				this = append(this, point{now.Sub(cs[n].At), (cs[n].Published - cs[n-1].Published) / dt})
			}
		}
	}
	for _, pts := range [][]point{queue, this} {
		for _, pt := range pts {
			p.Top = max(p.Top, pt.rate)
		}
	}
	p.Top = niceCeil(max(p.Top, 1))
	line := func(pts []point) string {
		var out []string
		for _, pt := range pts {
			if pt.ago > span {
				continue
			}
			x := chartW * (1 - float64(max(pt.ago, 0))/float64(span))
			out = append(out, fmt.Sprintf("%.1f,%.1f", x, chartH-chartH*pt.rate/p.Top))
		}
		return strings.Join(out, " ")
	}
	p.Queue, p.This = line(queue), line(this)
	return p
}
