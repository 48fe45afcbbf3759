package shardcluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// membersOfShard returns n members that all hash to shard i of m.
func membersOfShard(prefix string, i, m, n int) [][]byte {
	var out [][]byte
	for j := 0; len(out) < n; j++ {
		member := []byte(fmt.Sprintf("%s-%d", prefix, j))
		if shard.Index(member, m) == i {
			out = append(out, member)
		}
	}
	return out
}

// wakeCheck is what a dispatcher does on a wake-up, done by the test: it
// reads the woken shard at once. It returns the members of want (the
// members scheduled on that shard) that are not in it yet.
func wakeCheck(ctx context.Context, t *testing.T, rdb redis.UniversalClient, keys shard.Keys, msg *redis.Message, want map[int][][]byte) (int, []string) {
	t.Helper()
	i, _, ok := shard.ParseWakeDue(msg.Payload)
	if !ok {
		t.Fatalf("wake-up %q is not a WakeDue message", msg.Payload)
	}
	var missing []string
	for _, member := range want[i] {
		err := rdb.ZScore(ctx, keys.Pending(i), string(member)).Err()
		if errors.Is(err, redis.Nil) {
			missing = append(missing, string(member))
		} else if err != nil {
			t.Fatalf("ZSCORE %s %s: %v", keys.Pending(i), member, err)
		}
	}
	return i, missing
}

// TestWakeAfterZAddOnCluster: on Redis Cluster the producer's wake-up
// reaches the dispatchers only after the ZADD it announces has run. A
// ClusterClient pipeline sends each node's commands concurrently, and the
// PUBLISH (no key) goes to any primary, so in one pipeline a wake-up could
// be broadcast while the ZADD had not yet run on the shard's primary: the
// dispatcher's claim would find nothing and the task would wait for the
// next poll (issue 20). The test makes the race certain: it holds writes
// on the shard's primary (CLIENT PAUSE WRITE; reads still run), so a
// PUBLISH sent to another primary is heard while the ZADD waits; on the
// wake-up it reads the shard at once, as a dispatcher would.
func TestWakeAfterZAddOnCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	rdb := c.Client()
	ctx := context.Background()
	const m = 16
	const hold = 300 // ms that writes wait on the paused primary

	// pauseWrites holds writes (and PUBLISH) on the primary of key.
	pauseWrites := func(key string) *redis.Client {
		t.Helper()
		admin := c.PrimaryOf(key).Server.Client()
		if err := admin.Do(ctx, "CLIENT", "PAUSE", hold, "WRITE").Err(); err != nil {
			t.Fatalf("CLIENT PAUSE on the primary of %s: %v", key, err)
		}
		return admin
	}
	subscribe := func(p *shard.Producer) *redis.PubSub {
		t.Helper()
		sub := rdb.Subscribe(ctx, p.Keys().Wake())
		t.Cleanup(func() { sub.Close() })
		if _, err := sub.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		return sub
	}

	t.Run("Schedule", func(t *testing.T) {
		p, err := shard.NewProducer(rdb, "dq", "orders", m)
		if err != nil {
			t.Fatal(err)
		}
		sub := subscribe(p)
		// Members of one shard: the PUBLISH goes round robin over the 3
		// primaries, so 2 rounds in 3 send it to another one than the ZADD.
		const i = 4
		members := membersOfShard("late", i, m, 6)
		early := 0
		for round, member := range members {
			due := time.Now().Add(100 * time.Millisecond)
			admin := pauseWrites(p.Keys().Pending(i))
			done := make(chan error, 1)
			go func() { done <- p.Schedule(ctx, member, due) }()
			msg, err := sub.ReceiveMessage(ctx)
			if err != nil {
				t.Fatalf("round %d: no wake-up: %v", round, err)
			}
			if want := shard.WakeDue(i, shard.DueMs(due)); msg.Payload != want {
				t.Fatalf("round %d: wake-up %q, want %q", round, msg.Payload, want)
			}
			_, missing := wakeCheck(ctx, t, rdb, p.Keys(), msg, map[int][][]byte{i: {member}})
			if err := <-done; err != nil {
				t.Fatalf("round %d: Schedule: %v", round, err)
			}
			admin.Do(ctx, "CLIENT", "UNPAUSE")
			if len(missing) > 0 {
				early++
				t.Errorf("round %d: wake-up %s heard before the ZADD of %s had run on %s", round, msg.Payload, member, p.Keys().Pending(i))
			}
		}
		t.Logf("%d of %d wake-ups came before their task", early, len(members))
	})

	t.Run("ScheduleMany", func(t *testing.T) {
		p, err := shard.NewProducer(rdb, "dq", "mail", m)
		if err != nil {
			t.Fatal(err)
		}
		sub := subscribe(p)
		early := 0
		for round := 0; round < 3; round++ {
			// Tasks on every shard; writes held on the primary of shard 4.
			due := time.Now().Add(100 * time.Millisecond)
			var tasks []shard.Task
			want := map[int][][]byte{}
			for j := 0; len(want) < m || len(tasks) < 4*m; j++ {
				member := []byte(fmt.Sprintf("many-%d-%d", round, j))
				i := shard.Index(member, m)
				want[i] = append(want[i], member)
				tasks = append(tasks, shard.Task{Member: member, Due: due})
			}
			admin := pauseWrites(p.Keys().Pending(4))
			done := make(chan error, 1)
			go func() { done <- p.ScheduleMany(ctx, tasks) }()
			for n := 0; n < m; n++ {
				msg, err := sub.ReceiveMessage(ctx)
				if err != nil {
					t.Fatalf("round %d: wake-up %d of %d: %v", round, n+1, m, err)
				}
				if i, missing := wakeCheck(ctx, t, rdb, p.Keys(), msg, want); len(missing) > 0 {
					early++
					t.Errorf("round %d: wake-up %s heard before %d of the %d tasks of %s were in it",
						round, msg.Payload, len(missing), len(want[i]), p.Keys().Pending(i))
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("round %d: ScheduleMany: %v", round, err)
			}
			admin.Do(ctx, "CLIENT", "UNPAUSE")
		}
		t.Logf("%d of %d wake-ups came before their tasks", early, 3*m)
	})

	// A ZADD that fails wakes no one; the error names the shard's key.
	t.Run("ZADD fails", func(t *testing.T) {
		p, err := shard.NewProducer(rdb, "dq", "jobs", m)
		if err != nil {
			t.Fatal(err)
		}
		sub := subscribe(p)
		bad := p.Keys().Pending(4)
		if err := rdb.Set(ctx, bad, "not a sorted set", 0).Err(); err != nil {
			t.Fatal(err)
		}
		due := time.Now().Add(100 * time.Millisecond)
		err = p.Schedule(ctx, []byte("order:42"), due) // shard 4
		if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("Schedule on a string key = %v, want WRONGTYPE naming %s", err, bad)
		}
		tasks := []shard.Task{{Member: []byte("order:42"), Due: due}, {Member: []byte("a"), Due: due}} // shards 4, 11
		err = p.ScheduleMany(ctx, tasks)
		if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Errorf("ScheduleMany with a string key = %v, want WRONGTYPE naming %s", err, bad)
		}
		if err := rdb.ZScore(ctx, p.Keys().Pending(11), "a").Err(); err != nil {
			t.Errorf("the other shard's task is not scheduled: %v", err)
		}
		var got []string
		for {
			msg, err := sub.ReceiveTimeout(ctx, 300*time.Millisecond)
			if err != nil {
				break
			}
			if msg, ok := msg.(*redis.Message); ok {
				got = append(got, msg.Payload)
			}
		}
		if want := shard.WakeDue(11, shard.DueMs(due)); len(got) != 1 || got[0] != want {
			t.Errorf("wake-ups %q, want only %s", got, want)
		}
	})
}

// TestIDProducerOnCluster: scheduling, rescheduling and cancelling by id
// on a Redis Cluster client: each shard's MULTI stays on its slot, the
// bodies and properties land beside their ids, and a cancel takes them.
func TestIDProducerOnCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	rdb := c.Client()
	ctx := context.Background()
	const m = 16
	p, err := shard.NewProducer(rdb, "dq", "ids", m)
	if err != nil {
		t.Fatal(err)
	}
	prio := 5
	var tasks []shard.IDTask
	due := time.Now().Add(time.Hour)
	for i := 0; i < 300; i++ {
		tasks = append(tasks, shard.IDTask{ID: []byte(fmt.Sprintf("order-%d", i)), Body: []byte(fmt.Sprintf("body %d", i)),
			Props: &shard.Properties{Priority: &prio}, Due: due})
	}
	k := p.Keys()
	// The commands ScheduleIDsThen is given run once the write replied
	// (on a cluster in a pipeline of their own, the write's being one per
	// slot).
	var seen []*redis.FloatCmd
	if err := p.ScheduleIDsThen(ctx, tasks, func(pipe redis.Pipeliner) {
		seen = seen[:0]
		for _, task := range tasks {
			seen = append(seen, pipe.ZScore(ctx, k.Pending(shard.Index(task.ID, m)), string(task.ID)))
		}
	}); err != nil {
		t.Fatalf("ScheduleIDsThen: %v", err)
	}
	for n, c := range seen {
		if v, err := c.Result(); err != nil || int64(v) != due.UnixMilli() {
			t.Fatalf("%s as then read it: %v %v", tasks[n].ID, v, err)
		}
	}
	primaries := map[string]int{}
	for _, task := range tasks {
		i := shard.Index(task.ID, m)
		if sc := rdb.ZScore(ctx, k.Pending(i), string(task.ID)).Val(); int64(sc) != due.UnixMilli() {
			t.Fatalf("%s: score %v", task.ID, sc)
		}
		if b := rdb.HGet(ctx, k.Tasks(i), string(task.ID)).Val(); b != string(task.Body) {
			t.Fatalf("%s: body %q", task.ID, b)
		}
		if pr := rdb.HGet(ctx, k.Props(i), string(task.ID)).Val(); pr != `{"priority":5}` {
			t.Fatalf("%s: properties %q", task.ID, pr)
		}
		primaries[c.PrimaryOf(k.Pending(i)).Addr]++
	}
	if len(primaries) != 3 {
		t.Errorf("ids landed on %d primaries, want 3: %v", len(primaries), primaries)
	}
	later := due.Add(time.Hour)
	if moved, err := p.RescheduleID(ctx, []byte("order-7"), later); !moved || err != nil {
		t.Errorf("RescheduleID: %v %v", moved, err)
	}
	if sc := rdb.ZScore(ctx, k.Pending(shard.Index([]byte("order-7"), m)), "order-7").Val(); int64(sc) != later.UnixMilli() {
		t.Errorf("order-7 not rescheduled: %v", sc)
	}
	if ok, err := p.CancelID(ctx, []byte("order-8")); !ok || err != nil {
		t.Errorf("CancelID: %v %v", ok, err)
	}
	i := shard.Index([]byte("order-8"), m)
	if n := rdb.Exists(ctx, k.Tasks(i)).Val(); n != 1 {
		t.Fatalf("shard %d's bodies gone entirely", i)
	}
	if rdb.HExists(ctx, k.Tasks(i), "order-8").Val() || rdb.HExists(ctx, k.Props(i), "order-8").Val() {
		t.Errorf("order-8 cancelled and its body or properties left")
	}
}
