package shard_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// The shard module depends on go-redis and xxhash alone, so its tests
// cannot use the main module's testenv: they find Redis themselves, at
// DISPATCHER_TEST_REDIS_URL or the local default, and fail (never skip)
// when it does not answer. Tests that need servers of their own (a Redis
// Cluster) live in the main module, in tests/shardcluster.
const defaultTestRedisURL = "redis://127.0.0.1:6379/0"

// testRedis returns a client of the test Redis, closed when the test ends.
func testRedis(t *testing.T) *redis.Client {
	t.Helper()
	u := os.Getenv("DISPATCHER_TEST_REDIS_URL")
	from := "DISPATCHER_TEST_REDIS_URL"
	if u == "" {
		u, from = defaultTestRedisURL, "the default (DISPATCHER_TEST_REDIS_URL unset)"
	}
	opt, err := redis.ParseURL(u)
	if err != nil {
		t.Fatalf("test Redis URL from %s: %v", from, err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("no Redis for tests at %s, from %s: %v", opt.Addr, from, err)
	}
	return c
}

// testPrefix returns a key prefix of the test's own, whose keys are
// deleted when the test ends (the test Redis is shared).
func testPrefix(t *testing.T, c *redis.Client) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	n := strings.NewReplacer("/", "-", " ", "-", "#", "-").Replace(t.Name())
	if len(n) > 40 {
		n = n[:40]
	}
	prefix := strings.ToLower(n) + "-" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
	return prefix
}

// TestReadLayoutNamesABadValue: a layout key holding no shard count is an
// error naming the key (and the field, for the reshard hash) and the
// value read.
func TestReadLayoutNamesABadValue(t *testing.T) {
	c := testRedis(t)
	k := shard.Keys{Prefix: testPrefix(t, c), Queue: "q"}
	ctx := context.Background()
	c.Set(ctx, k.ShardCount(), "8", 0)
	for _, tc := range []struct {
		set  func()
		want string
	}{
		{func() { c.Set(ctx, k.ShardCount(), "eight", 0) }, k.ShardCount() + ` is "eight", not a shard count`},
		{func() { c.Set(ctx, k.ShardCount(), "8", 0); c.HSet(ctx, k.Reshard(), "from", "0") }, k.Reshard() + ` from is "0", not a shard count`},
		{func() { c.Del(ctx, k.Reshard()); c.Set(ctx, k.Retired(), "5000", 0) }, k.Retired() + ` is "5000", not a shard count`},
		{func() {
			c.Del(ctx, k.Retired())
			c.HSet(ctx, k.ShardCount()+"x", "f", "v")
			c.Rename(ctx, k.ShardCount()+"x", k.ShardCount())
		}, "read " + k.ShardCount() + ": WRONGTYPE"},
	} {
		tc.set()
		_, err := shard.ReadLayout(ctx, c, k)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ReadLayout: %v, want an error with %q", err, tc.want)
		}
	}
	c.Del(ctx, k.ShardCount())
	c.Set(ctx, k.ShardCount(), "8", 0)
	if l, err := shard.ReadLayout(ctx, c, k); err != nil || l != (shard.Layout{Shards: 8}) {
		t.Errorf("ReadLayout: %v, %v; want 8 shards", l, err)
	}
}
