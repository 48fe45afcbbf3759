package liveness

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// TestClusterRecordsPrimaryPaused: on Redis Cluster, the instance's
// channel lives on another primary than the records. While the records'
// primary does not answer, the instance may go on publishing as long as
// its subscription answers its pings (no one can find it unsubscribed);
// once that subscription's connection is closed by Redis (and opened
// again, too late to prove anything) it fences itself, until a heartbeat
// gets through again.
func TestClusterRecordsPrimaryPaused(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{NodeTimeout: 30 * time.Second, ReplicasPer: -1})
	prefix := testenv.Name(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const timeout = 600 * time.Millisecond
	l := New(c.Client(), Options{Prefix: prefix, ID: "a", Timeout: timeout, Queues: []string{"q"}})
	l.Prepare(ctx)
	id := l.ID()
	records, channel := c.PrimaryOf(Key(prefix)), c.PrimaryOf(Channel(prefix, id))
	if records.Addr == channel.Addr {
		t.Fatalf("id %s: its channel is on the records' primary %s", id, records.Addr)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	ok := func() bool { ok, _ := l.Check(id); return ok }
	waitFor(t, "live", 3*time.Second, ok)

	c.Pause(records)
	resumed := false
	defer func() {
		if !resumed {
			c.Resume(records)
		}
	}()
	// Twice the timeout without a heartbeat: the subscription proves it.
	for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !ok() {
			t.Fatalf("fenced while its records' primary %s was paused and its subscription on %s answered", records.Addr, channel.Addr)
		}
	}
	// Redis closes the subscription's connection: a judge could now find
	// it unsubscribed and its record stale.
	admin := redis.NewClient(&redis.Options{Addr: channel.Addr, Password: c.AdminPassword()})
	defer admin.Close()
	killed := time.Now()
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE pubsub on %s: %v", channel.Addr, err)
	}
	waitFor(t, "fenced once its subscription was closed", timeout/2, func() bool { return !ok() })
	t.Logf("fenced %s after its subscription was closed", time.Since(killed).Round(time.Millisecond))
	for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if ok() {
			t.Fatalf("published again with no heartbeat after its subscription was closed (a new subscription proves nothing)")
		}
	}
	c.Resume(records)
	resumed = true
	waitFor(t, "live again after the resume", 3*time.Second, ok)
}

// TestClusterChannelSlotMoves: when the slot of the instance's channel
// moves to another primary, Redis unsubscribes it there (go-redis does not
// subscribe again); the instance opens its subscription again, on the
// slot's new primary, where a judge asks.
func TestClusterChannelSlotMoves(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{NodeTimeout: 30 * time.Second, ReplicasPer: -1})
	prefix := testenv.Name(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const timeout = 400 * time.Millisecond
	l := New(c.Client(), Options{Prefix: prefix, ID: "m", Timeout: timeout, Queues: []string{"q"}})
	l.Prepare(ctx)
	id := l.ID()
	ch := Channel(prefix, id)
	records, from := c.PrimaryOf(Key(prefix)), c.PrimaryOf(ch)
	var to *testenv.ClusterNode
	for _, n := range c.Primaries() {
		if n.Addr != records.Addr && n.Addr != from.Addr {
			to = n
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "live", 3*time.Second, func() bool { ok, _ := l.Check(id); return ok })

	moved := time.Now()
	if err := c.MigrateSlot(ctx, c.Slot(ch), to); err != nil {
		t.Fatalf("move the slot of %s to %s: %v", ch, to.Addr, err)
	}
	dst := redis.NewClient(&redis.Options{Addr: to.Addr, Password: c.AdminPassword()})
	defer dst.Close()
	waitFor(t, "subscribed again on the slot's new primary", 8*timeout+5*time.Second, func() bool {
		m, err := dst.PubSubShardNumSub(ctx, ch).Result()
		return err == nil && m[ch] == 1
	})
	t.Logf("subscribed on %s %s after the slot moved from %s", to.Addr, time.Since(moved).Round(time.Millisecond), from.Addr)
}
