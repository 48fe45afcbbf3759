package liveness

import (
	"strconv"
	"testing"
	"time"
)

// TestSeenForgetsPrunedIDs: the ids of dead instances already handed out
// are forgotten once their records are pruned, so that the memory does not
// grow over a long run with restarts.
func TestSeenForgetsPrunedIDs(t *testing.T) {
	rdb, prefix, ctx, cancel := fresh(t)
	defer cancel()
	var d deaths
	l := New(rdb, Options{Prefix: prefix, ID: "w", Timeout: 400 * time.Millisecond, OnDead: d.add})
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, Key(prefix), "gone#0", "dead "+strconv.FormatInt(now.UnixMilli(), 10))
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	waitFor(t, "the dead id handed out", 2*time.Second, func() bool { return d.has("gone#0") })
	seen := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.seen)
	}
	if seen() != 1 {
		t.Fatalf("%d dead ids remembered, want 1", seen())
	}
	rdb.HDel(ctx, Key(prefix), "gone#0") // as the heartbeat prunes it after the keep time
	waitFor(t, "the pruned id forgotten", 2*time.Second, func() bool { return seen() == 0 })
	cancel()
	<-done
}
