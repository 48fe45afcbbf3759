package scanner

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// Regression tests for the loss windows of the audit (issue 8): each
// failed against the scripts as they were before it.

func newStore(t *testing.T, rdb redis.UniversalClient, lease time.Duration) *store {
	t.Helper()
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	if c, ok := rdb.(*redis.Client); ok {
		testenv.CleanRedis(t, c, k.Prefix)
	}
	return &store{rdb: rdb, keys: k, lease: lease, retryMin: 50 * time.Millisecond,
		retryMax: time.Second, maxAttempts: 3, instance: "test"}
}

func mustClaim(t *testing.T, st *store, limit int) claimed {
	t.Helper()
	c, err := st.claim(context.Background(), 0, limit)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// eventuallyClaimed claims shard 0 until entry comes out, for up to 3 s
// (leases in these tests are short), and fails the test if it never does.
func eventuallyClaimed(t *testing.T, st *store, entry string) {
	t.Helper()
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		c, err := st.claim(context.Background(), 0, 100)
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		if slices.Contains(c.entries, entry) {
			return
		}
	}
	t.Fatalf("%s was never claimed again: lost (in flight: %v, pending: %v)", entry,
		st.rdb.ZRangeWithScores(context.Background(), st.keys.Inflight(0), 0, -1).Val(),
		st.rdb.ZRangeWithScores(context.Background(), st.keys.Pending(0), 0, -1).Val())
}

// schedule ZADDs member to shard 0 due at due (server ms).
func schedule(t *testing.T, st *store, member string, due int64) string {
	t.Helper()
	if err := st.rdb.ZAdd(context.Background(), st.keys.Pending(0), redis.Z{Score: float64(due), Member: member}).Err(); err != nil {
		t.Fatal(err)
	}
	return EntryOf([]byte(member), due)
}

// Finding 1: a script that deleted the in-flight entry and then failed on
// a wrong-type destination lost the task.
func TestWrongTypeKeyLosesNothing(t *testing.T) {
	ctx := context.Background()
	t.Run("reap into a wrong-type pending key", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 200*time.Millisecond)
		now := serverMs(t, rdb)
		e := EntryOf([]byte("m"), now-1000)
		rdb.ZAdd(ctx, st.keys.Inflight(0), redis.Z{Score: float64(now - 5), Member: e})
		rdb.Set(ctx, st.keys.Pending(0), "someone's string", 0)
		if _, err := st.claim(ctx, 0, 10); err == nil || !redis.HasErrorPrefix(err, "WRONGTYPE") {
			t.Fatalf("claim on a wrong-type pending key: %v, want WRONGTYPE", err)
		}
		rdb.Del(ctx, st.keys.Pending(0)) // the operator restores the key
		eventuallyClaimed(t, st, e)
	})
	t.Run("release with a wrong-type pending key", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 200*time.Millisecond)
		e := schedule(t, st, "m", serverMs(t, rdb)-1000)
		c := mustClaim(t, st, 10)
		rdb.Set(ctx, st.keys.Pending(0), "someone's string", 0)
		_, _ = st.release(ctx, 0, c.deadline, c.entries)
		rdb.Del(ctx, st.keys.Pending(0))
		eventuallyClaimed(t, st, e)
	})
	for _, key := range []string{"dead", "dead reason"} {
		t.Run("dead-letter into a wrong-type "+key+" key", func(t *testing.T) {
			rdb := testenv.Redis(t)
			st := newStore(t, rdb, 200*time.Millisecond)
			bad := map[string]string{"dead": st.keys.Dead(0), "dead reason": st.keys.DeadReason(0)}[key]
			e := schedule(t, st, "poison", serverMs(t, rdb)-1000)
			c := mustClaim(t, st, 10)
			rdb.Set(ctx, bad, "someone's string", 0)
			if _, _, err := st.fail(ctx, 0, c.deadline, []outcome{{e, "dead", "oversize"}}); err == nil {
				t.Fatal("dead-lettering into a wrong-type key reported success")
			}
			rdb.Del(ctx, bad)
			eventuallyClaimed(t, st, e)
		})
	}
}

// Finding 2: reaping or releasing a claimed scheduling must not be
// swallowed by the producer's later ZADD of the same member.
func TestClaimedSchedulingSurvivesReschedule(t *testing.T) {
	ctx := context.Background()
	for _, path := range []string{"reap", "release"} {
		t.Run(path, func(t *testing.T) {
			rdb := testenv.Redis(t)
			st := newStore(t, rdb, 200*time.Millisecond)
			now := serverMs(t, rdb)
			d1, d2 := now-1000, now+3_600_000
			e1 := schedule(t, st, "m", d1)
			c := mustClaim(t, st, 10)
			if !slices.Contains(c.entries, e1) {
				t.Fatalf("first claim %v", c.entries)
			}
			schedule(t, st, "m", d2) // a second, separate scheduling
			if path == "release" {
				if _, err := st.release(ctx, 0, c.deadline, c.entries); err != nil {
					t.Fatal(err)
				}
			} // reap: the lease simply runs out
			eventuallyClaimed(t, st, e1)
			if s, err := rdb.ZScore(ctx, st.keys.Pending(0), "m").Result(); err != nil || int64(s) != d2 {
				t.Fatalf("the later scheduling: score %v, %v; want %d", s, err, d2)
			}
		})
	}
}

// Finding 6: an instance whose lease ran out, and whose task another
// instance took over, must not shorten or release the new holder's lease.
func TestStaleHolderCannotTouchNewLease(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	a := newStore(t, rdb, 100*time.Millisecond)
	b := &store{rdb: rdb, keys: a.keys, lease: 30 * time.Second, retryMin: 50 * time.Millisecond,
		retryMax: time.Second, maxAttempts: 3, instance: "b"}
	e := schedule(t, a, "m", serverMs(t, rdb)-1000)
	ca := mustClaim(t, a, 10)
	time.Sleep(150 * time.Millisecond)
	cb, err := b.claim(ctx, 0, 10)
	if err != nil || !slices.Contains(cb.entries, e) {
		t.Fatalf("b's claim: %v %v", cb.entries, err)
	}
	held := rdb.ZScore(ctx, a.keys.Inflight(0), e).Val()
	if retried, _, err := a.fail(ctx, 0, ca.deadline, []outcome{{e, "retry", "late nack"}}); err != nil || retried != 0 {
		t.Fatalf("stale fail: retried %d, %v", retried, err)
	}
	if n, err := a.release(ctx, 0, ca.deadline, ca.entries); err != nil || n != 0 {
		t.Fatalf("stale release: %d, %v", n, err)
	}
	if _, _, err := a.fail(ctx, 0, ca.deadline, []outcome{{e, "dead", "late refusal"}}); err != nil {
		t.Fatal(err)
	}
	if s, err := rdb.ZScore(ctx, a.keys.Inflight(0), e).Result(); err != nil || s != held {
		t.Fatalf("b's lease changed from %v to %v (%v) by a stale writer", held, s, err)
	}
	if n := rdb.HLen(ctx, a.keys.Attempts(0)).Val(); n != 0 {
		t.Fatalf("stale fails counted %d attempts", n)
	}
}

// Finding 7: go-redis runs a script again when the reply was lost; the
// second run must change nothing more than the first did.
func TestRerunScriptsAreIdempotent(t *testing.T) {
	ctx := context.Background()
	t.Run("fail counts one attempt", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 30*time.Second)
		e := schedule(t, st, "m", serverMs(t, rdb)-1000)
		c := mustClaim(t, st, 10)
		for run := 0; run < 2; run++ {
			if _, _, err := st.fail(ctx, 0, c.deadline, []outcome{{e, "poison", "refused"}}); err != nil {
				t.Fatal(err)
			}
		}
		if n := rdb.HGet(ctx, st.keys.Attempts(0), e).Val(); n != "1" {
			t.Fatalf("attempts after one failure run twice: %q, want 1", n)
		}
	})
	t.Run("claim returns the same batch", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 30*time.Second)
		now := serverMs(t, rdb)
		for i, m := range []string{"a", "b", "c"} {
			schedule(t, st, m, now-1000+int64(i))
		}
		first, err := st.claimAs(ctx, 0, 2, "t1")
		if err != nil {
			t.Fatal(err)
		}
		again, err := st.claimAs(ctx, 0, 2, "t1")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(first.entries, again.entries) || first.deadline != again.deadline {
			t.Fatalf("claim run again returned %v (deadline %d), first run %v (deadline %d)",
				again.entries, again.deadline, first.entries, first.deadline)
		}
		next, err := st.claimAs(ctx, 0, 2, "t2")
		if err != nil || len(next.entries) != 1 || next.entries[0] != EntryOf([]byte("c"), now-998) {
			t.Fatalf("a new claim: %v, %v", next.entries, err)
		}
	})
}

// Finding 8: no attempts field outlives its entry, and a member that dies
// twice keeps both records.
func TestNoLeaksNorOverwrites(t *testing.T) {
	ctx := context.Background()
	t.Run("release then cancel", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 30*time.Second)
		e := schedule(t, st, "m", serverMs(t, rdb)-1000)
		c := mustClaim(t, st, 10)
		if _, _, err := st.fail(ctx, 0, c.deadline, []outcome{{e, "retry", "nack"}}); err != nil {
			t.Fatal(err)
		}
		c = mustClaim(t, st, 10) // let the backoff pass, then re-lease
		for end := time.Now().Add(3 * time.Second); len(c.entries) == 0 && time.Now().Before(end); {
			time.Sleep(20 * time.Millisecond)
			c = mustClaim(t, st, 10)
		}
		if _, err := st.release(ctx, 0, c.deadline, c.entries); err != nil {
			t.Fatal(err)
		}
		rdb.ZRem(ctx, st.keys.Pending(0), "m") // the producer cancels
		inflight := rdb.ZRange(ctx, st.keys.Inflight(0), 0, -1).Val()
		for _, f := range rdb.HKeys(ctx, st.keys.Attempts(0)).Val() {
			if !slices.Contains(inflight, f) {
				t.Fatalf("attempts field %q belongs to no in-flight entry (in flight: %v)", f, inflight)
			}
		}
	})
	t.Run("two deaths of one member", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 30*time.Second)
		now := serverMs(t, rdb)
		for n, due := range []int64{now - 2000, now - 1000} {
			e := schedule(t, st, "m", due)
			c := mustClaim(t, st, 10)
			if _, dead, err := st.fail(ctx, 0, c.deadline, []outcome{{e, "dead", "reason " + string(rune('1'+n))}}); err != nil || dead != 1 {
				t.Fatalf("death %d: %d, %v", n+1, dead, err)
			}
		}
		if n := rdb.ZCard(ctx, st.keys.Dead(0)).Val(); n != 2 {
			t.Fatalf("dead set holds %d records for two deaths: %v", n, rdb.ZRangeWithScores(ctx, st.keys.Dead(0), 0, -1).Val())
		}
		reasons := rdb.HVals(ctx, st.keys.DeadReason(0)).Val()
		slices.Sort(reasons)
		if len(reasons) != 2 || reasons[0] != "reason 1 (after 1 attempts)" || reasons[1] != "reason 2 (after 1 attempts)" {
			t.Fatalf("reasons %q", reasons)
		}
	})
}

// Finding 7: one failed command in a claim pipeline must not discard the
// claims that succeeded (they would sit unseen in flight until their
// lease ran out). Here the ACL refuses shard 1's keys only.
func TestClaimKeepsShardsThatSucceeded(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{Users: []string{"user app on >pw ~p:{q:0}* &* +@all"}})
	admin := srv.Client()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "app", Password: "pw"})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	s := New(rdb, nil, Options{Queue: "q", Shards: 2, KeyPrefix: "p", BatchSize: 10, Pipeline: 2,
		PollInterval: 50 * time.Millisecond, Lease: 30 * time.Second, MaxAttempts: 3,
		RetryMin: time.Second, RetryMax: time.Second})
	now := serverMs(t, admin)
	admin.ZAdd(ctx, s.keys.Pending(0), redis.Z{Score: float64(now - 1000), Member: "m0"})
	admin.ZAdd(ctx, s.keys.Pending(1), redis.Z{Score: float64(now - 1000), Member: "m1"})

	batches, _, err := s.claim(ctx, []int{1, 0})
	if !redis.HasErrorPrefix(err, "NOPERM") {
		t.Fatalf("claim error %v, want the NOPERM of shard 1", err)
	}
	if len(batches) != 1 || batches[0].shard != 0 || len(batches[0].tasks) != 1 || string(batches[0].tasks[0].Member) != "m0" {
		t.Fatalf("batches %+v: shard 0's claim was discarded although it is in flight (%v)",
			batches, admin.ZRange(ctx, s.keys.Inflight(0), 0, -1).Val())
	}
}

// Found by the model test: lease deadlines are the fence, so two claims
// of a shard must never share one (two claims in the same ms did, as did
// claims by instances with different leases).
func TestLeaseDeadlinesAreUnique(t *testing.T) {
	rdb := testenv.Redis(t)
	a := newStore(t, rdb, 30*time.Second)
	b := &store{rdb: rdb, keys: a.keys, lease: 30 * time.Second, instance: "b"}
	now := serverMs(t, rdb)
	for i := 0; i < 400; i++ {
		schedule(t, a, "m"+strconv.Itoa(i), now-1000)
	}
	seen := map[int64]int{}
	for n := 0; n < 200; n++ {
		st := []*store{a, b}[n%2]
		c, err := st.claim(context.Background(), 0, 2)
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := seen[c.deadline]; dup {
			t.Fatalf("claims %d and %d share the lease deadline %d", prev, n, c.deadline)
		}
		seen[c.deadline] = n
	}
	// A shorter lease claimed later must not land on an earlier deadline.
	short := &store{rdb: rdb, keys: a.keys, lease: time.Second, instance: "short"}
	schedule(t, a, "late", serverMs(t, rdb)-1000)
	c, err := short.claim(context.Background(), 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, dup := seen[c.deadline]; dup {
		t.Fatalf("a 1s lease got deadline %d of an earlier 30s claim", c.deadline)
	}
}

// Found by the model test: a producer's ZADD of the member and due time of
// a scheduling in flight is the same scheduling (the same message_id); it
// must not take the entry from its holder, nor be handed out twice.
func TestSameSchedulingWhileInFlight(t *testing.T) {
	ctx := context.Background()
	t.Run("live lease", func(t *testing.T) {
		rdb := testenv.Redis(t)
		a := newStore(t, rdb, 30*time.Second)
		b := &store{rdb: rdb, keys: a.keys, lease: 30 * time.Second, instance: "b"}
		due := serverMs(t, rdb) - 1000
		e := schedule(t, a, "m", due)
		ca := mustClaim(t, a, 10)
		schedule(t, a, "m", due) // the producer schedules it again, same due
		cb, err := b.claim(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(cb.entries, e) {
			t.Fatalf("b took %s, which a holds", e)
		}
		if s := rdb.ZScore(ctx, a.keys.Inflight(0), e).Val(); int64(s) != ca.deadline {
			t.Fatalf("a's lease %d became %v", ca.deadline, s)
		}
		if rdb.ZCard(ctx, a.keys.Pending(0)).Val() != 0 {
			t.Fatal("the same scheduling stayed pending as well")
		}
	})
	t.Run("expired lease", func(t *testing.T) {
		rdb := testenv.Redis(t)
		st := newStore(t, rdb, 30*time.Second)
		now := serverMs(t, rdb)
		e := EntryOf([]byte("m"), now-1000)
		rdb.ZAdd(ctx, st.keys.Inflight(0), redis.Z{Score: float64(now - 5), Member: e})
		schedule(t, st, "m", now-1000)
		c := mustClaim(t, st, 10)
		if len(c.entries) != 1 || c.entries[0] != e {
			t.Fatalf("claimed %q, want %s once", c.entries, e)
		}
	})
}

// Found by the model test: a retry's backoff lease must never equal a
// claim's lease deadline, or a stale re-run of that claim's fail counts
// an attempt on an entry it no longer holds (here: C's retry lease lands
// on B's old deadline, then B's go-redis retry of its fail runs).
func TestRetryLeaseNeverMatchesAFence(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	k := newStore(t, rdb, time.Second).keys
	for try := 0; try < 30; try++ {
		m := "poison-" + strconv.Itoa(try)
		schedule(t, &store{rdb: rdb, keys: k}, m, serverMs(t, rdb)-100)
		b := &store{rdb: rdb, keys: k, lease: 2 * time.Second, retryMin: 10 * time.Millisecond, retryMax: 10 * time.Millisecond, maxAttempts: 3, instance: "B"}
		cb, err := b.claim(ctx, 0, 1)
		if err != nil || len(cb.entries) != 1 {
			t.Fatal(cb, err)
		}
		f := []outcome{{cb.entries[0], "poison", "refused"}}
		if _, _, err := b.fail(ctx, 0, cb.deadline, f); err != nil { // its reply is lost
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		c := &store{rdb: rdb, keys: k, lease: 100 * time.Millisecond, maxAttempts: 3, instance: "C"}
		cc, err := c.claim(ctx, 0, 1)
		if err != nil || len(cc.entries) != 1 {
			t.Fatal(cc, err)
		}
		backoff := time.Duration(cb.deadline-serverMs(t, rdb)) * time.Millisecond
		c.retryMin, c.retryMax = backoff, backoff
		if _, _, err := c.fail(ctx, 0, cc.deadline, f); err != nil {
			t.Fatal(err)
		}
		if retried, dead, err := b.fail(ctx, 0, cb.deadline, f); err != nil || retried+dead != 0 {
			t.Fatalf("try %d: B's stale fail run again acted on %s (retried %d, dead %d, %v): attempts %s",
				try, cb.entries[0], retried, dead, err, rdb.HGet(ctx, k.Attempts(0), cb.entries[0]).Val())
		}
		rdb.ZRem(ctx, k.Inflight(0), cb.entries[0])
		rdb.HDel(ctx, k.Attempts(0), cb.entries[0])
	}
}
