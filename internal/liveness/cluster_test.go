package liveness

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// onCluster is one instance's liveness running on cluster c until the
// test ends: its id, the primaries of its records and of its channel (Prepare
// put them apart), the third primary, and whether it may publish now.
type onCluster struct {
	l                       *Liveness
	id                      string
	records, channel, other *testenv.ClusterNode
	ok                      func() bool
}

// runOnCluster prepares and runs a Liveness through rdb and waits until
// it may publish.
func runOnCluster(t *testing.T, c *testenv.RedisCluster, rdb redis.UniversalClient, prefix, id string, timeout time.Duration) onCluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := New(rdb, Options{Prefix: prefix, ID: id, Timeout: timeout, Queues: []string{"q"}})
	l.Prepare(ctx)
	o := onCluster{l: l, id: l.ID(), records: c.PrimaryOf(Key(prefix))}
	o.channel = c.PrimaryOf(Channel(prefix, o.id))
	if o.records.Addr == o.channel.Addr {
		cancel()
		t.Fatalf("id %s: its channel is on the records' primary %s", o.id, o.records.Addr)
	}
	for _, n := range c.Primaries() {
		if n.Addr != o.records.Addr && n.Addr != o.channel.Addr {
			o.other = n
		}
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	o.ok = func() bool { ok, _ := l.Check(o.id); return ok }
	waitFor(t, "live", 5*time.Second, o.ok)
	return o
}

// TestClusterRecordsPrimaryPaused: on Redis Cluster, the instance's
// channel lives on another primary than the records. While the records'
// primary does not answer, the instance may go on publishing as long as
// its subscription answers its pings (no one can find it unsubscribed);
// once that subscription's connection is closed by Redis (and opened
// again, too late to prove anything) it fences itself, until a heartbeat
// gets through again.
func TestClusterRecordsPrimaryPaused(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{NodeTimeout: 30 * time.Second, ReplicasPer: -1})
	ctx := context.Background()
	const timeout = 600 * time.Millisecond
	o := runOnCluster(t, c, c.Client(), testenv.Name(t), "a", timeout)
	records, channel, ok := o.records, o.channel, o.ok

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
	ctx := context.Background()
	const timeout = 400 * time.Millisecond
	o := runOnCluster(t, c, c.Client(), prefix, "m", timeout)
	ch := Channel(prefix, o.id)
	from, to := o.channel, o.other

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
