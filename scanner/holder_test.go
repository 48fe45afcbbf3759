package scanner

import (
	"testing"
	"time"
)

// A held task goes out once the Redis clock has surely reached its due
// time, not once the clock estimate's midpoint has: the estimate is off by
// up to half the round trip it was measured over. Found by the bench
// (`dispatcher bench`, 2 of 1,000 tasks received before their due time by
// Redis's clock on a cluster; a consumer lateness of -0.1 ms on one
// server), where the scripts' clock, cut to the ms, was taken as its
// middle: up to 0.6 ms early in this test.
func TestHeldTaskNotPublishedBeforeTheServerClockSurelyReachedIt(t *testing.T) {
	local := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	s := New(nil, nil, Options{Queue: "q", Shards: 1, KeyPrefix: "p", Lookahead: time.Second,
		Now: func() time.Time { return local }})
	// The server read its clock as serverUs somewhere in a 200 µs round
	// trip; at worst, right at its end.
	const serverUs = 1_795_000_000_000_000
	before, after := local, local.Add(200*time.Microsecond)
	s.clock.observe(0, serverUs, before, after)

	due := int64(serverUs/1000 + 1)
	done := false
	p := &progress{b: batch{shard: 0}, left: 1, done: func() { done = true }}
	if back := s.hold.add([]heldTask{{task: Task{Entry: "e", DueMs: due}, batch: p}}); back != nil {
		t.Fatal("the holder refused the task")
	}
	for local = after; local.Before(after.Add(3 * time.Millisecond)); local = local.Add(10 * time.Microsecond) {
		fired, _, _ := s.hold.take()
		if len(fired) == 0 {
			continue
		}
		earliest := serverUs + local.Sub(after).Microseconds() // the server clock now, at the least
		if earliest < due*1000 {
			t.Fatalf("published when the server clock may read %d µs, %d µs before the task's due time", earliest, due*1000-earliest)
		}
		if late := earliest - due*1000; late > 250 {
			t.Errorf("published %d µs after the server clock surely reached the due time, want within the round trip's half", late)
		}
		return
	}
	t.Fatalf("never published (done %v)", done)
}
