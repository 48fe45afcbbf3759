package instances

import (
	"math"
	"reflect"
	"testing"
)

func TestLateJSONRoundTrip(t *testing.T) {
	r := Record{ID: "h:1:ab", Host: "h", PID: 1, Version: "v1", SpanMs: 60_000, Published: 12,
		Late: Late{{0.001, 3}, {0.01, 0}, {1, 8}, {math.Inf(1), 1}}, EndMs: 10_000, Slots: []int64{4, 8}}
	v, err := encode(r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decode("h:1:ab", "1800000000000 "+v)
	if err != nil {
		t.Fatal(err)
	}
	want := r
	want.SeenMs = 1_800_000_000_000
	want.Late = Late{{0.001, 3}, {1, 8}, {math.Inf(1), 1}} // the empty bucket is left out
	if !reflect.DeepEqual(got, want) {
		t.Errorf("decode(encode(r)) = %+v\nwant %+v (JSON %s)", got, want, v)
	}
	for _, bad := range []string{"", "x {}", "12", "12 {", `12 {"late":{"soon":1}}`} {
		if _, err := decode("h:1:ab", bad); err == nil {
			t.Errorf("decode(%q) took it", bad)
		}
	}
}

func TestQuantile(t *testing.T) {
	l := Late{{0.001, 50}, {0.005, 40}, {0.01, 9}, {math.Inf(1), 1}}
	for q, want := range map[float64]float64{0.5: 0.001, 0.9: 0.005, 0.99: 0.01, 1: math.Inf(1)} {
		if got, ok := l.Quantile(q); !ok || got != want {
			t.Errorf("Quantile(%v) = %v, %v; want %v", q, got, ok, want)
		}
	}
	if _, ok := (Late{}).Quantile(0.5); ok {
		t.Error("an empty histogram has a median")
	}
}

// TestAdd: the queue as a whole adds the instances' figures, merges their
// histograms, lines their slots up by time, and takes the sweeper from the
// latest record that says so.
func TestAdd(t *testing.T) {
	a := Record{ID: "a", SeenMs: 100, Sweeps: true, Paused: 3, SpanMs: 60_000, Published: 600, Errors: 2,
		Late: Late{{0.001, 500}, {0.01, 100}}, EndMs: 50_000, Slots: []int64{1, 2, 3}}
	b := Record{ID: "b", SeenMs: 200, SpanMs: 30_000, Published: 300,
		Late: Late{{0.01, 200}, {math.Inf(1), 100}}, EndMs: 45_000, Slots: []int64{10, 20}}
	s := Add([]Record{a, b})
	if s.Instances != 2 || s.Sweeper != "a" || s.Paused != 3 || s.Published != 900 || s.Errors != 2 || s.Rate != 20 || s.SpanMs != 60_000 {
		t.Errorf("sum %+v", s)
	}
	if want := (Late{{0.001, 500}, {0.01, 300}, {math.Inf(1), 100}}); !reflect.DeepEqual(s.Late, want) {
		t.Errorf("merged lateness %v, want %v", s.Late, want)
	}
	// a's slots end at 40, 45, 50 s; b's at 40, 45 s.
	if s.EndMs != 50_000 || len(s.Slots) != Slots || !reflect.DeepEqual(s.Slots[Slots-3:], []int64{11, 22, 3}) {
		t.Errorf("slots end %d: %v", s.EndMs, s.Slots[Slots-4:])
	}
	// The role moved from a to b: b's record, the later, says so too.
	b.Sweeps, b.Paused = true, 0
	if s := Add([]Record{a, b}); s.Sweeper != "b" || s.Paused != 0 {
		t.Errorf("sweeper %q paused %d, want b's later record", s.Sweeper, s.Paused)
	}
	if s := Add(nil); s.Instances != 0 || s.Slots != nil || s.Rate != 0 {
		t.Errorf("no records: %+v", s)
	}
}

func TestQuantileText(t *testing.T) {
	l := Late{{0.002, 98}, {1, 1}, {math.Inf(1), 1}}
	for q, want := range map[float64]string{0.5: "≤2ms", 0.99: "≤1s", 1: ">1s"} {
		if got := l.QuantileText(q); got != want {
			t.Errorf("QuantileText(%v) = %q, want %q", q, got, want)
		}
	}
	if got := (Late{{math.Inf(1), 3}}).QuantileText(0.5); got != ">0ms" {
		t.Errorf("only past every bound: %q", got)
	}
	if got := (Late{}).QuantileText(0.5); got != "" {
		t.Errorf("empty: %q", got)
	}
}
