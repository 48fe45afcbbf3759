package tests

import (
	"testing"
	"time"
)

// TestLookaheadHolderBoundWhenBusy: while claims come back full (a
// backlog of due tasks, then tasks due within the look-ahead), tasks claimed ahead of their due time stay within
// the holder's bound, PIPELINE × BATCH_SIZE, as they do when the queue is
// quiet. (Busy claims used to take everything within the look-ahead: 300
// tasks held half a second before their due time, where the bound is 10.)
func TestLookaheadHolderBoundWhenBusy(t *testing.T) {
	q := queueSpec{Name: "bound", Shards: 4}
	h := newHarness(t, q)
	h.lookahead(8*time.Second, 5*time.Second)
	h.extra["DISPATCHER_PIPELINE"] = "2"
	h.extra["DISPATCHER_BATCH_SIZE"] = "5"
	const bound = 2 * 5
	rec := h.record(q.Name)
	waitStarted(t, h.start())

	now := h.redisNow()
	p := h.producer(q.Name)
	want := scheduleSpread(t, p, "backlog", 1000, now.Add(-time.Second), 500*time.Millisecond)
	for id, due := range scheduleSpread(t, p, "ahead", 300, now.Add(5*time.Second), 100*time.Millisecond) {
		want[id] = due
	}
	maxHeld, samples := 0, 0
	verifyWhile(h, q.Name, want, 60*time.Second, 0, func() {
		for end := time.Now().Add(6 * time.Second); time.Now().Before(end); samples++ {
			s := h.laState(q)
			held := 0
			for e, lease := range s.inflight {
				if _, due := entryID(t, e); lease > 0 && due*1000 > s.nowUs {
					held++ // in flight before its due time: held, never published yet
				}
			}
			maxHeld = max(maxHeld, held)
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Logf("most tasks held ahead of their due time at once: %d (bound %d), over %d samples", maxHeld, bound, samples)
	if maxHeld > bound {
		t.Errorf("%d tasks held ahead of their due time at once, over the bound PIPELINE × BATCH_SIZE = %d", maxHeld, bound)
	}
	checkStamps(t, rec.all(), want, 0)
}
