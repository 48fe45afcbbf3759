package scanner

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

func serverMs(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMilli()
}

func setup(t *testing.T) (*redis.Client, shard.Keys, []string) {
	rdb := testenv.Redis(t)
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	testenv.CleanRedis(t, rdb, k.Prefix)
	return rdb, k, claimKeysOf(k, 0)
}

// claimKeysOf is the claim script's keys for shard i (as store.claimKeys).
func claimKeysOf(k shard.Keys, i int) []string {
	return []string{k.Pending(i), k.Inflight(i), k.Attempts(i), k.LastClaim(i), k.Paused(i),
		k.Tasks(i), k.Props(i), k.ClaimedBody(i), k.ClaimedProps(i)}
}

// entriesOf is the entries a claim returned (each comes with its body
// and properties).
func entriesOf(v []any) []any {
	var out []any
	for n := 5; n < len(v); n += 3 {
		out = append(out, v[n])
	}
	return out
}

var claimTokens atomic.Int64

func claim(t *testing.T, rdb *redis.Client, keys []string, limit int, leaseMs int64) []any {
	t.Helper()
	v, err := claimScript.Run(context.Background(), rdb, keys, limit, leaseMs, claimTokens.Add(1)).Slice()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestClaimTakesOnlyDueTasksByServerClock(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	rdb.ZAdd(ctx, k.Pending(0),
		redis.Z{Score: float64(now - 1000), Member: "old"},
		redis.Z{Score: float64(now - 10), Member: "recent"},
		redis.Z{Score: float64(now + 60000), Member: "future"})

	v := claim(t, rdb, keys, 10, 30000)
	scriptNow := v[0].(int64) / 1000 // µs
	if scriptNow < now || scriptNow > now+5000 {
		t.Fatalf("script clock %d, server clock %d", scriptNow, now)
	}
	entries := entriesOf(v)
	want := []string{EntryOf([]byte("old"), now-1000), EntryOf([]byte("recent"), now-10)}
	if len(entries) != 2 || entries[0] != want[0] || entries[1] != want[1] {
		t.Fatalf("claimed %v, want %v (oldest first)", entries, want)
	}
	if next, _ := parseScore(v[1]); next != now+60000 {
		t.Fatalf("next pending %v, want %d", v[1], now+60000)
	}
	if pending := rdb.ZRange(ctx, k.Pending(0), 0, -1).Val(); len(pending) != 1 || pending[0] != "future" {
		t.Fatalf("pending after claim: %v", pending)
	}
	lease := rdb.ZRangeWithScores(ctx, k.Inflight(0), 0, -1).Val()
	if len(lease) != 2 {
		t.Fatalf("in flight: %v", lease)
	}
	for _, z := range lease {
		if d := int64(z.Score) - scriptNow; d != 30000 {
			t.Fatalf("lease deadline %v is now+%d, want now+30000", z, d)
		}
	}
	if next, _ := parseScore(v[2]); next != scriptNow+30000 {
		t.Fatalf("next lease %v", v[2])
	}
}

func TestClaimIsBoundedAndOldestFirst(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	for i := 0; i < 25; i++ {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1000 + int64(i)), Member: string(rune('a' + i))})
	}
	var got []any
	for n := 0; n < 3; n++ {
		v := claim(t, rdb, keys, 10, 30000)
		got = append(got, entriesOf(v)...)
		if want := []int{10, 10, 5}[n]; len(entriesOf(v)) != want {
			t.Fatalf("claim %d took %d, want %d", n, len(entriesOf(v)), want)
		}
	}
	for i, e := range got {
		task, err := ParseEntry(e.(string))
		if err != nil || task.DueMs != now-1000+int64(i) {
			t.Fatalf("entry %d = %v (%v): not in due order", i, e, err)
		}
	}
}

func TestClaimReapsExpiredLeasesKeepingDueTime(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	// An instance died holding these: one lease expired, one still live.
	rdb.ZAdd(ctx, k.Inflight(0),
		redis.Z{Score: float64(now - 5), Member: EntryOf([]byte("dead-instance"), now-40000)},
		redis.Z{Score: float64(now + 20000), Member: EntryOf([]byte("live-instance"), now-10000)})
	v := claim(t, rdb, keys, 10, 30000)
	if v[3].(int64) != 1 {
		t.Fatalf("reaped %v, want 1", v[3])
	}
	entries := entriesOf(v)
	if len(entries) != 1 || entries[0] != EntryOf([]byte("dead-instance"), now-40000) {
		t.Fatalf("claimed %v: the reaped task must go out again with its original due time", entries)
	}
	if s := rdb.ZScore(ctx, k.Inflight(0), EntryOf([]byte("live-instance"), now-10000)); s.Err() != nil {
		t.Fatalf("a live lease was touched: %v", s.Err())
	}
}

func TestClaimOddMembersAndScores(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	members := map[string]float64{
		"":                 float64(now - 3),
		"a:b:c":            float64(now - 2),
		"\x00\xff\n{bin}:": float64(now-1) + 0.75, // fractional score: due is its integer part
	}
	for m, s := range members {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: s, Member: m})
	}
	v := claim(t, rdb, keys, 10, 30000)
	got := map[string]int64{}
	for _, e := range entriesOf(v) {
		task, err := ParseEntry(e.(string))
		if err != nil {
			t.Fatal(err)
		}
		got[string(task.Member)] = task.DueMs
	}
	for m, s := range members {
		if got[m] != int64(s) {
			t.Fatalf("member %q: due %d, want %d (all: %v)", m, got[m], int64(s), got)
		}
	}
}

// fail runs the fail script as the holder of the entry's current lease.
func fail(t *testing.T, rdb *redis.Client, k shard.Keys, maxAttempts int, triples ...string) []int64 {
	t.Helper()
	held := rdb.ZScore(context.Background(), k.Inflight(0), triples[0]).Val()
	args := []any{1000, 8000, maxAttempts, held}
	for _, s := range triples {
		args = append(args, s)
	}
	res, err := failScript.Run(context.Background(), rdb,
		[]string{k.Inflight(0), k.Attempts(0), k.Dead(0), k.DeadReason(0), k.Retrying(0)}, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestFailRetriesWithBackoffThenDeadLetters(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	e := EntryOf([]byte("poison"), now-100)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now + 30000), Member: e})

	for attempt, wantBackoff := range []int64{1000, 2000} {
		before := serverMs(t, rdb)
		if res := fail(t, rdb, k, 3, e, "poison", "too big"); res[0] != 1 || res[1] != 0 {
			t.Fatalf("attempt %d: %v", attempt+1, res)
		}
		d := int64(rdb.ZScore(ctx, k.Inflight(0), e).Val()) - before
		if d < wantBackoff || d > wantBackoff+1000 {
			t.Fatalf("attempt %d: lease pushed %dms, want about %d", attempt+1, d, wantBackoff)
		}
	}
	if res := fail(t, rdb, k, 3, e, "poison", "too big"); res[1] != 1 {
		t.Fatalf("third attempt not dead-lettered: %v", res)
	}
	if rdb.ZScore(ctx, k.Dead(0), e).Val() != float64(now-100) {
		t.Fatalf("dead set: %v", rdb.ZRangeWithScores(ctx, k.Dead(0), 0, -1).Val())
	}
	if r := rdb.HGet(ctx, k.DeadReason(0), e).Val(); r != "too big (after 3 attempts)" {
		t.Fatalf("reason %q", r)
	}
	if rdb.Exists(ctx, k.Inflight(0), k.Attempts(0), k.Retrying(0)).Val() != 0 {
		t.Fatal("dead-lettered task left in flight, attempts or the retrying index behind")
	}
}

// The retrying index holds exactly the in-flight entries with a failed
// publish, scored by due time: a retry adds the entry, an ack removes it
// (an ack of entries that never failed leaves it alone), and stale entries
// that an older version's ack left behind are trimmed by the next fail.
func TestRetryingIndexFollowsTheAttempts(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	st := &store{rdb: rdb, keys: k}
	now := serverMs(t, rdb)
	a, b, ok := EntryOf([]byte("a"), now-5000), EntryOf([]byte("b"), now-100), EntryOf([]byte("ok"), now)
	for _, e := range []string{a, b, ok} {
		rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now + 30000), Member: e})
	}
	fail(t, rdb, k, 5, a, "retry", "no route")
	fail(t, rdb, k, 5, b, "poison", "refused")
	got := rdb.ZRangeWithScores(ctx, k.Retrying(0), 0, -1).Val()
	if len(got) != 2 || got[0].Member != a || int64(got[0].Score) != now-5000 || got[1].Member != b || int64(got[1].Score) != now-100 {
		t.Fatalf("retrying index %v, want a then b by due time", got)
	}
	if _, err := st.ack(ctx, 0, []string{ok}); err != nil {
		t.Fatal(err)
	}
	if n := rdb.ZCard(ctx, k.Retrying(0)).Val(); n != 2 {
		t.Fatalf("an ack of a task that never failed changed the index: %d left", n)
	}
	if _, err := st.ack(ctx, 0, []string{a}); err != nil {
		t.Fatal(err)
	}
	if got := rdb.ZRange(ctx, k.Retrying(0), 0, -1).Val(); len(got) != 1 || got[0] != b {
		t.Fatalf("after acking a: %v, want b", got)
	}
	// An older version acks b without touching the index.
	rdb.ZRem(ctx, k.Inflight(0), b)
	rdb.HDel(ctx, k.Attempts(0), b)
	c := EntryOf([]byte("c"), now)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now + 30000), Member: c})
	fail(t, rdb, k, 5, c, "retry", "nack")
	if got := rdb.ZRange(ctx, k.Retrying(0), 0, -1).Val(); len(got) != 1 || got[0] != c {
		t.Fatalf("after a fail behind a stale entry: %v, want only c", got)
	}
}

func TestFailRetryModeNeverDeadLettersAndBackoffIsCapped(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	e := EntryOf([]byte("unroutable"), now)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now + 30000), Member: e})
	for i := 0; i < 10; i++ {
		fail(t, rdb, k, 2, e, "retry", "no route")
	}
	if d := int64(rdb.ZScore(ctx, k.Inflight(0), e).Val()) - serverMs(t, rdb); d > 8000 {
		t.Fatalf("backoff %dms exceeds the 8000ms cap", d)
	}
	if rdb.Exists(ctx, k.Dead(0)).Val() != 0 {
		t.Fatal("retry mode dead-lettered")
	}
	// Dead mode goes at once; an entry no longer in flight is skipped.
	if res := fail(t, rdb, k, 5, e, "dead", "oversize", "1:gone", "dead", "x"); res[1] != 1 {
		t.Fatalf("%v", res)
	}
}

func TestReleaseHandsBackAtOnce(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	e := EntryOf([]byte("m1"), 1234)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: 1e13, Member: e})
	n, err := releaseScript.Run(ctx, rdb, []string{k.Inflight(0)}, int64(1e13), e, "99:absent").Int()
	if err != nil || n != 1 {
		t.Fatalf("released %d, %v", n, err)
	}
	if s, err := rdb.ZScore(ctx, k.Inflight(0), e).Result(); err != nil || s != 0 {
		t.Fatalf("released entry: lease %v, %v; want 0, still in flight", s, err)
	}
	if rdb.Exists(ctx, k.Pending(0)).Val() != 0 {
		t.Fatal("release wrote to pending")
	}
	v := claim(t, rdb, keys, 10, 30000)
	if v[3].(int64) != 0 || len(v) != 8 || v[5] != e {
		t.Fatalf("claim after release: %v; want the entry back, not counted as reaped", v)
	}
}

func TestPeekChangesNothing(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 5), Member: "due"})
	v, err := claimScript.Run(ctx, rdb, claimKeysOf(k, 0), 0, 30000, "t").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := parseScore(v[1]); !ok || p != now-5 || v[2] != "" {
		t.Fatalf("peek %v", v)
	}
	if rdb.ZCard(ctx, k.Pending(0)).Val() != 1 {
		t.Fatal("peek changed the shard")
	}
}

// TestClaimPausedTakesNothing: while the shard's pause flag exists a claim
// takes and reaps nothing, says so (reaped -1), and still reports when the
// shard next needs a claim; once the flag is gone it claims as usual.
func TestClaimPausedTakesNothing(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1000), Member: "a"})
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now - 1), Member: "1:expired"})
	rdb.Set(ctx, k.Paused(0), now, 0)
	v := claim(t, rdb, keys, 10, 30000)
	c, err := parseClaimed(v)
	if err != nil {
		t.Fatal(err)
	}
	if !c.paused || c.reaped != 0 || len(c.entries) != 0 || c.nextPending != strconv.FormatInt(now-1000, 10) {
		t.Fatalf("paused claim: %+v", c)
	}
	if n := rdb.ZCard(ctx, k.Pending(0)).Val(); n != 1 {
		t.Errorf("paused claim changed pending: %d left", n)
	}
	if s := rdb.ZScore(ctx, k.Inflight(0), "1:expired").Val(); s != float64(now-1) {
		t.Errorf("paused claim re-leased an expired entry: score %v", s)
	}
	rdb.Del(ctx, k.Paused(0))
	c, _ = parseClaimed(claim(t, rdb, keys, 10, 30000))
	if c.paused || len(c.entries) != 2 {
		t.Errorf("claim after resume: %+v, want both tasks", c)
	}
}

// A stopping instance puts the tasks it claimed ahead back into pending,
// where they can be cancelled again, unless their member is pending again
// (a later scheduling it must not overwrite) or they failed before, or
// another instance holds them now: those are released or left alone.
func TestUnclaimPutsHeldTasksBack(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	st := &store{rdb: rdb, keys: k, lease: 30 * time.Second, ahead: 10 * time.Second, instance: "t"}
	now := serverMs(t, rdb)
	for _, m := range []string{"a", "b", "c", "d"} {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now + 5000), Member: m})
	}
	c, err := st.claim(ctx, 0, 10)
	if err != nil || len(c.entries) != 4 {
		t.Fatalf("claim ahead: %v %v", c.entries, err)
	}
	entry := func(m string) string { return EntryOf([]byte(m), now+5000) }
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now + 9000), Member: "b"}) // scheduled anew
	rdb.HSet(ctx, k.Attempts(0), entry("c"), 1)                                   // failed before
	other := float64(c.deadline + 7)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: other, Member: entry("d")}) // another instance's now

	back, released, err := st.unclaim(ctx, 0, c.deadline, c.entries)
	if err != nil || back != 1 || released != 2 {
		t.Fatalf("unclaim: back %d released %d err %v, want 1, 2", back, released, err)
	}
	if s, err := rdb.ZScore(ctx, k.Pending(0), "a").Result(); err != nil || int64(s) != now+5000 {
		t.Errorf("a in pending with score %v (%v), want its due time %d", s, err, now+5000)
	}
	if s := rdb.ZScore(ctx, k.Pending(0), "b").Val(); int64(s) != now+9000 {
		t.Errorf("b's new scheduling overwritten: %v", s)
	}
	for e, want := range map[string]float64{entry("b"): 0, entry("c"): 0, entry("d"): other} {
		if s, err := rdb.ZScore(ctx, k.Inflight(0), e).Result(); err != nil || s != want {
			t.Errorf("in flight %q: %v (%v), want %v", e, s, err, want)
		}
	}
	if n := rdb.ZScore(ctx, k.Inflight(0), entry("a")).Err(); n != redis.Nil {
		t.Errorf("a still in flight: %v", n)
	}
	// A wrong-type key changes nothing.
	rdb.Del(ctx, k.Attempts(0))
	rdb.Set(ctx, k.Attempts(0), "x", 0)
	if _, _, err := st.unclaim(ctx, 0, c.deadline, []string{entry("b")}); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("wrong-type attempts key: %v, want WRONGTYPE", err)
	}
}

// TestClaimStopsAtItsByteBudget: big bodies end a claim at the byte budget
// (one task at least), in due order, and the next pending task says the
// shard has more due; small ones fill the batch whatever their number.
func TestClaimStopsAtItsByteBudget(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	big := strings.Repeat("x", 300<<10)
	for i := 0; i < 10; i++ {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1000 + int64(i)), Member: strconv.Itoa(i) + big})
	}
	run := func(limit, budget int) []any {
		t.Helper()
		v, err := claimScript.Run(ctx, rdb, keys, limit, 30000, claimTokens.Add(1), 0, budget).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// 1 MiB: the fourth body of 300 KiB crosses it.
	v := run(10, 1<<20)
	if len(entriesOf(v)) != 4 {
		t.Fatalf("claimed %d bodies of 300 KiB with a budget of 1 MiB, want 4", len(entriesOf(v)))
	}
	for i, e := range entriesOf(v) {
		task, err := ParseEntry(e.(string))
		if err != nil || task.DueMs != now-1000+int64(i) {
			t.Fatalf("entry %d due %d (%v): not in due order", i, task.DueMs, err)
		}
	}
	if next, _ := parseScore(v[1]); next != now-1000+4 {
		t.Fatalf("next pending %v, want the fifth task's due time %d", v[1], now-1000+4)
	}
	// Bodies of 2 MiB: the first read weighs one and stops, however big
	// the batch; before, a first read of 32 copied 64 MiB into Lua.
	rdb.Del(ctx, k.Pending(0))
	huge := strings.Repeat("y", 2<<20)
	for i := 0; i < 40; i++ {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1000 + int64(i)), Member: strconv.Itoa(i) + huge})
	}
	memBefore := luaMemory(t, rdb)
	if v := run(500, 1<<20); len(entriesOf(v)) != 1 {
		t.Fatalf("claimed %d bodies of 2 MiB with a budget of 1 MiB, want 1", len(entriesOf(v)))
	}
	if grew := luaMemory(t, rdb) - memBefore; grew > 16<<20 {
		t.Fatalf("the claim of one 2 MiB body grew Lua's memory by %d bytes: it copied more bodies than it took", grew)
	}
	rdb.Del(ctx, k.Pending(0), k.Inflight(0))
	for i := 0; i < 10; i++ {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1000 + int64(i)), Member: strconv.Itoa(i) + big})
	}
	// A budget below one body still takes one.
	if v := run(10, 1000); len(entriesOf(v)) != 1 {
		t.Fatalf("claimed %d with a budget below one body, want 1", len(entriesOf(v)))
	}
	// Small bodies: the whole batch, in two reads.
	rdb.Del(ctx, k.Pending(0))
	for i := 0; i < 700; i++ {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1000), Member: strconv.Itoa(i)})
	}
	if v := run(500, 1<<20); len(entriesOf(v)) != 500 {
		t.Fatalf("claimed %d small tasks, want the batch of 500", len(entriesOf(v)))
	}
	if n := rdb.ZCard(ctx, k.Pending(0)).Val(); n != 200 {
		t.Fatalf("%d pending after a claim of 500 of 700", n)
	}
}

// luaMemory is the Lua VM's memory (INFO memory used_memory_lua): a claim
// that copies 32 bodies of 2 MiB grows it by some 64 MiB until Lua's
// garbage collector runs.
func luaMemory(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory_lua:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("INFO memory has no used_memory_lua")
	return 0
}
