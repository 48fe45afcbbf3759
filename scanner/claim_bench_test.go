package scanner

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// BenchmarkClaimIDs measures what tasks with an id cost the claim and the
// ack, against plain members: each round adds 500 due tasks with bodies
// of 200 bytes to a shard that also holds 100,000 of the same kind due in
// an hour (outside the measured time), claims them in one call (batch
// 500, byte budget 1 MiB, as the dispatcher does) and acks them in one
// call. Kinds: plain (the member is the body), ids (id "t<n>", body in
// P:{Q:i}:tasks, scheduled with MULTI/HSET/ZADD/EXEC as the contract
// says), ids+props (also an 85-byte properties JSON in P:{Q:i}:props).
// It runs on a private Redis, so that INFO commandstats counts only its
// own commands (those run inside the scripts included, the scripts' calls
// too):
//
//	go test -run '^$' -bench ClaimIDs -benchtime 300x -count 3 ./scanner/
//
// Metrics per task: claim-ns and ack-ns (each call timed with its round
// trip), claim-redis-ns and ack-redis-ns (the call's time inside Redis, as
// INFO commandstats counts it: less disturbed by a busy machine), and
// claim-cmds and ack-cmds (Redis commands).
func BenchmarkClaimIDs(b *testing.B) {
	ctx := context.Background()
	rdb := testenv.StartRedis(b, testenv.RedisOptions{}).Client()
	for _, s := range []*redis.Script{claimScript, ackScript} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			b.Fatal(err)
		}
	}
	for _, kind := range []string{"plain", "ids", "ids+props"} {
		k := shard.Keys{Prefix: "bench", Queue: kind}
		ids, props := kind != "plain", kind == "ids+props"
		later := time.Now().Add(time.Hour).UnixMilli()
		const far = 100_000
		for start := 0; start < far; start += 1000 {
			scheduleForBench(b, rdb, k, ids, props, start, min(start+1000, far), func(int) int64 { return later })
		}
		b.Run("tasks="+kind, func(b *testing.B) { benchClaimKind(b, rdb, k, ids, props) })
	}
}

// scheduleForBench schedules tasks from..to-1 on shard 0 of k, due at
// due(i): task i's body is "<i>:" padded to 200 bytes; with ids, its id
// is "t<i>" (and props its properties), in one MULTI/EXEC.
func scheduleForBench(b *testing.B, rdb *redis.Client, k shard.Keys, ids, props bool, from, to int, due func(i int) int64) {
	b.Helper()
	ctx := context.Background()
	zadd := []any{"zadd", k.Pending(0)}
	hset := []any{"hset", k.Tasks(0)}
	hprops := []any{"hset", k.Props(0)}
	for i := from; i < to; i++ {
		body := strconv.Itoa(i) + ":"
		body += strings.Repeat("x", 200-len(body))
		if !ids {
			zadd = append(zadd, due(i), body)
			continue
		}
		id := "t" + strconv.Itoa(i)
		zadd = append(zadd, due(i), id)
		hset = append(hset, id, body)
		hprops = append(hprops, id, fmt.Sprintf(`{"headers":{"traceparent":"00-0af7651916cd43dd%016x-b7ad6b7169203331-01"}}`, i))
	}
	if !ids {
		if err := rdb.Do(ctx, zadd...).Err(); err != nil {
			b.Fatal(err)
		}
		return
	}
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Do(ctx, hset...)
		if props {
			p.Do(ctx, hprops...)
		}
		p.Do(ctx, zadd...)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

func benchClaimKind(b *testing.B, rdb *redis.Client, k shard.Keys, ids, props bool) {
	ctx := context.Background()
	const batch = 500
	keys := claimKeysOf(k, 0)
	ackKeys := []string{k.Inflight(0), k.Attempts(0), k.Retrying(0), k.ClaimedBody(0), k.ClaimedProps(0)}
	due := time.Now().Add(-time.Minute).UnixMilli()
	var claimNs, ackNs time.Duration
	var claimCmds, ackCmds, claimUs, ackUs int64
	b.ResetTimer()
	for n := range b.N {
		b.StopTimer()
		first := 1_000_000 + claimTokens.Add(1)*batch // fresh tasks every round
		scheduleForBench(b, rdb, k, ids, props, int(first), int(first)+batch, func(int) int64 { return due })
		c0, u0 := commandCount(b, rdb)
		b.StartTimer()

		t0 := time.Now()
		v, err := claimScript.EvalSha(ctx, rdb, keys, batch, 30_000, claimTokens.Add(1), 0, 1<<20).Slice()
		claimNs += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		c1, u1 := commandCount(b, rdb)
		entries := entriesOf(v)
		if len(entries) != batch {
			b.Fatalf("round %d: claimed %d, want %d", n, len(entries), batch)
		}
		// An id's body comes with its entry; a plain member is its own.
		if body := v[6]; ids != (body != nil) || props != (v[7] != nil) {
			b.Fatalf("round %d: claimed body %v, properties %v", n, body, v[7])
		}
		b.StartTimer()

		t1 := time.Now()
		res, err := ackScript.EvalSha(ctx, rdb, ackKeys, append([]any{1, len(entries)}, entries...)...).Slice()
		ackNs += time.Since(t1)
		if err != nil {
			b.Fatal(err)
		}
		acked, _ := res[0].(int64)
		b.StopTimer()
		c2, u2 := commandCount(b, rdb)
		if acked != batch {
			b.Fatalf("round %d: acked %d, want %d", n, acked, batch)
		}
		claimCmds += c1 - c0
		ackCmds += c2 - c1
		claimUs += u1 - u0
		ackUs += u2 - u1
		b.StartTimer()
	}
	b.StopTimer()
	// The ack leaves nothing of an id behind.
	if n := rdb.Exists(ctx, k.ClaimedBody(0), k.ClaimedProps(0), k.Inflight(0)).Val(); n != 0 {
		b.Fatalf("%d of the claimed:body, claimed:props and in-flight keys left after the acks", n)
	}
	tasks := float64(b.N * batch)
	b.ReportMetric(float64(claimNs.Nanoseconds())/tasks, "claim-ns/task")
	b.ReportMetric(float64(ackNs.Nanoseconds())/tasks, "ack-ns/task")
	b.ReportMetric(float64(claimUs)*1000/tasks, "claim-redis-ns/task")
	b.ReportMetric(float64(ackUs)*1000/tasks, "ack-redis-ns/task")
	b.ReportMetric(float64(claimCmds)/tasks, "claim-cmds/task")
	b.ReportMetric(float64(ackCmds)/tasks, "ack-cmds/task")
}

// commandCount is every command Redis has run (INFO commandstats), those
// inside scripts included, but INFO itself; and the µs Redis spent in
// script calls (EVALSHA: the commands they run included).
func commandCount(b *testing.B, rdb *redis.Client) (n, scriptUs int64) {
	b.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				c, _ := strconv.ParseInt(v, 10, 64)
				n += c
			}
			if v, ok := strings.CutPrefix(f, "usec="); ok && name == "cmdstat_evalsha" {
				scriptUs, _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return n, scriptUs
}
