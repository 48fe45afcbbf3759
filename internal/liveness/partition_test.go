package liveness

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// cutConn fails every read and write once cut is set: a partition.
type cutConn struct {
	net.Conn
	cut *atomic.Bool
}

var errPartitioned = errors.New("partitioned")

func (c cutConn) Read(b []byte) (int, error) {
	if c.cut.Load() {
		return 0, errPartitioned
	}
	return c.Conn.Read(b)
}

func (c cutConn) Write(b []byte) (int, error) {
	if c.cut.Load() {
		return 0, errPartitioned
	}
	return c.Conn.Write(b)
}

// TestClusterPartitionWithChannelPrimary: ONE network partition puts the
// instance and the primary A serving its channel on one side, the records'
// primary, the judge and the rest of the cluster on the other. The majority
// hands A's slots to another primary (here: every node forgets A, and A
// them, and another primary takes A's slots, which is what a failover of A
// does as seen from the majority). A, cut off, still believes it serves
// the channel's slot and answers the instance's pings on its subscription;
// the judge finds the record stale and no subscriber on the slot's new
// primary, and declares the instance dead. The majority can fail A over
// only once A has not answered for the cluster's node timeout: by then
// the instance must have stopped publishing (its subscription proves
// nothing that long after its last heartbeat), and stay stopped.
func TestClusterPartitionWithChannelPrimary(t *testing.T) {
	const nodeTimeout = 3 * time.Second
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{NodeTimeout: nodeTimeout, ReplicasPer: -1,
		Args: []string{"cluster-require-full-coverage no"}})
	prefix := testenv.Name(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const timeout = 600 * time.Millisecond

	var addrs []string
	for _, s := range c.Servers() {
		addrs = append(addrs, s.Addr())
	}
	// The instance's own client: its connections to the records' primary
	// can be cut.
	var cut atomic.Bool
	var recordsAddr atomic.Value
	recordsAddr.Store("")
	inst := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Password: c.AdminPassword(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			cn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil || addr != recordsAddr.Load().(string) {
				return cn, err
			}
			return cutConn{Conn: cn, cut: &cut}, nil
		}})
	t.Cleanup(func() { inst.Close() }) // after the instance stops (runOnCluster's cleanup)

	recordsAddr.Store(c.PrimaryOf(Key(prefix)).Addr) // before the instance connects
	run := runOnCluster(t, c, inst, prefix, "a", timeout)
	id, records, channel, other, ok := run.id, run.records, run.channel, run.other, run.ok

	// The partition: the instance loses the records' primary ...
	cut.Store(true)
	cutAt := time.Now()
	// Up to the node timeout no failover of A can have completed; the
	// instance may go on while A answers it, and must stop before then.
	waitFor(t, "stopped within the node timeout of the partition", nodeTimeout, func() bool { return !ok() })
	t.Logf("stopped %s after the partition (node timeout %s)", time.Since(cutAt).Round(time.Millisecond), nodeTimeout)
	time.Sleep(time.Until(cutAt.Add(nodeTimeout)))
	if ok() {
		t.Fatalf("publishing a node timeout after the partition: a failover of its channel's primary could be complete")
	}
	// ... and the channel's primary A loses the rest of the cluster.
	adminOf := func(addr string) *redis.Client {
		cl := redis.NewClient(&redis.Options{Addr: addr, Password: c.AdminPassword()})
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	a := adminOf(channel.Addr)
	for _, n := range c.Nodes() {
		if n.ID != channel.ID {
			if err := a.Do(ctx, "CLUSTER", "FORGET", n.ID).Err(); err != nil {
				t.Fatalf("FORGET on A: %v", err)
			}
		}
	}
	var majority []string
	for _, n := range c.Nodes() {
		if n.ID == channel.ID {
			continue
		}
		majority = append(majority, n.Addr)
		if err := adminOf(n.Addr).Do(ctx, "CLUSTER", "FORGET", channel.ID).Err(); err != nil {
			t.Fatalf("FORGET A on %s: %v", n.Addr, err)
		}
	}
	// The majority gives A's slots to another primary (a failover of A).
	o := adminOf(other.Addr)
	for _, r := range channel.Slots {
		if err := o.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", r[0], r[1]).Err(); err != nil {
			t.Fatalf("ADDSLOTSRANGE on %s: %v", other.Addr, err)
		}
	}
	_ = o.Do(ctx, "CLUSTER", "BUMPEPOCH").Err()

	// The judge, on the majority's side.
	judgeCC := redis.NewClusterClient(&redis.ClusterOptions{Addrs: majority, Password: c.AdminPassword()})
	defer judgeCC.Close()
	waitFor(t, "the majority agrees that another primary serves the channel", 10*time.Second, func() bool {
		judgeCC.ReloadState(ctx)
		n, err := judgeCC.MasterForKey(ctx, Channel(prefix, id))
		return err == nil && n.Options().Addr == other.Addr
	})
	jctx, jcancel := context.WithCancel(ctx)
	judge := New(judgeCC, Options{Prefix: prefix, ID: "judge", Timeout: timeout, Queues: []string{"q"}})
	jdone := make(chan struct{})
	go func() { defer close(jdone); _ = judge.Run(jctx) }()
	defer func() { jcancel(); <-jdone }()

	rec := adminOf(records.Addr)
	waitFor(t, "declared dead by the judge", 10*time.Second, func() bool {
		v, _ := rec.HGet(ctx, Key(prefix), id).Result()
		return strings.HasPrefix(v, "dead ")
	})
	declared := time.Now()
	// Declared dead: its claims are another's now. It must not publish.
	for end := time.Now().Add(2 * timeout); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if ok() {
			t.Fatalf("Check(%s) ok %s after the judge declared it dead (pongs from %s, which no longer serves its channel's slot)",
				id, time.Since(declared).Round(time.Millisecond), channel.Addr)
		}
	}
}
