package liveness

import (
	"context"
	"strconv"
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

// TestClusterNodeDownKeepsOthersLive: on Redis Cluster, a node that stops
// answering, which serves neither P:live nor anything of the watcher's
// own, must not lapse the liveness of a healthy instance. The watcher asks
// that node (PUBSUB NUMSUB) about a silent instance whose channel it
// serves, inside its heartbeat loop and without a deadline.
func TestClusterNodeDownKeepsOthersLive(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	rdb := c.Client()
	prefix := testenv.Name(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	liveNode := c.PrimaryOf(Key(prefix))
	// A silent instance whose channel is served by another primary.
	var silent string
	var node *testenv.ClusterNode
	for n := 0; node == nil; n++ {
		id := "gone" + strconv.Itoa(n) + "#0"
		if p := c.PrimaryOf(Channel(prefix, id)); p.ID != liveNode.ID {
			silent, node = id, p
		}
	}
	// Recent at first: the watcher does not judge it yet.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, Key(prefix), silent, strconv.FormatInt(now.UnixMilli(), 10)+"|q")

	l := New(rdb, Options{Prefix: prefix, ID: "watcher", Timeout: 400 * time.Millisecond, Queues: []string{"q"}})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the watcher live", 3*time.Second, func() bool { ok, _ := l.Check(l.ID()); return ok })

	c.Pause(node) // the node serving the silent instance's channel hangs
	defer c.Resume(node)
	t.Logf("paused %s (serves %s); P:live is on %s", node, Channel(prefix, silent), liveNode)
	lapsed := 0
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if ok, _ := l.Check(l.ID()); !ok {
			lapsed++
		}
	}
	if lapsed > 0 {
		t.Fatalf("the watcher's own liveness lapsed (%d of ~200 looks) while a node it does not depend on hung: "+
			"its heartbeat loop waits on PUBSUB NUMSUB there, so it publishes nothing", lapsed)
	}
}
