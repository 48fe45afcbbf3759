package bench

import (
	"strings"
	"testing"
	"time"
)

func TestFloorCadence(t *testing.T) {
	// 276.3 calls/s of 2,280 tasks/s for 3 s: 829 calls of 6,840.
	calls, msgs := floorCounts(cadence{callsPerSec: 276.3333, msgsPerSec: 2280}, 3*time.Second)
	if calls != 829 || msgs != 6840 {
		t.Fatalf("%d calls, %d messages", calls, msgs)
	}
	sum, lo, hi := 0, msgs, 0
	for j := range calls {
		n := callSize(j, calls, msgs)
		sum += n
		lo, hi = min(lo, n), max(hi, n)
	}
	// Spread evenly: every call 8 or 9 of them, 6,840 in all.
	if sum != msgs || lo != 8 || hi != 9 {
		t.Errorf("calls carry %d messages in all, %d to %d each", sum, lo, hi)
	}
	// More calls than messages (never from a dispatcher): one each.
	if calls, msgs := floorCounts(cadence{callsPerSec: 10, msgsPerSec: 5}, time.Second); calls != 5 || msgs != 5 {
		t.Errorf("%d calls, %d messages", calls, msgs)
	}
}

func TestParseFloorDone(t *testing.T) {
	var f Floor
	if err := parseFloorDone("done calls=829 messages=6840 confirmed=6840 nacked=0 returned=1 seconds=2.996977", &f); err != nil {
		t.Fatal(err)
	}
	if f.Calls != 829 || f.Messages != 6840 || f.Confirmed != 6840 || f.Returned != 1 || f.Seconds != 2.996977 {
		t.Errorf("%+v", f)
	}
	for _, bad := range []string{"", "ready", "done calls=1", "done calls=x messages=1 confirmed=1 nacked=0 returned=0 seconds=1",
		"done calls=1 messages=1 confirmed=1 nacked=0 returned=0 seconds=1 extra=2"} {
		if err := parseFloorDone(bad, &Floor{}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	f = Floor{CPUPer10k: 0.5}
	f.compare(0.9)
	if f.Ratio != 1.8 || !strings.HasPrefix(floorText(&f), "floor 0.50 CPU s/10k, dispatcher 0.90 → 1.8×") {
		t.Errorf("%+v: %q", f, floorText(&f))
	}
}
