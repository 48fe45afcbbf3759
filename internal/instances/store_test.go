package instances

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestWriteRead: two instances' records of two queues are read back with
// the Redis clock; a record not renewed for the TTL is skipped by readers
// and pruned by the next write; the hash expires with the TTL; a clean
// stop removes its records at once.
func TestWriteRead(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	rec := func(id string, published int64) Record {
		return Record{ID: id, Host: "h", PID: 7, Version: "v1", SpanMs: 60_000, Published: published, EndMs: 5000, Slots: []int64{published}}
	}
	for _, id := range []string{"a", "b"} {
		if _, err := Write(ctx, rdb, prefix, map[string]Record{"orders": rec(id, 60), "mail": rec(id, 6)}, TTL); err != nil {
			t.Fatal(err)
		}
	}
	// An instance that died a minute ago.
	key := shard.Keys{Prefix: prefix, Queue: "orders"}.Instances()
	redisNow, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	old := strconv.FormatInt(redisNow.Add(-time.Minute).UnixMilli(), 10)
	v, _ := encode(rec("dead", 1))
	rdb.HSet(ctx, key, "dead", old+" "+v, "junk", "not a record")

	qs := Read(ctx, rdb, prefix, []string{"orders", "mail", "none"}, TTL)
	if len(qs) != 3 {
		t.Fatalf("%d queues read", len(qs))
	}
	o := qs[0]
	if o.Err != nil || len(o.Records) != 2 || o.Records[0].ID != "a" || o.Records[1].ID != "b" || o.Bad != 1 {
		t.Fatalf("orders: %+v", o)
	}
	if d := o.NowMs - o.Records[0].SeenMs; d < 0 || d > 10_000 {
		t.Errorf("record seen %d ms before the read", d)
	}
	if s := Add(o.Records); s.Published != 120 || s.Rate != 2 || s.Slots[Slots-1] != 120 {
		t.Errorf("orders as a whole: %+v", s)
	}
	if len(qs[1].Records) != 2 || qs[1].Records[0].Published != 6 || qs[2].Err != nil || len(qs[2].Records) != 0 {
		t.Errorf("mail %+v, none %+v", qs[1], qs[2])
	}

	// The next write prunes the dead instance's record (the junk too) and
	// keeps the hash for the TTL only.
	if _, err := Write(ctx, rdb, prefix, map[string]Record{"orders": rec("a", 61)}, TTL); err != nil {
		t.Fatal(err)
	}
	if fields := rdb.HKeys(ctx, key).Val(); len(fields) != 2 {
		t.Errorf("fields after the prune: %v, want a and b", fields)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > TTL {
		t.Errorf("hash TTL %s, want up to %s", ttl, TTL)
	}

	if err := Remove(ctx, rdb, prefix, "a", []string{"orders", "mail"}); err != nil {
		t.Fatal(err)
	}
	qs = Read(ctx, rdb, prefix, []string{"orders", "mail"}, TTL)
	for _, q := range qs {
		if len(q.Records) != 1 || q.Records[0].ID != "b" {
			t.Errorf("%s after a's stop: %+v", q.Name, q.Records)
		}
	}
}

// TestRecorderWrites: Run writes the records on the grid and removes them
// when it stops.
func TestRecorderWrites(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	r := New(rdb, Options{Prefix: prefix, ID: "h:1:ab", Host: "h", PID: 1, Version: "v1", Queues: []string{"orders"},
		Totals: func() map[string]Totals { return map[string]Totals{"orders": {Published: 42}} }, Sweeps: func(string) bool { return false }})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	var q Queue
	deadline := time.Now().Add(3 * Every)
	for time.Now().Before(deadline) {
		if q = Read(context.Background(), rdb, prefix, []string{"orders"}, TTL)[0]; len(q.Records) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(q.Records) != 1 || q.Records[0].Published != 42 || q.Records[0].EndMs%SlotSpan.Milliseconds() != 0 {
		t.Fatalf("records written: %+v (err %v)", q.Records, q.Err)
	}
	stop()
	<-done
	if q = Read(context.Background(), rdb, prefix, []string{"orders"}, TTL)[0]; len(q.Records) != 0 {
		t.Errorf("records after the stop: %+v", q.Records)
	}
}

// TestWriteReadCluster: on Redis Cluster the queues' hashes live on
// different nodes; one Write and one Read each reach them all.
func TestWriteReadCluster(t *testing.T) {
	ctx := context.Background()
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	rdb := c.Client()
	queues := []string{"a", "b", "c", "d", "e", "f"}
	nodes := map[int]bool{}
	recs := map[string]Record{}
	for n, q := range queues {
		slot := shard.Slot(shard.Keys{Prefix: "dq", Queue: q}.Instances())
		for i, p := range c.Primaries() {
			if p.Serves(slot) {
				nodes[i] = true
			}
		}
		recs[q] = Record{ID: "h:1:ab", Host: "h", PID: 1, Version: "v1", SpanMs: 1000, Published: int64(n)}
	}
	if len(nodes) < 2 {
		t.Fatalf("the queues' records fall on %d node(s): pick other names", len(nodes))
	}
	if _, err := Write(ctx, rdb, "dq", recs, TTL); err != nil {
		t.Fatal(err)
	}
	for n, q := range Read(ctx, rdb, "dq", queues, TTL) {
		if q.Err != nil || len(q.Records) != 1 || q.Records[0].Published != int64(n) || q.NowMs == 0 {
			t.Errorf("queue %s: %+v", q.Name, q)
		}
	}
}

// TestWriteManyQueues: one Write of more queues than one script call
// takes writes each queue's own record; a queue whose hash key holds
// another type is refused by name, and the queues after it in its call
// are written all the same.
func TestWriteManyQueues(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	n := 2*writeBatch + 7
	recs := map[string]Record{}
	var queues []string
	for i := 0; i < n; i++ {
		q := "q" + strconv.Itoa(i)
		queues = append(queues, q)
		recs[q] = Record{ID: "h:1:ab", Host: "h", PID: 1, Version: "v1", SpanMs: 1000, Published: int64(i)}
	}
	bad := shard.Keys{Prefix: prefix, Queue: "q10"}.Instances()
	rdb.Set(ctx, bad, "not a hash", 0)
	now, err := Write(ctx, rdb, prefix, recs, TTL)
	if err == nil || !strings.Contains(err.Error(), "write "+bad+": WRONGTYPE") || strings.Count(err.Error(), "\n") != 0 {
		t.Errorf("Write: %v, want one refusal, of %s", err, bad)
	}
	if redisNow := rdb.Time(ctx).Val().UnixMilli(); now <= 0 || redisNow-now < 0 || redisNow-now > 10_000 {
		t.Errorf("Write returned the clock %d, Redis reads %d", now, redisNow)
	}
	for i, q := range Read(ctx, rdb, prefix, queues, TTL) {
		if i == 10 {
			if q.Err == nil {
				t.Errorf("queue %s: read with no error", q.Name)
			}
			continue
		}
		if q.Err != nil || len(q.Records) != 1 || q.Records[0].Published != int64(i) || q.Records[0].ID != "h:1:ab" {
			t.Fatalf("queue %s: %+v", q.Name, q)
		}
	}
	if rdb.Get(ctx, bad).Val() != "not a hash" {
		t.Errorf("the refused key was changed")
	}
	recs["q3"] = Record{ID: "other"}
	if _, err := Write(ctx, rdb, prefix, recs, TTL); err == nil || !strings.Contains(err.Error(), "two instances") {
		t.Errorf("Write of two instances' records: %v", err)
	}
}
