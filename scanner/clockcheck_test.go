package scanner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A claim's reading of the Redis clock is filed under the primary the claim
// was sent to, not under the one the cluster names when its answer comes:
// after a failover in between, a reading of the old primary, whose clock
// may be ahead, would let tasks held for the new one out before its clock
// reaches their due time.
func TestClockReadingFiledUnderThePrimaryItWasSentTo(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis: %v", err)
	}
	s := New(nil, nil, Options{Queue: "q", Shards: 1, KeyPrefix: "p"})
	var mu sync.Mutex
	primary := "A"
	c := newClockCheck(s.clock, func(context.Context, int) (string, redis.Cmdable, error) {
		mu.Lock()
		defer mu.Unlock()
		return primary, rdb, nil // B's clock is the real Redis's
	}, s.lim, s.met)
	defer c.stop()

	heldUs := s.clock.localUs() // a task held before the claim was sent
	before := s.clock.now()
	sentTo := c.primaryOf(0) // the claim goes to A, whose clock is an hour ahead
	mu.Lock()
	primary = "B" // failed over before the answer came
	mu.Unlock()
	c.note(0, time.Now().Add(time.Hour).UnixMicro(), before, sentTo)
	if c.due(0, time.Now().Add(30*time.Minute).UnixMicro(), heldUs) {
		t.Fatal("a task due in 30 min by B's clock let out by A's reading, an hour ahead")
	}
	// A reading filed under the primary it was sent to still counts.
	c.note(0, time.Now().Add(time.Hour).UnixMicro(), s.clock.now(), c.primaryOf(0))
	if !c.due(0, time.Now().Add(30*time.Minute).UnixMicro(), heldUs) {
		t.Fatal("a reading of B sent to B, ahead of the due time, did not confirm it")
	}
}
