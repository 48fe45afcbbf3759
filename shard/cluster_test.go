package shard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestProducerOnCluster: the producer API on a Redis Cluster client. One
// ScheduleMany spans shards on every primary (go-redis splits the pipeline
// by node), wake-ups ride along, and each task lands in the contract's key
// on the primary that owns its slot; reschedule, cancel and the shard-count
// record work too.
func TestProducerOnCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	rdb := c.Client()
	ctx := context.Background()
	const m = 16
	p, err := shard.NewProducer(rdb, "dq", "orders", m)
	if err != nil {
		t.Fatal(err)
	}
	sub := rdb.Subscribe(ctx, p.Keys().Wake())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}

	var tasks []shard.Task
	soon := time.Now().Add(100 * time.Millisecond)
	for i := 0; i < 1000; i++ {
		tasks = append(tasks, shard.Task{Member: []byte(fmt.Sprintf("t-%d", i)), Due: soon})
	}
	if err := p.ScheduleMany(ctx, tasks); err != nil {
		t.Fatalf("ScheduleMany: %v", err)
	}
	primaries := map[string]int64{}
	for _, task := range tasks {
		key := pendingKey("dq", "orders", task.Member, m)
		score, err := rdb.ZScore(ctx, key, string(task.Member)).Result()
		if err != nil || int64(score) != task.Due.UnixMilli() {
			t.Fatalf("%s in %s: score %v, %v", task.Member, key, score, err)
		}
		primaries[c.PrimaryOf(key).Addr]++
	}
	if len(primaries) != 3 {
		t.Errorf("tasks landed on %d primaries, want 3: %v", len(primaries), primaries)
	}
	t.Logf("tasks per primary: %v", primaries)
	// The wake-ups published through the cluster reach a subscriber.
	msg, err := sub.ReceiveTimeout(ctx, 5*time.Second)
	if m, ok := msg.(*redis.Message); err != nil || !ok || m.Channel != p.Keys().Wake() {
		t.Errorf("no wake-up received through the cluster: %v %v", msg, err)
	}

	later := time.Now().Add(time.Hour)
	if err := p.Reschedule(ctx, []byte("t-7"), later); err != nil {
		t.Errorf("Reschedule: %v", err)
	}
	if ok, err := p.Cancel(ctx, []byte("t-8")); !ok || err != nil {
		t.Errorf("Cancel: %v %v", ok, err)
	}
	if n := rdb.ZScore(ctx, pendingKey("dq", "orders", []byte("t-7"), m), "t-7").Val(); int64(n) != later.UnixMilli() {
		t.Errorf("t-7 not rescheduled: %v", n)
	}
	if err := shard.EnsureShardCount(ctx, rdb, p.Keys(), m); err != nil {
		t.Errorf("EnsureShardCount: %v", err)
	}
	if err := shard.EnsureShardCount(ctx, rdb, p.Keys(), 8); err == nil {
		t.Errorf("EnsureShardCount with another count: no error")
	}
}
