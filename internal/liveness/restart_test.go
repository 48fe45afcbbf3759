package liveness

import (
	"strconv"
	"testing"
	"time"
)

// TestJudgeWaitsForItsOwnHeartbeats: after an outage of Redis (a restart,
// a failover) every record is stale and the instances are still
// reconnecting; the first one back must not declare the others dead
// before they had a timeout to heartbeat again. So an instance judges
// others only once its own heartbeats have gone through for a whole
// timeout; a killed one is then declared dead all the same.
func TestJudgeWaitsForItsOwnHeartbeats(t *testing.T) {
	rdb, prefix, ctx, cancel := fresh(t)
	defer cancel()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Silent for 5 s (the outage), not subscribed yet.
	rdb.HSet(ctx, Key(prefix), "other#0", strconv.FormatInt(now.Add(-5*time.Second).UnixMilli(), 10)+"|q")
	var d deaths
	const timeout = time.Second
	l := New(rdb, Options{Prefix: prefix, ID: "first-back", Timeout: timeout, OnDead: d.add})
	done := make(chan struct{})
	start := time.Now()
	go func() { defer close(done); _ = l.Run(ctx) }()
	waitFor(t, "the silent instance declared dead", 5*time.Second, func() bool { return d.has("other#0") })
	if after := time.Since(start); after < timeout {
		t.Errorf("the first instance back declared another dead %s after its first heartbeat, before that one had a timeout (%s) to come back", after, timeout)
	}
	cancel()
	<-done
}
