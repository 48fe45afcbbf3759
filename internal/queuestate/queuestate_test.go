package queuestate_test

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestRead checks every figure against what was written, on the Redis
// clock: due counts and the oldest due age, in-flight entries whose lease
// ran out, dead letters, the sweeper, and that one broken shard is named
// with its key while the others are read.
func TestRead(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "orders"}
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := tm.UnixMilli()
	// Shard 0: two due (10 s and 2 s ago), one ahead. Shard 1: one ahead,
	// two in flight (one lease ran out), one dead. Shard 2: a string.
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 10_000), Member: "a"},
		redis.Z{Score: float64(now - 2_000), Member: "b"}, redis.Z{Score: float64(now + 60_000), Member: "c"})
	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: float64(now + 30_000), Member: "d"})
	rdb.ZAdd(ctx, k.Inflight(1), redis.Z{Score: float64(now - 1), Member: "1:e"}, redis.Z{Score: float64(now + 30_000), Member: "1:f"})
	rdb.ZAdd(ctx, k.Dead(1), redis.Z{Score: 1, Member: "1:g"})
	rdb.Set(ctx, k.Pending(2), "not a set", 0)
	// Shard 3: a producer that wrote seconds, 5 s ago, and one that wrote
	// seconds for an hour ahead: sorted first, it must not hide a task
	// in ms that is 2 minutes late.
	rdb.ZAdd(ctx, k.Pending(3), redis.Z{Score: float64(now/1000 - 5), Member: "h"},
		redis.Z{Score: float64(now/1000 + 3600), Member: "i"}, redis.Z{Score: float64(now - 120_000), Member: "j"})
	rdb.Set(ctx, k.Sweeper(), "host:1:ab", 0)

	qs, err := queuestate.Read(ctx, rdb, prefix, []queuestate.Target{{Name: "orders", Shards: 4}, {Name: "empty", Shards: 2}})
	if err != nil {
		t.Fatal(err)
	}
	q := qs[0]
	want := []queuestate.Shard{
		{Index: 0, Pending: 3, Due: 2, NextDueMs: now - 10_000},
		{Index: 1, Pending: 1, Inflight: 2, Expired: 1, Dead: 1, NextDueMs: now + 30_000},
		{Index: 2},
		// All three are due: the dispatcher sends scores in seconds at once.
		{Index: 3, Pending: 3, Due: 3, NextDueMs: now - 120_000},
	}
	for i, w := range want {
		g := q.Shards[i]
		g.OldestDueAge, g.AgeSeconds = 0, 0
		if i == 2 {
			if !strings.Contains(g.Err, "WRONGTYPE key "+k.Pending(2)+" holds a string") {
				t.Errorf("shard 2: error %q, want one naming its key and type", g.Err)
			}
			continue
		}
		if g != w {
			t.Errorf("shard %d: %+v, want %+v", i, g, w)
		}
	}
	if age := q.Shards[0].OldestDueAge; age < 10*time.Second || age > 12*time.Second {
		t.Errorf("shard 0's oldest due age %s, want 10 s (and the read's round trip)", age)
	}
	if age := q.Shards[3].OldestDueAge; age < 120*time.Second || age > 122*time.Second {
		t.Errorf("shard 3's oldest due age %s, want 2 minutes: tasks in seconds, sorted first, hid it", age)
	}
	if q.Pending != 7 || q.Due != 5 || q.Inflight != 2 || q.Expired != 1 || q.Dead != 1 || q.Broken != 1 {
		t.Errorf("sums %+v", q)
	}
	if q.OldestDueAge != q.Shards[3].OldestDueAge || q.NextDueMs != now-120_000 || q.Sweeper != "host:1:ab" {
		t.Errorf("queue: age %s next %d sweeper %q", q.OldestDueAge, q.NextDueMs, q.Sweeper)
	}
	if late := q.Late(); len(late) != 2 || late[0].Index != 3 || late[1].Index != 0 {
		t.Errorf("late shards %+v, want shards 0 and 3, the latest first", late)
	}
	if e := qs[1]; e.Pending != 0 || e.Broken != 0 || e.OldestDueAge != 0 || e.Sweeper != "" || len(e.Shards) != 2 {
		t.Errorf("empty queue read as %+v", e)
	}
}

// TestReadLoadsItsScript: a Redis that lost its script cache (restarted,
// failed over) answers NOSCRIPT, and the read sends the source instead.
func TestReadLoadsItsScript(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	rdb.ZAdd(ctx, "p:{q:0}", redis.Z{Score: 1e12, Member: "x"})
	for round := 0; round < 2; round++ {
		if err := rdb.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		qs, err := queuestate.Read(ctx, rdb, "p", []queuestate.Target{{Name: "q", Shards: 1}})
		if err != nil || qs[0].Shards[0].Err != "" || qs[0].Pending != 1 || qs[0].Due != 1 {
			t.Fatalf("round %d after SCRIPT FLUSH: %+v, %v", round, qs, err)
		}
	}
}

// TestReadUnreachable: with Redis gone the read fails as a whole, naming
// the trouble.
func TestReadUnreachable(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := queuestate.Read(ctx, rdb, "p", []queuestate.Target{{Name: "q", Shards: 2}}); err == nil {
		t.Fatal("read of a dead Redis did not fail")
	}
}

// TestReadConnectionRefused: a connection whose set-up Redis refuses (here
// SELECT of a database it lacks) sends no command; the error returned is
// Redis's answer, not a type mismatch of a reply never read.
func TestReadConnectionRefused(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opt.DB = 99
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	_, err = queuestate.Read(context.Background(), rdb, testenv.Name(t), []queuestate.Target{{Name: "q", Shards: 2}})
	if err == nil || !strings.Contains(err.Error(), "DB index is out of range") {
		t.Fatalf("Read: %v, want Redis's refusal", err)
	}
}

// TestReadRetried: retried tasks (in-flight entries with a failed publish
// in the attempts hash) are counted, and the oldest of them by due time,
// read from the retrying index, makes the shard late as a pending task
// would. An index entry whose attempts field is gone (acked by a version
// without the index) is skipped; a retried entry the index lacks (failed
// under such a version) counts, with no age until its next failure.
func TestReadRetried(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "orders"}
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := tm.UnixMilli()
	stale, old, young := "1:stale", fmt.Sprintf("%d:old", now-90_000), fmt.Sprintf("%d:young", now-5_000)
	// Shard 0: two retried in their backoff, a stale index entry before
	// them, and a task pending, due 1 s ago.
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1_000), Member: "p"})
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now+4_000) + 0.5, Member: old}, redis.Z{Score: float64(now+900) + 0.5, Member: young})
	rdb.HSet(ctx, k.Attempts(0), old, 7, young, 1)
	rdb.ZAdd(ctx, k.Retrying(0), redis.Z{Score: 1, Member: stale}, redis.Z{Score: float64(now - 90_000), Member: old},
		redis.Z{Score: float64(now - 5_000), Member: young})
	// Shard 1: retried under an older version: in the attempts hash only.
	rdb.ZAdd(ctx, k.Inflight(1), redis.Z{Score: float64(now + 1_000), Member: "2:legacy"})
	rdb.HSet(ctx, k.Attempts(1), "2:legacy", 1)

	qs, err := queuestate.Read(ctx, rdb, prefix, []queuestate.Target{{Name: "orders", Shards: 2}})
	if err != nil {
		t.Fatal(err)
	}
	q := qs[0]
	s0, s1 := q.Shards[0], q.Shards[1]
	if s0.Retried != 2 || s0.OldestRetriedDueMs != now-90_000 || s0.Inflight != 2 || s0.Due != 1 {
		t.Errorf("shard 0: %+v, want 2 retried, the oldest due %d", s0, now-90_000)
	}
	if s0.RetriedAge < 90*time.Second || s0.RetriedAge > 92*time.Second || s0.OldestDueAge != s0.RetriedAge {
		t.Errorf("shard 0: retried age %s, oldest due age %s; want both 90 s: a retried task is late too", s0.RetriedAge, s0.OldestDueAge)
	}
	if s1.Retried != 1 || s1.OldestRetriedDueMs != 0 || s1.RetriedAge != 0 || s1.Err != "" {
		t.Errorf("shard 1: %+v, want 1 retried of unknown age", s1)
	}
	if q.Retried != 3 || q.RetriedAge != s0.RetriedAge || q.OldestDueAge != s0.RetriedAge || q.RetriedAgeSeconds < 90 {
		t.Errorf("queue: %d retried, retried age %s, oldest due age %s", q.Retried, q.RetriedAge, q.OldestDueAge)
	}
	if late := q.Late(); len(late) != 1 || late[0].Index != 0 {
		t.Errorf("late shards %+v, want shard 0", late)
	}

	// A wrong-type attempts key breaks its shard, named.
	rdb.Del(ctx, k.Attempts(1))
	rdb.Set(ctx, k.Attempts(1), "x", 0)
	qs, err = queuestate.Read(ctx, rdb, prefix, []queuestate.Target{{Name: "orders", Shards: 2}})
	if err != nil || !strings.Contains(qs[0].Shards[1].Err, "WRONGTYPE key "+k.Attempts(1)+" holds a string, not a hash") {
		t.Errorf("wrong-type attempts key: %v, shard 1 error %q", err, qs[0].Shards[1].Err)
	}
	// So does one of the hashes of task ids' bodies and properties (the
	// claim script fails on it too), each named.
	rdb.Del(ctx, k.Attempts(1))
	for _, key := range []string{k.Tasks(0), k.Props(0), k.ClaimedBody(0), k.ClaimedProps(0)} {
		rdb.Set(ctx, key, "x", 0)
		qs, err = queuestate.Read(ctx, rdb, prefix, []queuestate.Target{{Name: "orders", Shards: 2}})
		if err != nil || !strings.Contains(qs[0].Shards[0].Err, "WRONGTYPE key "+key+" holds a string, not a hash") || qs[0].Shards[1].Err != "" {
			t.Errorf("wrong-type %s: %v, shard errors %q, %q", key, err, qs[0].Shards[0].Err, qs[0].Shards[1].Err)
		}
		rdb.Del(ctx, key)
	}
	rdb.HSet(ctx, k.Tasks(0), "id-1", "body")
	rdb.HSet(ctx, k.ClaimedProps(0), "1:id-1", "{}")
	if qs, err = queuestate.Read(ctx, rdb, prefix, []queuestate.Target{{Name: "orders", Shards: 2}}); err != nil || qs[0].Shards[0].Err != "" {
		t.Errorf("with hashes of the right type: %v, shard 0 error %q", err, qs[0].Shards[0].Err)
	}
}

// TestReadRetriedCostIsBounded: the read of a shard with many retried
// tasks runs a fixed number of Redis commands, not one per task.
func TestReadRetriedCostIsBounded(t *testing.T) {
	ctx := context.Background()
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	k := shard.Keys{Prefix: "p", Queue: "q"}
	calls := func() int64 { return commandCalls(t, rdb) }
	var perRead []int64
	for _, n := range []int{10, 20_000} {
		rdb.Del(ctx, k.Inflight(0), k.Attempts(0), k.Retrying(0))
		pipe := rdb.Pipeline()
		for i := 0; i < n; i++ {
			e := fmt.Sprintf("%d:t%d", 1_000_000_000_000+i, i)
			pipe.ZAdd(ctx, k.Inflight(0), redis.Z{Score: 1, Member: e})
			pipe.HSet(ctx, k.Attempts(0), e, 1)
			pipe.ZAdd(ctx, k.Retrying(0), redis.Z{Score: float64(1_000_000_000_000 + i), Member: e})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := queuestate.Read(ctx, rdb, "p", []queuestate.Target{{Name: "q", Shards: 1}}); err != nil {
			t.Fatal(err) // loads the script
		}
		before := calls()
		qs, err := queuestate.Read(ctx, rdb, "p", []queuestate.Target{{Name: "q", Shards: 1}})
		if err != nil || qs[0].Retried != int64(n) || qs[0].Shards[0].OldestRetriedDueMs != 1_000_000_000_000 {
			t.Fatalf("%d retried: %+v, %v", n, qs, err)
		}
		perRead = append(perRead, calls()-before-1) // less the INFO
	}
	if perRead[0] != perRead[1] {
		t.Errorf("commands per read: %d with 10 retried, %d with 20,000: want the same", perRead[0], perRead[1])
	}
	t.Logf("commands per shard read (EVALSHA and the calls in it): %d", perRead[1])
}

// commandCalls is how many commands rdb's server has run (INFO
// commandstats: the calls inside scripts count too).
func commandCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, l := range strings.Split(info, "\n") {
		if _, rest, ok := strings.Cut(l, ":calls="); ok {
			n, _ := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
			total += n
		}
	}
	return total
}

// TestReadEmptyPartsCost: the reads of many quiet queues are most of what
// an idle instance asks of Redis, so what a shard does not hold costs no
// command: an empty shard is read with EVALSHA and 2 calls in it (TIME and
// one EXISTS over all its keys; it was 7), a shard holding only a plain due
// task with 9 (that EXISTS, an existence check of the four id hashes, the
// head, its count and due count, the attempts, the in-flight and dead
// counts, the pause flag); the queue's read adds a GET of its sweeper. The
// figures stay right (TestRead and the others).
func TestReadEmptyPartsCost(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	k := shard.Keys{Prefix: "p", Queue: "q"}
	read := func() (queuestate.Queue, int64) {
		t.Helper()
		before := commandCalls(t, rdb)
		qs, err := queuestate.Read(ctx, rdb, "p", []queuestate.Target{{Name: "q", Shards: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return qs[0], commandCalls(t, rdb) - before - 1 // less the INFO
	}
	read() // loads the script
	if q, n := read(); n > 4 || q.Pending != 0 {
		t.Errorf("empty shard: %d commands (want at most 4), %+v", n, q)
	}
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 1_000_000_000_000, Member: "a"})
	if q, n := read(); n > 12 || q.Pending != 1 || q.Due != 1 {
		t.Errorf("one plain task: %d commands (want at most 12), %+v", n, q)
	}
}

// TestReadBadScores: tasks with no real due time (0, negative, -inf,
// seconds before 1973) are counted, the first named, and left out of the
// oldest due age, which the dated ones behind them give; tasks after year
// 5138 (µs, ns, +inf) are counted and the last named; a shard beyond the
// shard count is read when asked, marked, and summed.
func TestReadBadScores(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "bad"}
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := tm.UnixMilli()
	inf := math.Inf(1)
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: -inf, Member: "minus-inf"}, redis.Z{Score: -5, Member: "minus-five"},
		redis.Z{Score: 0, Member: "zero"}, redis.Z{Score: 5e7, Member: "seconds-1971"},
		redis.Z{Score: float64(now - 30_000), Member: "late"})
	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: float64(now + 60_000), Member: "ahead"},
		redis.Z{Score: 1767225600000000, Member: "micros"}, redis.Z{Score: inf, Member: strings.Repeat("x", 100)})
	// Undated, then seconds 5 s ago, then ms 2 s ago: the seconds give the age.
	rdb.ZAdd(ctx, k.Pending(2), redis.Z{Score: -1, Member: "u"}, redis.Z{Score: float64(now/1000 - 5), Member: "s"},
		redis.Z{Score: float64(now - 2000), Member: "m"})
	rdb.ZAdd(ctx, k.Pending(40), redis.Z{Score: float64(now - 1000), Member: "stray"})

	qs, err := queuestate.Read(ctx, rdb, prefix, []queuestate.Target{{Name: "bad", Shards: 3, Beyond: []int{40}}})
	if err != nil {
		t.Fatal(err)
	}
	q := qs[0]
	s0, s1, s2, s40 := q.Shards[0], q.Shards[1], q.Shards[2], q.Shards[3]
	if s0.Undated != 4 || s0.FirstUndated == nil || *s0.FirstUndated != (queuestate.Scored{Member: "minus-inf", Score: "-inf"}) ||
		s0.Due != 5 || s0.NextDueMs != now-30_000 {
		t.Errorf("shard 0: %+v (first undated %+v)", s0, s0.FirstUndated)
	}
	if s0.OldestDueAge < 30*time.Second || s0.OldestDueAge > 32*time.Second {
		t.Errorf("shard 0's oldest due age %s, want 30 s: the undated tasks counted from 1970", s0.OldestDueAge)
	}
	if s1.Far != 2 || s1.LastFar == nil || *s1.LastFar != (queuestate.Scored{Member: strings.Repeat("x", 64), Score: "+inf"}) ||
		s1.Undated != 0 || s1.NextDueMs != now+60_000 || s1.OldestDueAge != 0 {
		t.Errorf("shard 1: %+v (last far %+v)", s1, s1.LastFar)
	}
	if s2.Undated != 1 || s2.OldestDueAge < 5*time.Second || s2.OldestDueAge > 7*time.Second {
		t.Errorf("shard 2: %+v, want 1 undated and an age of 5 s from the task in seconds", s2)
	}
	if s40.Index != 40 || !s40.Beyond || s40.Pending != 1 || s0.Beyond {
		t.Errorf("shard 40: %+v", s40)
	}
	if q.Undated != 5 || q.Far != 2 || q.Beyond != 1 || q.Pending != 12 {
		t.Errorf("sums: undated %d, far %d, beyond %d, pending %d", q.Undated, q.Far, q.Beyond, q.Pending)
	}
}
