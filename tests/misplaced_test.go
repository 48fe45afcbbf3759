package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestLargerCountProducer: a queue recorded at M = 32, and a producer
// that hashes with 64 (its --shards given by hand): the tasks it writes
// to shards 32..63, and one written to shard 4095 (the contract's last
// index), are in keys no dispatcher serves. The sweeping instance walks
// the indexes beyond the served ones (a full cycle within a minute),
// moves what it finds to its shard by 32, where the due tasks are
// dispatched, counts them in dispatcher_tasks_misplaced_total and warns
// naming the key. A task due in an hour is moved too, to its shard by 32.
func TestLargerCountProducer(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	q := queueSpec{Name: "wide", Shards: 32}
	h := newHarness(t, q)
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	ctx := context.Background()
	if err := h.rdb.Set(ctx, k.ShardCount(), 32, 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := h.start()
	eventually(t, 20*time.Second, "the metrics served", func() bool {
		_, err := httpGet("http://" + addr + "/metrics")
		return err == nil
	})

	now := time.Now()
	want := map[string]int64{}
	stray := 0
	for i := 0; stray < 20; i++ {
		m := []byte(fmt.Sprintf("wide-%d", i))
		j := shard.Index(m, 64)
		if j < 32 {
			continue
		}
		if err := h.rdb.ZAdd(ctx, k.Pending(j), redisZ(now, m)).Err(); err != nil {
			t.Fatal(err)
		}
		want[shard.MessageID(m, now.UnixMilli())] = now.UnixMilli()
		stray++
	}
	last := []byte("at-4095")
	if err := h.rdb.ZAdd(ctx, k.Pending(4095), redisZ(now, last)).Err(); err != nil {
		t.Fatal(err)
	}
	want[shard.MessageID(last, now.UnixMilli())] = now.UnixMilli()
	later := []byte("due-in-an-hour")
	hour := now.Add(time.Hour)
	if err := h.rdb.ZAdd(ctx, k.Pending(40), redisZ(hour, later)).Err(); err != nil {
		t.Fatal(err)
	}

	// A cycle of the walk is a minute; the slack is for a loaded machine.
	o := h.verify(q.Name, want, 120*time.Second, 0)
	t.Logf("tasks in shards beyond the recorded count: delivered up to %v after due", o.WorstLate)
	eventually(t, 30*time.Second, "the task due in an hour moved to its shard by 32", func() bool {
		return h.rdb.ZScore(ctx, k.Pending(shard.Index(later, 32)), string(later)).Val() == float64(hour.UnixMilli())
	})
	if n := h.rdb.Exists(ctx, k.Pending(40), k.Pending(4095)).Val(); n != 0 {
		t.Errorf("%d of the keys beyond the shard count still exist", n)
	}
	eventually(t, 10*time.Second, "the misplaced tasks counted", func() bool {
		return metric(t, addr, `dispatcher_tasks_misplaced_total{queue="wide"}`) == float64(len(want)+1)
	})
	out := p.out.String()
	for _, key := range []string{k.Pending(4095), k.Pending(40)} {
		if !strings.Contains(out, key) {
			t.Errorf("no warning names %s:\n%s", key, tail(out, 3000))
		}
	}
}
