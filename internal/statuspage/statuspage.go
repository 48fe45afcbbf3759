// Package statuspage renders the dispatcher's read-only status page: the
// queues' figures, pictures of their lateness and per-shard backlog, and
// the state of the broker and Redis. Server-rendered HTML and inline SVG,
// refreshing itself: no scripts, no front-end build.
package statuspage

import (
	"embed"
	"fmt"
	"html/template"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/monitor"
)

//go:embed page.html
var files embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"dur":    fmtDur,
	"count":  fmtCount,
	"when":   fmtWhen,
	"sub80":  func(h float64) float64 { return chartH - h },
	"rate":   FmtRate,
	"ucount": func(n uint64) string { return fmtCount(int64(n)) },
	"last":   func(n int) int { return n - 1 },
	"join":   func(s []string) string { return strings.Join(s, ", ") },
}).ParseFS(files, "page.html"))

// Data is what the page shows.
type Data struct {
	Instance string
	Now      time.Time
	Refresh  int // seconds between reloads
	Broker   Broker
	Redis    Redis
	Stalls   []string
	// Starting says what the start of the process waits for (Redis, say);
	// "" once it is over. No queue is shown before.
	Starting string
	Queues   []monitor.View
	// Lateness is this instance's dispatch lateness per queue, from its
	// histogram: its buckets are the lateness picture's (with those of
	// the other instances' records).
	Lateness map[string][]Bucket
	// Counts are this instance's counters per queue, sampled about once a
	// second, oldest first: what it published per second and the errors
	// it met come from them.
	Counts map[string][]Count
	// Recurring lists the served queues' recurring schedules.
	Recurring []Recurring
	// Whole is what the records of every live instance serving the queues
	// say of each (package instances), this instance's own up to the
	// moment: the queue as a whole.
	Whole []instances.Queue
	// Ingress lists the served queues' AMQP ingresses on this instance.
	Ingress []Ingress
}

// Count is one sample of a queue's counters on this instance (cumulative,
// since it started).
type Count struct {
	At        time.Time
	Published float64            // tasks the broker confirmed
	Errors    map[string]float64 // by kind (redis, wrongtype, nack, ...)
}

// Recurring is one recurring schedule as the page shows it.
type Recurring struct {
	Queue, Name, Cron, TZ, CatchUp, Source string
	Paused                                 bool
	NextMs, LastMs                         int64 // 0: none yet
	Error                                  string
}

// Broker is the broker's state as this instance sees it.
type Broker struct {
	URL       string // redacted; the nodes' URLs in the order they are tried
	Node      string // host:port of the node in use, when connected
	Connected bool
	Blocked   bool
}

// Redis is Redis's state as this instance sees it.
type Redis struct {
	URL      string // redacted
	Mode     string
	Problems []string
}

// Bucket is one bucket of a lateness histogram: tasks dispatched at most
// UpTo late (and later than the bucket before).
type Bucket struct {
	UpTo  float64 // seconds; +Inf for the last
	Count uint64
}

// Render writes the page.
func Render(w io.Writer, d Data) error {
	v := view{Data: d, Instances: instanceRows(d.Whole, d.Instance)}
	byName := map[string]instances.Queue{}
	for _, wq := range d.Whole {
		byName[wq.Name] = wq
	}
	v.IngressRows = ingressRows(d, byName)
	for _, q := range d.Queues {
		name := q.State.Name
		wq, ok := byName[name]
		wh := wholeOf(wq, ok, d.Instance)
		// The lateness picture is the queue's over the last minute, all
		// instances together, in this instance's buckets and theirs.
		r := queueRow(q, cumulative(wh.Sum.Late, d.Lateness[name]))
		r.ReadAgo = fmtAgo(d.Now, q.ReadAt)
		r.Flow = flowOf(d.Counts[name])
		r.Whole = wh
		r.Published = publishedChart(wh.Sum, wq.NowMs, d.Counts[name], d.Now)
		v.Rows = append(v.Rows, r)
	}
	return page.Execute(w, v)
}

type view struct {
	Data
	Rows        []row
	Instances   []instanceRow
	IngressRows []ingressRow
}

// row is one queue with its pictures laid out.
type row struct {
	monitor.View
	Late     bool
	Age      chart
	Backlog  []bar
	BarWidth float64
	MaxShard int64
	Broken   []brokenShard
	Lateness []latBar
	LatTotal uint64
	LatTop   uint64 // the tallest lateness bar's count
	ReadAgo  string // how long ago the figures were read; "" if never
	Flow     flow
	Ahead    ahead
	// Herd says the thundering herd coming, "" if none is.
	Herd string
	// Whole is the queue across its instances; Published its picture.
	Whole     whole
	Published published
}

// ahead is the hour ahead as the page draws it: a bar per minute.
type ahead struct {
	Read    bool
	Bars    []latBar
	BarW    float64
	Top     int64 // the value at the top of the chart
	Total   int64
	Overdue int64
	Peak    string // the busiest second, said
}

type chart struct {
	Points string // SVG polyline points
	Max    time.Duration
	Top    time.Duration // the value at the top of the chart
	Span   time.Duration
	Empty  bool
}

// flow is what this instance published per second and the errors it
// met, from its counters' samples.
type flow struct {
	Rate     float64       // published per second over the last recentSpan
	Recent   time.Duration // the span Rate is over
	Span     time.Duration // the span of all samples: the errors' window
	Errors   int64         // errors over Span
	Kinds    string        // "wrongtype 12, redis 3"
	Measured bool          // at least two samples
}

// recentSpan is how far back the published rate shown as a figure looks.
const recentSpan = 10 * time.Second

func flowOf(cs []Count) flow {
	f := flow{Measured: len(cs) >= 2}
	if !f.Measured {
		return f
	}
	first, last := cs[0], cs[len(cs)-1]
	f.Span = last.At.Sub(first.At)
	from := first
	for _, c := range cs {
		if last.At.Sub(c.At) <= recentSpan {
			from = c
			break
		}
	}
	if f.Recent = last.At.Sub(from.At); f.Recent > 0 {
		f.Rate = (last.Published - from.Published) / f.Recent.Seconds()
	}
	var kinds []string
	for kind, n := range last.Errors {
		if d := int64(n - first.Errors[kind]); d > 0 {
			f.Errors += d
			kinds = append(kinds, kind)
		}
	}
	sort.Slice(kinds, func(a, b int) bool {
		da, db := last.Errors[kinds[a]]-first.Errors[kinds[a]], last.Errors[kinds[b]]-first.Errors[kinds[b]]
		return da > db || (da == db && kinds[a] < kinds[b])
	})
	for n, k := range kinds {
		kinds[n] = fmt.Sprintf("%s %d", k, int64(last.Errors[k]-first.Errors[k]))
	}
	f.Kinds = strings.Join(kinds, ", ")
	return f
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten, for an axis.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

type bar struct {
	Shard        int
	X, H, DueH   float64
	Pending, Due int64
	Broken       bool
	Title        string
}

type brokenShard struct {
	Shard int
	Err   string
}

type latBar struct {
	Label string
	X, H  float64
	Count uint64
}

const (
	chartW, chartH = 600.0, 80.0
)

func queueRow(q monitor.View, lat []Bucket) row {
	r := row{View: q, Late: q.State.OldestDueAge > 0}
	r.Age = ageChart(q.History)
	n := len(q.State.Shards)
	if n > 0 {
		r.BarWidth = chartW / float64(n)
	}
	for _, s := range q.State.Shards {
		r.MaxShard = max(r.MaxShard, s.Pending)
	}
	for _, s := range q.State.Shards {
		b := bar{Shard: s.Index, X: float64(s.Index) * r.BarWidth, Pending: s.Pending, Due: s.Due}
		switch {
		case s.Err != "":
			b.Broken, b.H = true, chartH
			b.Title = fmt.Sprintf("shard %d: broken: %s", s.Index, s.Err)
			r.Broken = append(r.Broken, brokenShard{s.Index, s.Err})
		case r.MaxShard > 0:
			b.H = chartH * float64(s.Pending) / float64(r.MaxShard)
			b.DueH = chartH * float64(s.Due) / float64(r.MaxShard)
			b.Title = fmt.Sprintf("shard %d: %d pending, %d due", s.Index, s.Pending, s.Due)
		default:
			b.Title = fmt.Sprintf("shard %d: empty", s.Index)
		}
		r.Backlog = append(r.Backlog, b)
	}
	r.Ahead, r.Herd = aheadOf(q)
	r.Lateness, r.LatTotal = latBars(lat)
	for _, b := range r.Lateness {
		r.LatTop = max(r.LatTop, b.Count)
	}
	return r
}

// aheadOf lays the hour ahead out as bars and says the herd coming, if
// one is: in the next minute as the sweeping instance counted it, else in
// the hour.
func aheadOf(q monitor.View) (ahead, string) {
	var a ahead
	herd := ""
	if a2 := q.Ahead; a2.Herd {
		herd = fmt.Sprintf("%s tasks fall due in one second at %s (within the next minute); queue %s drains %s in 10 s at %s/s (%s)",
			fmtCount(a2.Peak.Tasks), fmtWhen(a2.Peak.FromMs), q.State.Name, fmtCount(q.HerdLimit), FmtRate(a2.Drain), a2.DrainFrom)
	}
	f := q.Forecast
	if f == nil {
		return a, herd
	}
	a.Read, a.Total, a.Overdue = true, f.Total, f.Overdue
	for _, b := range f.Buckets {
		a.Top = max(a.Top, b.Tasks)
	}
	a.Top = int64(niceCeil(float64(max(a.Top, 1))))
	if len(f.Buckets) > 0 {
		a.BarW = chartW / float64(len(f.Buckets))
	}
	for n, b := range f.Buckets {
		a.Bars = append(a.Bars, latBar{Label: fmtWhen(b.FromMs), X: float64(n) * a.BarW, H: chartH * float64(b.Tasks) / float64(a.Top), Count: uint64(b.Tasks)})
	}
	switch p := f.Peak; {
	case p.Tasks == 0:
		a.Peak = "nothing due in the hour"
	default:
		a.Peak = fmt.Sprintf("busiest second: %s tasks at %s", fmtCount(p.Tasks), fmtWhen(p.FromMs))
		if !p.Exact {
			a.Peak += fmt.Sprintf(" (or up to %s in a minute not looked at second by second)", fmtCount(p.Bound))
		}
	}
	if herd == "" && q.HerdLimit > 0 && f.Peak.Tasks > q.HerdLimit {
		herd = fmt.Sprintf("%s tasks fall due in one second at %s; queue %s drains %s in 10 s at %s/s (%s)",
			fmtCount(f.Peak.Tasks), fmtWhen(f.Peak.FromMs), q.State.Name, fmtCount(q.HerdLimit), FmtRate(q.Drain), q.DrainFrom)
	}
	return a, herd
}

// ageChart plots the oldest due age over the samples kept.
func ageChart(h []monitor.Sample) chart {
	c := chart{Empty: len(h) < 2}
	if c.Empty {
		return c
	}
	for _, s := range h {
		c.Max = max(c.Max, s.Age)
	}
	top := max(c.Max, time.Second)
	c.Top = top
	from, to := h[0].At, h[len(h)-1].At
	c.Span = to.Sub(from)
	var pts []string
	for _, s := range h {
		x := chartW * float64(s.At.Sub(from)) / float64(max(c.Span, 1))
		y := chartH - chartH*float64(s.Age)/float64(top)
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
	}
	c.Points = strings.Join(pts, " ")
	return c
}

// latBars turns cumulative histogram buckets into one bar per bucket.
func latBars(bs []Bucket) ([]latBar, uint64) {
	if len(bs) == 0 {
		return nil, 0
	}
	counts := make([]uint64, len(bs))
	var prev, most uint64
	for n, b := range bs {
		counts[n] = b.Count - min(prev, b.Count)
		prev = b.Count
		most = max(most, counts[n])
	}
	total := bs[len(bs)-1].Count
	w := chartW / float64(len(bs))
	out := make([]latBar, len(bs))
	for n, b := range bs {
		label := "≤" + fmtSeconds(b.UpTo)
		if math.IsInf(b.UpTo, 1) {
			label = ">" + fmtSeconds(bs[max(n-1, 0)].UpTo)
		}
		h := 0.0
		if most > 0 {
			h = chartH * float64(counts[n]) / float64(most)
		}
		out[n] = latBar{Label: label, X: float64(n) * w, H: h, Count: counts[n]}
	}
	return out, total
}

// fmtAgo is how long before now at was: "850ms", "7.2s"; "" for a zero
// at (never).
func fmtAgo(now, at time.Time) string {
	if at.IsZero() {
		return ""
	}
	d := max(now.Sub(at), 0)
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// FmtRate writes a per-second figure with the precision it needs.
func FmtRate(r float64) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f", r)
	case r >= 10:
		return fmt.Sprintf("%.1f", r)
	default:
		return fmt.Sprintf("%.2f", r)
	}
}

func fmtSeconds(s float64) string {
	if s < 1 {
		return fmt.Sprintf("%gms", s*1000)
	}
	return fmt.Sprintf("%gs", s)
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// fmtCount writes a count with thin spaces between thousands.
func fmtCount(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteRune(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func fmtWhen(ms int64) string {
	if ms == 0 {
		return "none"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02 15:04:05.000Z")
}
