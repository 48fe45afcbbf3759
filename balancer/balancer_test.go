package balancer_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/balancer"
	"github.com/dispatcher/dispatcher/internal/testenv"
)

func TestIndex(t *testing.T) {
	tests := []struct {
		n    int64
		m    int
		want int
	}{
		{1, 10, 0}, // counter values start at 1: the first pick is shard 0
		{2, 10, 1},
		{10, 10, 9},
		{11, 10, 0},
		{21, 10, 0},
		{1, 1, 0},
		{2, 1, 0},
		{0, 1, 0},
		{-7, 1, 0},
		{math.MaxInt64, 1, 0},
		{0, 10, 9},
		{-1, 10, 8},
		{-8, 10, 1},
		{-9, 10, 0},
		{-10, 10, 9},
		{-11, 10, 8},
		{1, 4096, 0},
		{4097, 4096, 0},
		{math.MaxInt64, 10, 6}, // (2^63-2) mod 10
	}
	for _, tt := range tests {
		if got := balancer.Index(tt.n, tt.m); got != tt.want {
			t.Errorf("Index(%d, %d) = %d, want %d", tt.n, tt.m, got, tt.want)
		}
	}
	// Always in range, and consecutive counter values walk the shards in turn.
	for _, m := range []int{1, 2, 3, 10, 4096} {
		for n := int64(-3 * 4096); n < 3*4096; n++ {
			i := balancer.Index(n, m)
			if i < 0 || i >= m {
				t.Fatalf("Index(%d, %d) = %d, out of range", n, m, i)
			}
			if next := balancer.Index(n+1, m); next != (i+1)%m {
				t.Fatalf("Index(%d, %d) = %d but Index(%d, %d) = %d", n, m, i, n+1, m, next)
			}
		}
	}
}

func counterKey(t *testing.T, rdb *redis.Client) string {
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	return prefix + ":{orders}:counter"
}

// Three instances sharing one counter, taking turns, cover every shard
// equally and in order.
func TestNextSharedCounter(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	key := counterKey(t, rdb)
	const shards, calls = 10, 300
	bs := []*balancer.Balancer{
		balancer.New(rdb, key, shards),
		balancer.New(testenv.Redis(t), key, shards),
		balancer.New(testenv.Redis(t), key, shards),
	}
	counts := make([]int, shards)
	for i := 0; i < calls; i++ {
		got, err := bs[i%len(bs)].Next(ctx)
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		if got < 0 || got >= shards {
			t.Fatalf("Next = %d, out of range", got)
		}
		if got != i%shards {
			t.Errorf("call %d picked shard %d, want %d", i, got, i%shards)
		}
		counts[got]++
	}
	for i, c := range counts {
		if c != calls/shards {
			t.Errorf("shard %d picked %d times, want %d", i, c, calls/shards)
		}
	}
}

func TestNextN(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	key := counterKey(t, rdb)
	const shards = 10
	b := balancer.New(rdb, key, shards)
	other := balancer.New(rdb, key, shards)

	check := func(got []int, n int) {
		t.Helper()
		want := min(n, shards)
		if len(got) != want {
			t.Fatalf("NextN(%d) returned %d shards %v, want %d", n, len(got), got, want)
		}
		seen := map[int]bool{}
		for i, s := range got {
			if s < 0 || s >= shards {
				t.Errorf("NextN(%d) = %v: shard %d out of range", n, got, s)
			}
			if seen[s] {
				t.Errorf("NextN(%d) = %v repeats shard %d", n, got, s)
			}
			seen[s] = true
			if i > 0 && s != (got[i-1]+1)%shards {
				t.Errorf("NextN(%d) = %v is not consecutive", n, got)
			}
		}
	}

	got, err := b.NextN(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	check(got, 4)
	if got[0] != 0 {
		t.Errorf("first NextN starts at %d, want 0", got[0])
	}
	// Another instance continues where the first left off.
	got, err = other.NextN(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	check(got, 4)
	if got[0] != 4 {
		t.Errorf("second NextN starts at %d, want 4", got[0])
	}
	// Wrapping around the end.
	got, err = b.NextN(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	check(got, 4)
	if want := []int{8, 9, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("NextN(4) = %v, want %v", got, want)
	}
	// Next continues from the same counter.
	if s, err := b.Next(ctx); err != nil || s != 2 {
		t.Errorf("Next after NextN = %d, %v; want 2", s, err)
	}
	// More than the shard count: every shard once.
	got, err = b.NextN(ctx, 25)
	if err != nil {
		t.Fatal(err)
	}
	check(got, 25)
	if got, err := b.NextN(ctx, 0); err != nil || len(got) != 0 {
		t.Errorf("NextN(0) = %v, %v; want none", got, err)
	}
	if got, err := b.NextN(ctx, -1); err != nil || len(got) != 0 {
		t.Errorf("NextN(-1) = %v, %v; want none", got, err)
	}
}

// One shard leaves nothing to balance: no round trip at all.
func TestSingleShardNeedsNoRedis(t *testing.T) {
	ctx := context.Background()
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { dead.Close() })
	b := balancer.New(dead, "dq:{orders}:counter", 1)
	for i := 0; i < 3; i++ {
		if s, err := b.Next(ctx); err != nil || s != 0 {
			t.Errorf("Next = %d, %v; want 0, nil", s, err)
		}
	}
	if got, err := b.NextN(ctx, 5); err != nil || !slices.Equal(got, []int{0}) {
		t.Errorf("NextN(5) = %v, %v; want [0], nil", got, err)
	}
	// The client really is unusable: more shards must fail.
	if _, err := balancer.New(dead, "dq:{orders}:counter", 2).Next(ctx); err == nil {
		t.Error("Next over 2 shards with an unreachable Redis succeeded")
	}
	if _, err := balancer.New(dead, "dq:{orders}:counter", 2).NextN(ctx, 2); err == nil {
		t.Error("NextN over 2 shards with an unreachable Redis succeeded")
	}
}
