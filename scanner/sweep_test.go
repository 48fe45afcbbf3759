package scanner

import (
	"testing"
	"time"
)

// A quiet queue's sweeps stretch out, doubling per sweep without news up to
// IdlePollInterval; news brings them back to PollInterval at once.
func TestSweepIntervalStretchesAndSnapsBack(t *testing.T) {
	s := &Scanner{opt: Options{PollInterval: 50 * time.Millisecond, IdlePollInterval: 500 * time.Millisecond}}
	s.hot()
	var got []time.Duration
	for i := 0; i < 6; i++ {
		got = append(got, s.sweepEvery)
		s.cool()
	}
	want := []time.Duration{50, 100, 200, 400, 500, 500}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("sweep intervals %v, want %v ms", got, want)
		}
	}
	s.hot()
	if s.sweepEvery != 50*time.Millisecond {
		t.Errorf("after news: %v, want the poll interval", s.sweepEvery)
	}
	// An idle interval under the poll interval (or 0) means no stretching.
	s = &Scanner{opt: Options{PollInterval: time.Second, IdlePollInterval: 500 * time.Millisecond}}
	s.hot()
	s.cool()
	if s.sweepEvery != time.Second {
		t.Errorf("idle interval below the poll interval: %v, want 1s", s.sweepEvery)
	}
}

// Sweeps fall due on a grid shared by every queue (and process), so that
// those of many queues share a round trip.
func TestGridNext(t *testing.T) {
	every := 500 * time.Millisecond
	base := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct{ at, want time.Duration }{
		{0, 500 * time.Millisecond},
		{1, 500 * time.Millisecond},
		{499 * time.Millisecond, 500 * time.Millisecond},
		{500 * time.Millisecond, time.Second},
		{730 * time.Millisecond, time.Second},
	} {
		if got := gridNext(base.Add(c.at), every); !got.Equal(base.Add(c.want)) {
			t.Errorf("gridNext(+%v) = +%v, want +%v", c.at, got.Sub(base), c.want)
		}
	}
	if got := gridNext(time.Time{}, every); !got.Before(base) {
		t.Errorf("never swept: next sweep %v, want long past", got)
	}
}
