package liveness

import (
	"context"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestClusterStoppedSurvivesChannelSlotMove: on Redis Cluster a stopped
// instance (stale record, subscription still open) must stay undeclared
// after the slot of its channel moves to another primary: its subscription
// stays on the node it was opened on (plain SUBSCRIBE is not slot-bound),
// while PUBSUB NUMSUB is asked of the slot's new owner.
func TestClusterStoppedSurvivesChannelSlotMove(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	rdb := c.Client()
	prefix := testenv.Name(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The stopped instance: its own client, subscribed, and silent.
	stopped := c.Client()
	ch := Channel(prefix, "stopped#0")
	ps := stopped.Subscribe(ctx, ch)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, Key(prefix), "stopped#0", now.Add(-5*time.Second).UnixMilli())

	var d deaths
	l := New(rdb, Options{Prefix: prefix, ID: "watcher", Timeout: 400 * time.Millisecond, OnDead: d.add})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	defer func() { cancel(); <-done }()

	time.Sleep(1500 * time.Millisecond)
	if d.has("stopped#0") {
		t.Fatal("declared dead before the slot moved")
	}
	slot := c.Slot(ch)
	from := c.PrimaryOfSlot(slot)
	var to *testenv.ClusterNode
	for _, n := range c.Primaries() {
		if n.ID != from.ID {
			to = n
			break
		}
	}
	if err := c.MigrateSlot(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	t.Logf("moved slot %d of %s from %s to %s", slot, ch, from, to)
	time.Sleep(2 * time.Second)
	if d.has("stopped#0") {
		t.Fatal("a stopped but still subscribed instance was declared dead once its channel's slot moved: " +
			"its subscription stayed on the former owner, NUMSUB asked the new one")
	}
}
