package tests

import (
	"context"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

// TestEarlyAckWithoutAnotherPublish: a claim takes two tasks of one shard
// ahead of their due times, 3 s apart. Once the first is delivered, its
// entry leaves the in-flight set about 20 ms after its confirm, not when
// the second one's publish comes round 3 s later: a crash meanwhile would
// otherwise send it again. Checked on the Redis state while the second
// task is still held (so the bound below, 1.5 s, cannot be met by the
// batch completing).
func TestEarlyAckWithoutAnotherPublish(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "early", Shards: 1})
	h.lookahead(8*time.Second, 20*time.Second)
	rec := h.record("early")
	waitStarted(t, h.start())

	p := h.producer("early")
	first := h.redisNow().Add(3 * time.Second)
	second := first.Add(3 * time.Second)
	a, b := []byte("early-a"), []byte("early-b")
	if err := p.ScheduleMany(context.Background(), []shard.Task{{Member: a, Due: first}, {Member: b, Due: second}}); err != nil {
		t.Fatal(err)
	}
	aID := shard.MessageID(a, first.UnixMilli())
	var got time.Time
	eventually(t, 10*time.Second, "the first task delivered", func() bool {
		for _, r := range rec.all() {
			if r.d.MessageId == aID {
				got = r.at
				return true
			}
		}
		return false
	})
	aEntry := scanner.EntryOf(a, first.UnixMilli())
	bEntry := scanner.EntryOf(b, second.UnixMilli())
	for {
		s := h.laState(h.queues[0])
		_, aIn := s.inflight[aEntry]
		_, bIn := s.inflight[bEntry]
		if !bIn {
			t.Fatalf("the second task left the in-flight set before the first was acked: the test proves nothing (state %v)", s.inflight)
		}
		if !aIn {
			t.Logf("the first task left the in-flight set %v after its receipt", time.Since(got).Round(time.Millisecond))
			break
		}
		if time.Since(got) > 1500*time.Millisecond {
			t.Fatalf("the first task is still in flight %v after it was delivered, its batch's other task still held: its early ack waits for that task's publish", time.Since(got).Round(time.Millisecond))
		}
		time.Sleep(10 * time.Millisecond)
	}
	verifyWhile(h, "early", map[string]int64{aID: first.UnixMilli(), shard.MessageID(b, second.UnixMilli()): second.UnixMilli()}, 15*time.Second, 0, func() {})
	h.emptyAtEnd(h.queues[0])
}
