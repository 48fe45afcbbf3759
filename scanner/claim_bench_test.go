package scanner

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// BenchmarkClaim measures the claim script on the real Redis: each call
// moves batch due members of 200 bytes from a big pending set (b.N×batch
// due members plus 100,000 due in an hour) to the in-flight set. Run it
// with
//
//	go test -run '^$' -bench Claim ./scanner/
//
// members/s is what one shard drains at, Redis's side only (the round
// trip is one call, so it counts too).
func BenchmarkClaim(b *testing.B) {
	for _, batch := range []int{100, 250, 500, 1000, 2000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchClaim(b, batch) })
	}
}

func benchClaim(b *testing.B, batch int) {
	ctx := context.Background()
	rdb := testenv.Redis(b)
	k := shard.Keys{Prefix: testenv.Name(b), Queue: "q"}
	testenv.CleanRedis(b, rdb, k.Prefix)
	keys := claimKeysOf(k, 0)

	now := time.Now().UnixMilli()
	pad := strings.Repeat("x", 190)
	fill := func(from, to int, score func(i int) int64) {
		for start := from; start < to; start += 1000 {
			pipe := rdb.Pipeline()
			args := []any{"zadd", k.Pending(0)}
			for i := start; i < min(start+1000, to); i++ {
				args = append(args, score(i), strconv.Itoa(i)+":"+pad)
			}
			pipe.Do(ctx, args...)
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	due := b.N * batch
	fill(0, due, func(i int) int64 { return now - 600_000 + int64(i/1000) })
	fill(due, due+100_000, func(int) int64 { return now + 3_600_000 })
	if err := claimScript.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	for n := range b.N {
		v, err := claimScript.EvalSha(ctx, rdb, keys, batch, 30_000, n).Slice()
		if err != nil {
			b.Fatal(err)
		}
		if got := len(entriesOf(v)); got != batch {
			b.Fatalf("claimed %d members, want %d", got, batch)
		}
		// The dispatcher forgets confirmed entries; keep the in-flight
		// set small as it does, outside the measured time.
		b.StopTimer()
		if err := rdb.Del(ctx, k.Inflight(0)).Err(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "members/s")
}

// BenchmarkClaimShardSize measures one claim of 500 due tasks of 200 bytes
// from a shard that also holds 10^3 ... 10^k tasks due in an hour: how the
// claim's time grows with the shard's size (a skip list: log n). The
// largest size is 10^5 unless DISPATCHER_BENCH_SHARD_MAX says more
// (10000000 takes some 3 GB of Redis and a minute to load):
//
//	DISPATCHER_BENCH_SHARD_MAX=10000000 go test -run '^$' -bench ClaimShardSize -benchtime 200x ./scanner/
func BenchmarkClaimShardSize(b *testing.B) {
	ctx := context.Background()
	rdb := testenv.Redis(b)
	k := shard.Keys{Prefix: testenv.Name(b), Queue: "q"}
	testenv.CleanRedis(b, rdb, k.Prefix)
	b.Cleanup(func() { rdb.Unlink(ctx, k.Pending(0), k.Inflight(0), k.LastClaim(0)) })
	keys := claimKeysOf(k, 0)
	most := 100_000
	if v, err := strconv.Atoi(os.Getenv("DISPATCHER_BENCH_SHARD_MAX")); err == nil && v > 0 {
		most = v
	}
	if err := claimScript.Load(ctx, rdb).Err(); err != nil {
		b.Fatal(err)
	}
	pad := strings.Repeat("x", 190)
	later := time.Now().Add(time.Hour).UnixMilli()
	filled := 0
	fill := func(to int) {
		for start := filled; start < to; start += 1000 {
			args := []any{"zadd", k.Pending(0)}
			for i := start; i < min(start+1000, to); i++ {
				args = append(args, later+int64(i%60000), fmt.Sprintf("%010d:%s", i, pad))
			}
			if err := rdb.Do(ctx, args...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		filled = to
	}
	const batch = 500
	for size := 1000; size <= most; size *= 10 {
		fill(size)
		b.Run(fmt.Sprintf("shard=%d", size), func(b *testing.B) {
			due := time.Now().Add(-time.Minute).UnixMilli()
			for n := range b.N {
				b.StopTimer()
				args := []any{"zadd", k.Pending(0)}
				for i := range batch {
					args = append(args, due, fmt.Sprintf("due-%d-%d:%s", n, i, pad))
				}
				if err := rdb.Do(ctx, args...).Err(); err != nil {
					b.Fatal(err)
				}
				rdb.Del(ctx, k.Inflight(0))
				b.StartTimer()
				v, err := claimScript.EvalSha(ctx, rdb, keys, batch, 30_000, claimTokens.Add(1), 0, 1<<20).Slice()
				if err != nil {
					b.Fatal(err)
				}
				if got := len(entriesOf(v)); got != batch {
					b.Fatalf("claimed %d, want %d", got, batch)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/claim")
		})
	}
}
