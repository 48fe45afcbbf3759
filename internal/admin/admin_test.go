package admin

import (
	"context"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestBatchScriptsCheckTypesFirst: a wrong-type key found by a batch
// requeue or purge changes nothing. Redis does not undo a script's writes
// when a later call fails: before the check, the first dead letter was
// requeued and then the batch failed (found in review).
func TestBatchScriptsCheckTypesFirst(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	q := Queue{Keys: shard.Keys{Prefix: prefix, Queue: "q"}, Shards: 1}
	var ds []Dead
	for i := range 3 {
		e := strconv.Itoa(1000+i) + ":task-" + strconv.Itoa(i)
		rdb.ZAdd(ctx, q.Keys.Dead(0), redis.Z{Score: float64(1000 + i), Member: e})
		d, _ := parseEntry(0, e)
		ds = append(ds, d)
	}
	rdb.Set(ctx, q.Keys.DeadReason(0), "not a hash", 0)
	if _, err := RequeueBatch(ctx, rdb, q, 0, ds, 0); err == nil {
		t.Fatal("requeue with a wrong-type reasons key: no error")
	}
	if _, err := PurgeBatch(ctx, rdb, q, 0, ds); err == nil {
		t.Fatal("purge with a wrong-type reasons key: no error")
	}
	if dead, pending := rdb.ZCard(ctx, q.Keys.Dead(0)).Val(), rdb.ZCard(ctx, q.Keys.Pending(0)).Val(); dead != 3 || pending != 0 {
		t.Fatalf("after the failed batches: %d dead, %d pending; want 3 and 0 (nothing changed)", dead, pending)
	}
}
