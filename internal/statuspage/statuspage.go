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
	"strings"
	"time"

	"github.com/dispatcher/dispatcher/internal/monitor"
)

//go:embed page.html
var files embed.FS

var page = template.Must(template.New("page.html").Funcs(template.FuncMap{
	"dur":   fmtDur,
	"count": fmtCount,
	"when":  fmtWhen,
	"sub80": func(h float64) float64 { return chartH - h },
}).ParseFS(files, "page.html"))

// Data is what the page shows.
type Data struct {
	Instance string
	Now      time.Time
	Refresh  int // seconds between reloads
	Broker   Broker
	Redis    Redis
	Stalls   []string
	Queues   []monitor.View
	// Lateness is this instance's dispatch lateness per queue, from its
	// histogram.
	Lateness map[string][]Bucket
	// Recurring lists the served queues' recurring schedules.
	Recurring []Recurring
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
	v := view{Data: d}
	for _, q := range d.Queues {
		v.Rows = append(v.Rows, queueRow(q, d.Lateness[q.State.Name]))
	}
	return page.Execute(w, v)
}

type view struct {
	Data
	Rows []row
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
}

type chart struct {
	Points string // SVG polyline points
	Max    time.Duration
	Span   time.Duration
	Empty  bool
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
	r.Lateness, r.LatTotal = latBars(lat)
	return r
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
