package instances

import (
	"math"
	"reflect"
	"sync"
	"testing"
	"time"
)

// fakeCounters are an instance's counters a test moves by hand.
type fakeCounters struct {
	mu  sync.Mutex
	now time.Time
	tot map[string]Totals
}

func (f *fakeCounters) clock() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.now }

func (f *fakeCounters) totals() map[string]Totals {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]Totals{}
	for q, t := range f.tot {
		out[q] = Totals{Published: t.Published, Errors: t.Errors, Late: append([]Bucket(nil), t.Late...)}
	}
	return out
}

// publish advances the clock by d and counts n tasks published at most
// 5 ms late.
func (f *fakeCounters) publish(q string, d time.Duration, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	t := f.tot[q]
	t.Published += float64(n)
	if t.Late == nil {
		t.Late = []Bucket{{0.001, 0}, {0.005, 0}, {math.Inf(1), 0}}
	}
	t.Late[1].Count += uint64(n)
	t.Late[2].Count += uint64(n)
	f.tot[q] = t
}

// sampleNow is what Run does at a grid point, without the write.
func (r *Recorder) sampleNow() {
	now, tot := r.opt.Now(), r.opt.Totals()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, q := range r.opt.Queues {
		ss := append(r.samples[q], sample{at: now, t: tot[q]})
		if len(ss) > keep {
			ss = append(ss[:0], ss[len(ss)-keep:]...)
		}
		r.samples[q] = ss
	}
}

// TestRecordFigures: a record says what the instance published over the
// last minute (since it started, while younger), its lateness over the
// same span, and what it published per 5 s slot on the grid; its own page
// sees its figures up to the moment, its slots up to the last write.
func TestRecordFigures(t *testing.T) {
	start := time.UnixMilli(1_800_000_000_000) // on the grid
	f := &fakeCounters{now: start, tot: map[string]Totals{}}
	r := New(nil, Options{ID: "h:1:ab", Host: "h", PID: 1, Version: "v1", Queues: []string{"q"},
		Totals: f.totals, Sweeps: func(string) bool { return true }, Paused: func(string) (int, bool) { return 2, true }, Now: f.clock})

	// 10 tasks in each of the first three slots.
	for range 3 {
		f.publish("q", Every, 10)
		r.sampleNow()
	}
	rec := r.Current()["q"]
	if rec.SpanMs != 15_000 || rec.Published != 30 || rec.Rate() != 2 || !rec.Sweeps || rec.Paused != 2 {
		t.Errorf("after 15 s: %+v", rec)
	}
	if want := (Late{{0.005, 30}}); !reflect.DeepEqual(rec.Late, want) {
		t.Errorf("lateness %v, want %v", rec.Late, want)
	}
	if !reflect.DeepEqual(rec.Slots, []int64{10, 10, 10}) || rec.EndMs != start.Add(3*Every).UnixMilli() {
		t.Errorf("slots %v ending %d", rec.Slots, rec.EndMs)
	}
	// 7 more 2 s into the fourth slot: the figures count them, the
	// slots not yet.
	f.publish("q", 2*time.Second, 7)
	rec = r.Current()["q"]
	if !reflect.DeepEqual(rec.Slots, []int64{10, 10, 10}) || rec.EndMs != start.Add(3*Every).UnixMilli() || rec.Published != 37 || rec.SpanMs != 17_000 {
		t.Errorf("between writes: slots %v ending %d, published %d over %d ms", rec.Slots, rec.EndMs, rec.Published, rec.SpanMs)
	}

	// Two minutes later at 1 task a second: the figures cover the last
	// minute only, the slots the last 5 minutes.
	f.publish("q", 3*time.Second, 3)
	r.sampleNow()
	for range 24 {
		f.publish("q", Every, 5)
		r.sampleNow()
	}
	rec = r.Current()["q"]
	if rec.SpanMs != 60_000 || rec.Published != 60 || rec.Rate() != 1 {
		t.Errorf("a minute's figures: span %d, published %d", rec.SpanMs, rec.Published)
	}
	if want := (Late{{0.005, 60}}); !reflect.DeepEqual(rec.Late, want) {
		t.Errorf("a minute's lateness %v, want %v", rec.Late, want)
	}
	if len(rec.Slots) != 28 || rec.Slots[0] != 10 || rec.Slots[3] != 10 || rec.Slots[27] != 5 {
		t.Errorf("slots %v", rec.Slots)
	}
	for range 40 {
		f.publish("q", Every, 5)
		r.sampleNow()
	}
	if rec = r.Current()["q"]; len(rec.Slots) != Slots {
		t.Errorf("%d slots kept, want %d", len(rec.Slots), Slots)
	}
}

func TestLateDelta(t *testing.T) {
	from := []Bucket{{0.001, 5}, {0.01, 9}, {math.Inf(1), 10}}
	to := []Bucket{{0.001, 5}, {0.01, 15}, {math.Inf(1), 20}}
	if got, want := lateDelta(from, to), (Late{{0.01, 6}, {math.Inf(1), 4}}); !reflect.DeepEqual(got, want) {
		t.Errorf("lateDelta = %v, want %v", got, want)
	}
	if got, want := lateDelta(nil, to), (Late{{0.001, 5}, {0.01, 10}, {math.Inf(1), 5}}); !reflect.DeepEqual(got, want) {
		t.Errorf("lateDelta from nothing = %v, want %v", got, want)
	}
}
