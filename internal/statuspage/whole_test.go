package statuspage

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/monitor"
	"github.com/dispatcher/dispatcher/internal/queuestate"
)

// TestRenderWhole: the page of an instance that does not sweep the queue
// and published nothing shows the queue as a whole from the records: both
// instances, the other as the sweeper, the queue's rate and lateness, and
// a picture of what all of them published.
func TestRenderWhole(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	nowMs := now.UnixMilli()
	slots := make([]int64, instances.Slots)
	for n := range slots {
		slots[n] = 500 // 100 a second
	}
	other := instances.Record{ID: "b:2:cd", SeenMs: nowMs - 3200, Host: "b", PID: 2, Version: "v1.2.3", Sweeps: true,
		SpanMs: 60_000, Published: 6000, Errors: 4, Late: instances.Late{{UpTo: 0.002, Count: 5900}, {UpTo: 0.01, Count: 99}, {UpTo: math.Inf(1), Count: 1}},
		EndMs: nowMs - 3200 - (nowMs-3200)%5000, Slots: slots}
	self := instances.Record{ID: "a:1:ab", SeenMs: nowMs, Host: "a", PID: 1, Version: "v1.2.3", SpanMs: 60_000}
	q := monitor.View{State: queuestate.Queue{Name: "orders", Sweeper: "b:2:cd", Shards: []queuestate.Shard{{Index: 0}}}}
	var b strings.Builder
	err := Render(&b, Data{Instance: "a:1:ab", Now: now, Refresh: 2, Queues: []monitor.View{q},
		Lateness: map[string][]Bucket{"orders": {{0.001, 0}, {0.002, 0}, {0.005, 0}, {0.01, 0}, {math.Inf(1), 0}}},
		Whole:    []instances.Queue{{Name: "orders", NowMs: nowMs, Records: []instances.Record{other, self}}}})
	if err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{
		"<h2>Instances</h2>", "a:1:ab <span class=\"sub\">(this one)</span>", "b:2:cd", "v1.2.3", "3.2s ago",
		"All instances (2): published 100/s over the last 1m0s (6,000 tasks) · lateness p50 ≤2ms, p99 ≤10ms",
		`errors: <span class="bad">4</span>`, "swept by b:2:cd",
		"<td>sweeps</td><td>100</td><td>6,000</td><td>≤2ms</td><td>≤10ms</td><td>4</td><td>3.2s ago</td>",
		"<td>claims when busy</td><td>0.00</td><td>0</td><td>–</td><td>–</td><td>0</td><td>now</td>",
		"Dispatch lateness, all instances, over the last 1m0s (6000 tasks)",
		`text-anchor="end">100/s</text>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// Five lateness bars, this instance's buckets, the other's counts.
	if n := strings.Count(page, `fill="#7e57c2"`); n != 5 {
		t.Errorf("%d lateness bars, want 5", n)
	}
	const line = `stroke="#17702b" stroke-width="1.5" points="`
	i := strings.Index(page, line)
	if i < 0 {
		t.Fatal("no line of what all instances published")
	}
	pts := strings.Fields(page[i+len(line) : i+len(line)+strings.Index(page[i+len(line):], `"`)])
	if len(pts) < 50 || !strings.HasSuffix(pts[len(pts)-1], ",0.0") {
		t.Errorf("all instances' line: %d points, ending %v (want 100/s, the top)", len(pts), pts[max(len(pts)-1, 0):])
	}
}

func TestCumulative(t *testing.T) {
	own := []Bucket{{0.001, 7}, {0.01, 9}, {math.Inf(1), 9}}
	got := cumulative(instances.Late{{UpTo: 0.005, Count: 2}, {UpTo: 0.01, Count: 3}, {UpTo: math.Inf(1), Count: 1}}, own)
	want := []Bucket{{0.001, 0}, {0.005, 2}, {0.01, 5}, {math.Inf(1), 6}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cumulative = %v, want %v", got, want)
	}
	if got := cumulative(nil, nil); got != nil {
		t.Errorf("nothing known: %v", got)
	}
}

// TestPublishedChart: the slots of all instances and this instance's own
// samples go on one time axis, the last 5 minutes up to now.
func TestPublishedChart(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var cs []Count
	for n := range 31 { // this instance: 30 s at 20 tasks a second
		cs = append(cs, Count{At: now.Add(time.Duration(n-30) * time.Second), Published: float64(20 * n)})
	}
	s := instances.Sum{Instances: 2, EndMs: now.UnixMilli(), Slots: make([]int64, instances.Slots)}
	s.Slots[instances.Slots-1] = 200 // 40 a second in the last slot, 0 before
	p := publishedChart(s, now.UnixMilli(), cs, now)
	if p.Empty || p.Top != 50 || p.Span != 5*time.Minute {
		t.Fatalf("chart %+v", p)
	}
	q := strings.Fields(p.Queue)
	if len(q) != instances.Slots || q[len(q)-1] != "600.0,16.0" || q[len(q)-2] != "590.0,80.0" {
		t.Errorf("all instances: %d points, ending %v", len(q), q[len(q)-2:])
	}
	this := strings.Fields(p.This)
	if len(this) != 30 || this[0] != "542.0,48.0" || this[29] != "600.0,48.0" {
		t.Errorf("this instance: %d points, %q ... %q", len(this), this[0], this[len(this)-1])
	}
	// Alone on the queue, its own line would repeat the queue's.
	s.Instances = 1
	if p := publishedChart(s, now.UnixMilli(), cs, now); p.This != "" {
		t.Errorf("this instance's line drawn when it is the only one")
	}
	if p := publishedChart(instances.Sum{}, 0, cs[:2], now); !p.Empty {
		t.Errorf("no record and two samples: %+v", p)
	}
}
