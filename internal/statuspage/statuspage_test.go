package statuspage

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/monitor"
	"github.com/dispatcher/dispatcher/internal/queuestate"
)

func TestLatBarsFromCumulativeBuckets(t *testing.T) {
	bars, total := latBars([]Bucket{{0.001, 2}, {0.01, 7}, {1, 7}, {math.Inf(1), 9}})
	if total != 9 || len(bars) != 4 {
		t.Fatalf("total %d, %d bars", total, len(bars))
	}
	want := []uint64{2, 5, 0, 2}
	for n, b := range bars {
		if b.Count != want[n] {
			t.Errorf("bar %d (%s) = %d, want %d", n, b.Label, b.Count, want[n])
		}
	}
	if bars[1].H != chartH || bars[2].H != 0 || bars[3].Label != ">1s" || bars[0].Label != "≤1ms" {
		t.Errorf("bars %+v", bars)
	}
}

func TestFmtCount(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := fmtCount(n); got != want {
			t.Errorf("fmtCount(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestRenderEscapes: text that reaches the page from Redis (an error
// naming a key a producer chose) is escaped, not markup.
func TestRenderEscapes(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	q := monitor.View{
		State: queuestate.Queue{Name: "orders", Broken: 1, Shards: []queuestate.Shard{
			{Index: 0, Pending: 3, Due: 1},
			{Index: 1, Err: `WRONGTYPE key dq:{orders:1} holds a <script>alert(1)</script>`},
		}},
		History: []monitor.Sample{{At: at, Age: 0}, {At: at.Add(time.Second), Age: 2 * time.Second}},
		Swept:   true,
	}
	var buf bytes.Buffer
	if err := Render(&buf, Data{Instance: "h:1:ab", Refresh: 2, Queues: []monitor.View{q}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if strings.Contains(page, "<script>") || !strings.Contains(page, "&lt;script&gt;") {
		t.Error("an error text from Redis reached the page unescaped")
	}
	if !strings.Contains(page, `points="0.0,80.0 600.0,0.0"`) {
		t.Errorf("age chart points not as plotted:\n%s", page)
	}
}

func TestFlow(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	var cs []Count
	for n := range 31 { // 30 s at 20 tasks a second, 1 redis error every 10 s
		cs = append(cs, Count{At: at.Add(time.Duration(n) * time.Second), Published: float64(20 * n),
			Errors: map[string]float64{"redis": float64(n / 10), "nack": 0}})
	}
	cs[30].Errors["wrongtype"] = 7
	f := flowOf(cs)
	if f.Rate != 20 || f.Recent != 10*time.Second || f.Span != 30*time.Second || f.Errors != 10 || f.Kinds != "wrongtype 7, redis 3" {
		t.Errorf("flow %+v", f)
	}
	if f := flowOf(cs[:1]); f.Measured {
		t.Errorf("one sample: %+v", f)
	}
}

func TestNiceCeil(t *testing.T) {
	for v, want := range map[float64]float64{1: 1, 1.1: 2, 3: 5, 7: 10, 20: 20, 21: 50, 0.3: 0.5} {
		if got := niceCeil(v); math.Abs(got-want) > 1e-9 {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}

// TestRenderAxesAndFreshness: the pictures carry values on their axes, and
// each queue says when its figures were read.
func TestRenderAxesAndFreshness(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	q := monitor.View{
		State:   queuestate.Queue{Name: "orders", Shards: []queuestate.Shard{{Index: 0, Pending: 1200}, {Index: 1}}},
		History: []monitor.Sample{{At: now.Add(-time.Minute)}, {At: now, Age: 3 * time.Second}},
		ReadAt:  now.Add(-7200 * time.Millisecond), Swept: true,
	}
	var buf bytes.Buffer
	if err := Render(&buf, Data{Refresh: 2, Now: now, Queues: []monitor.View{q}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{"figures read 7.2s ago", `text-anchor="end">1,200</text>`, ">shard 1</text>", ">−1m0s</text>", `text-anchor="end">3s</text>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

// TestRenderRetried: a queue whose tasks are retried after failed
// publishes does not say "on time": it shows how many are retried and how
// late the oldest is.
func TestRenderRetried(t *testing.T) {
	q := monitor.View{
		State: queuestate.Queue{Name: "orders", Inflight: 5, Retried: 5, RetriedAge: 150 * time.Second, OldestDueAge: 150 * time.Second,
			Shards: []queuestate.Shard{{Index: 0, Inflight: 5, Retried: 5, RetriedAge: 150 * time.Second, OldestDueAge: 150 * time.Second}}},
		Swept: true,
	}
	var buf bytes.Buffer
	if err := Render(&buf, Data{Instance: "h:1:ab", Refresh: 2, Queues: []monitor.View{q}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if strings.Contains(page, "on time") || !strings.Contains(page, "publishes retried") ||
		!strings.Contains(page, `<td><span class="warn">5</span></td><td>`+fmtDur(150*time.Second)+`</td>`) {
		t.Errorf("page of a queue with 5 tasks retried for 2m30s:\n%s", page)
	}
}

// TestRenderRecurring: the recurring schedules' table shows each one's
// state, last and next occurrence; a failing one shows why, escaped.
func TestRenderRecurring(t *testing.T) {
	var b strings.Builder
	err := Render(&b, Data{Recurring: []Recurring{
		{Queue: "orders", Name: "nightly", Cron: "0 9 * * *", TZ: "Europe/Berlin", CatchUp: "latest", Source: "file",
			LastMs: 1_800_000_000_000, NextMs: 1_800_086_400_000},
		{Queue: "orders", Name: "held", Cron: "@every 30s", CatchUp: "skip", Source: "cli", Paused: true},
		{Queue: "orders", Name: "blocked", Cron: "@hourly", CatchUp: "all", Error: "a task with the same body <b>"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{"Recurring schedules", "nightly", "Europe/Berlin", "2027-01-15 08:00:00.000Z", "2027-01-16 08:00:00.000Z",
		`<span class="warn">paused</span>`, "failing: a task with the same body &lt;b&gt;"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
