package scanner

import (
	"context"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestRateBucket: the bucket grants at most its burst at once, then
// nothing but a wait until the next token, then tokens at the rate.
func TestRateBucket(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	testenv.CleanRedis(t, rdb, k.Prefix)
	take := func(want int64) (int64, int64) {
		t.Helper()
		res, err := rateScript.Run(ctx, rdb, []string{k.Rate()}, 100.0, rateBurst(100), want).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res[0], res[1]
	}
	if g, _ := take(500); g != 10 {
		t.Fatalf("first take granted %d, want the burst of 10", g)
	}
	g, wait := take(500)
	if g != 0 || wait < 1 || wait > 10 {
		t.Fatalf("second take at once: granted %d, wait %d ms; want 0 and up to 10 ms", g, wait)
	}
	time.Sleep(55 * time.Millisecond)
	if g, _ := take(500); g < 5 || g > 10 {
		t.Errorf("after 55 ms at 100/s granted %d, want 5 to 10", g)
	}
	if g, _ := take(1); g > 1 {
		t.Errorf("granted %d of 1 wanted", g)
	}
	if ttl := rdb.PTTL(ctx, k.Rate()).Val(); ttl <= 0 || ttl > 2*time.Second {
		t.Errorf("bucket TTL %s: an idle queue's bucket should expire", ttl)
	}
}
