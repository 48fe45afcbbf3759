package scanner

import (
	"context"
	"fmt"
	"maps"
	"slices"
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
		k.Tasks(i), k.Props(i), k.ClaimedBody(i), k.ClaimedProps(i), k.Dead(i), k.DeadReason(i)}
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

// ---- tasks with an id ----

// triple is one task a claim handed out: entry, body and properties as
// the script returned them (nil: none).
type triple struct {
	entry       string
	body, props any
}

func triplesOf(t *testing.T, v []any) []triple {
	t.Helper()
	if (len(v)-5)%3 != 0 {
		t.Fatalf("claim returned %d values after 5, want triples: %q", len(v)-5, v)
	}
	var out []triple
	for n := 5; n < len(v); n += 3 {
		out = append(out, triple{v[n].(string), v[n+1], v[n+2]})
	}
	return out
}

func wantTriples(t *testing.T, what string, got, want []triple) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tasks %q, want %q", what, len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: task %d is %q, want %q", what, i, got[i], want[i])
		}
	}
}

// wantHash checks a hash's fields exactly (want nil or empty: the key is absent).
func wantHash(t *testing.T, rdb *redis.Client, key string, want map[string]string) {
	t.Helper()
	got, err := rdb.HGetAll(context.Background(), key).Result()
	if err != nil {
		t.Fatalf("HGETALL %s: %v", key, err)
	}
	if len(got) != len(want) {
		t.Fatalf("%s holds %q, want %q", key, got, want)
	}
	for f, v := range want {
		if got[f] != v {
			t.Fatalf("%s holds %q, want %q", key, got, want)
		}
	}
}

// scheduleID is a producer's schedule of an id as the contract has it:
// MULTI, HSET :tasks, HSET :props (HDEL if props is empty), ZADD, EXEC.
func scheduleID(t *testing.T, rdb *redis.Client, k shard.Keys, i int, id, body, props string, due int64) {
	t.Helper()
	ctx := context.Background()
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k.Tasks(i), id, body)
		if props != "" {
			p.HSet(ctx, k.Props(i), id, props)
		} else {
			p.HDel(ctx, k.Props(i), id)
		}
		p.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(due), Member: id})
		return nil
	})
	if err != nil {
		t.Fatalf("schedule %q: %v", id, err)
	}
}

// TestClaimMovesBodiesAndPropsOfIDs: the claim returns each task's body
// and properties as the 2nd and 3rd element of its triple (nil for a
// plain member, which is its own body), moves them under the entry in
// claimed:body/claimed:props and out of :tasks/:props; a claim run again
// with its token and a claim re-leasing the entries return them as they
// were claimed; an ack deletes them.
func TestClaimMovesBodiesAndPropsOfIDs(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	scheduleID(t, rdb, k, 0, "id-a", "body of a", `{"type":"a"}`, now-30)
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 20), Member: "plain"})
	rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 10), Member: "props-only"})
	rdb.HSet(ctx, k.Props(0), "props-only", `{"priority":3}`)
	scheduleID(t, rdb, k, 0, "id-b", "", "", now-5) // an empty body is a body
	scheduleID(t, rdb, k, 0, "later", "body of later", `{"type":"later"}`, now+60000)
	e := func(m string, due int64) string { return EntryOf([]byte(m), due) }
	want := []triple{
		{e("id-a", now-30), "body of a", `{"type":"a"}`},
		{e("plain", now-20), nil, nil},
		{e("props-only", now-10), nil, `{"priority":3}`},
		{e("id-b", now-5), "", nil},
	}
	run := func(token string) []any {
		t.Helper()
		v, err := claimScript.Run(ctx, rdb, keys, 10, 30000, token).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	wantTriples(t, "claim", triplesOf(t, run("tok-1")), want)
	wantHash(t, rdb, k.Tasks(0), map[string]string{"later": "body of later"})
	wantHash(t, rdb, k.Props(0), map[string]string{"later": `{"type":"later"}`})
	wantHash(t, rdb, k.ClaimedBody(0), map[string]string{want[0].entry: "body of a", want[3].entry: ""})
	wantHash(t, rdb, k.ClaimedProps(0), map[string]string{want[0].entry: `{"type":"a"}`, want[2].entry: `{"priority":3}`})
	// The same claim run again (a lost reply) gets its batch with the same bodies.
	wantTriples(t, "claim run again", triplesOf(t, run("tok-1")), want)
	// Leases run out: the next claim re-leases the entries with the bodies
	// they were claimed with (in lease order, then entry order).
	for _, w := range want {
		rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: 1, Member: w.entry})
	}
	got := triplesOf(t, run("tok-2"))
	slices.SortFunc(got, func(a, b triple) int { return strings.Compare(a.entry, b.entry) })
	sorted := slices.Clone(want)
	slices.SortFunc(sorted, func(a, b triple) int { return strings.Compare(a.entry, b.entry) })
	wantTriples(t, "re-lease", got, sorted)
	st := &store{rdb: rdb, keys: k}
	if n, err := st.ack(ctx, 0, []string{want[0].entry, want[1].entry, want[2].entry, want[3].entry}); err != nil || n != 4 {
		t.Fatalf("ack: %d, %v", n, err)
	}
	if n := rdb.Exists(ctx, k.ClaimedBody(0), k.ClaimedProps(0), k.Inflight(0)).Val(); n != 0 {
		t.Fatalf("after the ack %d of claimed:body, claimed:props, in flight are left", n)
	}
}

// TestClaimByteBudgetWeighsBodiesOfIDs: the byte budget counts the body of
// an id, not the id: big bodies under short ids stop the claim at the
// budget; short bodies under big ids do not.
func TestClaimByteBudgetWeighsBodiesOfIDs(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	big := strings.Repeat("x", 300<<10)
	for i := range 10 {
		scheduleID(t, rdb, k, 0, "id"+strconv.Itoa(i), strconv.Itoa(i)+big, "", now-1000+int64(i))
	}
	run := func() []triple {
		t.Helper()
		v, err := claimScript.Run(ctx, rdb, keys, 10, 30000, claimTokens.Add(1), 0, 1<<20).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return triplesOf(t, v)
	}
	got := run()
	if len(got) != 4 {
		t.Fatalf("claimed %d ids with bodies of 300 KiB and a budget of 1 MiB, want 4", len(got))
	}
	for i, tr := range got {
		if tr.body != strconv.Itoa(i)+big {
			t.Fatalf("task %d (%q): body of %d bytes, not its own", i, tr.entry, len(tr.body.(string)))
		}
	}
	if n := rdb.HLen(ctx, k.Tasks(0)).Val(); n != 6 {
		t.Fatalf("%d bodies left in :tasks, want the 6 not claimed", n)
	}
	rdb.Del(ctx, k.Pending(0), k.Inflight(0), k.Tasks(0), k.ClaimedBody(0))
	for i := range 10 {
		scheduleID(t, rdb, k, 0, strconv.Itoa(i)+big, "b", "", now-1000+int64(i))
	}
	if got := run(); len(got) != 10 {
		t.Fatalf("claimed %d ids of 300 KiB with 1-byte bodies and a budget of 1 MiB, want all 10: the id was weighed, not the body", len(got))
	}
}

// TestClaimSameEntryInFlightKeepsItsBody: a due pending id whose entry
// (same id, same due time) is already in flight is the same scheduling:
// the claim drops the pending copy's body and properties and the entry
// keeps the ones it was claimed with, live (not handed out) or re-leased
// by the same claim (handed out once, with its own body).
func TestClaimSameEntryInFlightKeepsItsBody(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	e := EntryOf([]byte("id"), now-100)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(now + 30000), Member: e})
	rdb.HSet(ctx, k.ClaimedBody(0), e, "first")
	rdb.HSet(ctx, k.ClaimedProps(0), e, `{"type":"first"}`)
	scheduleID(t, rdb, k, 0, "id", "second", `{"type":"second"}`, now-100)
	scheduleID(t, rdb, k, 0, "other", "o", "", now-50)
	v := claim(t, rdb, keys, 10, 30000)
	wantTriples(t, "claim", triplesOf(t, v), []triple{{EntryOf([]byte("other"), now-50), "o", nil}})
	if n := rdb.Exists(ctx, k.Pending(0), k.Tasks(0), k.Props(0)).Val(); n != 0 {
		t.Fatalf("the merged pending copy left %d of pending, :tasks, :props behind", n)
	}
	wantHash(t, rdb, k.ClaimedBody(0), map[string]string{e: "first", EntryOf([]byte("other"), now-50): "o"})
	wantHash(t, rdb, k.ClaimedProps(0), map[string]string{e: `{"type":"first"}`})
	if s := rdb.ZScore(ctx, k.Inflight(0), e).Val(); s != float64(now+30000) {
		t.Fatalf("the live entry's lease changed to %v", s)
	}
	// Expired, and scheduled again the same: re-leased and handed out once.
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: 1, Member: e})
	scheduleID(t, rdb, k, 0, "id", "third", "", now-100)
	v = claim(t, rdb, keys, 10, 30000)
	wantTriples(t, "claim of an expired entry scheduled again", triplesOf(t, v), []triple{{e, "first", `{"type":"first"}`}})
	if n := rdb.Exists(ctx, k.Pending(0), k.Tasks(0), k.Props(0)).Val(); n != 0 {
		t.Fatalf("the merged pending copy left %d of pending, :tasks, :props behind", n)
	}
	wantHash(t, rdb, k.ClaimedBody(0), map[string]string{e: "first", EntryOf([]byte("other"), now-50): "o"})
}

// snapshot is every key of the test's prefix, DUMPed.
func snapshot(t *testing.T, rdb *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	iter := rdb.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		d, err := rdb.Dump(ctx, iter.Val()).Result()
		if err != nil {
			t.Fatalf("DUMP %s: %v", iter.Val(), err)
		}
		out[iter.Val()] = d
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestClaimWrongTypeIDKeysChangeNothing: a wrong-type :tasks, :props,
// claimed:body or claimed:props key fails a claim that must read or
// write it before anything changes, whether the claim takes a due id,
// re-leases an entry of one, or both.
func TestClaimWrongTypeIDKeysChangeNothing(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	for _, c := range []struct {
		key            string
		pending, lease bool // a due id pending; an expired entry of one in flight
	}{
		{k.Tasks(0), true, false}, {k.Tasks(0), true, true},
		{k.Props(0), true, false}, {k.Props(0), true, true},
		{k.ClaimedBody(0), true, false}, {k.ClaimedBody(0), false, true}, {k.ClaimedBody(0), true, true},
		{k.ClaimedProps(0), true, false}, {k.ClaimedProps(0), false, true}, {k.ClaimedProps(0), true, true},
	} {
		testenv.CleanRedis(t, rdb, k.Prefix)
		now := serverMs(t, rdb)
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 10), Member: "plain"})
		if c.pending {
			// Where the broken key is one a producer writes, the id has
			// both a body and properties in the other.
			if c.key != k.Tasks(0) {
				rdb.HSet(ctx, k.Tasks(0), "id", "body")
			}
			if c.key != k.Props(0) {
				rdb.HSet(ctx, k.Props(0), "id", `{"type":"t"}`)
			}
			rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 20), Member: "id"})
		}
		if c.lease {
			e := EntryOf([]byte("held"), now-30)
			rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: 1, Member: e})
			for _, key := range []string{k.ClaimedBody(0), k.ClaimedProps(0)} {
				if key != c.key {
					rdb.HSet(ctx, key, e, "x")
				}
			}
		}
		rdb.Set(ctx, c.key, "someone's string", 0)
		before := snapshot(t, rdb, k.Prefix)
		_, err := claimScript.Run(ctx, rdb, keys, 10, 30000, claimTokens.Add(1)).Slice()
		if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
			t.Fatalf("claim with a wrong-type %s (due id %v, expired entry %v): %v, want WRONGTYPE", c.key, c.pending, c.lease, err)
		}
		if after := snapshot(t, rdb, k.Prefix); !maps.Equal(before, after) {
			t.Fatalf("claim with a wrong-type %s (due id %v, expired entry %v) changed keys: before %q, after %q", c.key, c.pending, c.lease, slices.Sorted(maps.Keys(before)), slices.Sorted(maps.Keys(after)))
		}
	}
}

// TestAckKeepsTheBodyOfADeadEntry: an ack of an entry that is no longer
// in flight (its batch lost the lease, the next holder dead-lettered it)
// leaves the dead entry's claimed body and properties, which the dead
// letter keeps.
func TestAckKeepsTheBodyOfADeadEntry(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	st := &store{rdb: rdb, keys: k, lease: 30 * time.Second, retryMin: time.Millisecond, retryMax: time.Millisecond, maxAttempts: 1, instance: "t"}
	now := serverMs(t, rdb)
	scheduleID(t, rdb, k, 0, "id", "body", `{"type":"t"}`, now-10)
	scheduleID(t, rdb, k, 0, "other", "other body", "", now-5)
	c, err := st.claim(ctx, 0, 10)
	if err != nil || len(c.entries) != 2 {
		t.Fatalf("claim: %q, %v", c.entries, err)
	}
	e, other := c.entries[0], c.entries[1]
	if _, dead, err := st.fail(ctx, 0, c.deadline, []outcome{{e, "dead", "deadline passed"}}); err != nil || dead != 1 {
		t.Fatalf("dead-letter: %d, %v", dead, err)
	}
	// A late ack of both by an earlier holder whose publish was confirmed.
	if n, err := st.ack(ctx, 0, []string{e, other}); err != nil || n != 1 {
		t.Fatalf("ack: %d, %v; want 1 (the dead entry is not in flight)", n, err)
	}
	wantHash(t, rdb, k.ClaimedBody(0), map[string]string{e: "body"})
	wantHash(t, rdb, k.ClaimedProps(0), map[string]string{e: `{"type":"t"}`})
}

// TestClaimWithoutIDsCostsNothingMore: on a queue without ids, properties
// or failed tasks, the claim costs the calls it did before ids, one EXISTS
// in place of the attempts hash's TYPE (and no HEXISTS of re-leased
// entries, there being no attempts), whether it takes due tasks, re-leases
// expired entries, or is run again with its token; with a failed task the
// TYPE is back. Counted on a private Redis by INFO commandstats.
func TestClaimWithoutIDsCostsNothingMore(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{})
	rdb := srv.Client()
	ctx := context.Background()
	k := shard.Keys{Prefix: "p", Queue: "q"}
	keys := claimKeysOf(k, 0)
	if err := claimScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	// calls runs f and returns the calls of each command in between (the
	// script's own, the EVALSHA, INFO and CONFIG left out).
	calls := func(f func()) map[string]int {
		t.Helper()
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		f()
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]int{}
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			name, isCmd := strings.CutPrefix(name, "cmdstat_")
			if !ok || !isCmd || name == "evalsha" || name == "info" || strings.HasPrefix(name, "config") {
				continue
			}
			v, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			out[name], _ = strconv.Atoi(v)
		}
		return out
	}
	run := func(token string) {
		t.Helper()
		if _, err := claimScript.EvalSha(ctx, rdb, keys, 10, 30000, token).Result(); err != nil {
			t.Fatal(err)
		}
	}
	now := serverMs(t, rdb)
	for i := range 3 {
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 10 + int64(i)), Member: "m" + strconv.Itoa(i)})
	}
	// The calls before ids, as counted for the script before them (the
	// same three claims); the EXISTS that finds no id and no attempts
	// replaces the TYPE of the attempts hash.
	for _, c := range []struct {
		name  string
		setup func()
		token string
		old   map[string]int
		extra map[string]int // besides the TYPE's swap
	}{
		{"due tasks", func() {}, "t1",
			map[string]int{"time": 1, "get": 2, "type": 1, "zrange": 3, "zadd": 1, "zremrangebyrank": 1, "set": 1}, nil},
		{"the same claim run again", func() {}, "t1",
			map[string]int{"time": 1, "get": 2, "type": 1, "zrangebyscore": 1, "zrange": 2}, nil},
		{"expired entries and due tasks", func() {
			for _, m := range []string{"m0", "m1", "m2"} {
				rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: 1, Member: EntryOf([]byte(m), now-10)})
			}
			rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1), Member: "m3"})
		}, "t2",
			// ZMSCORE: with something in flight, the claim reads which of
			// its entries are there already before it adds them.
			map[string]int{"time": 1, "get": 2, "type": 1, "zrange": 4, "zrangebyscore": 1, "hexists": 3,
				"zadd": 2, "zmscore": 1, "zremrangebyrank": 1, "set": 1}, map[string]int{"hexists": -3}},
		{"a failed task in the attempts hash", func() {
			rdb.HSet(ctx, k.Attempts(0), EntryOf([]byte("gone"), now), 1)
			rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(now - 1), Member: "m4"})
		}, "t3",
			// The TYPE is back, beside the EXISTS that found the hash.
			map[string]int{"time": 1, "get": 2, "type": 1, "zrange": 3, "zadd": 1, "zmscore": 1, "zremrangebyrank": 1, "set": 1},
			map[string]int{"type": 1}},
	} {
		c.setup()
		got := calls(func() { run(c.token) })
		want := maps.Clone(c.old)
		want["exists"] += want["type"]
		delete(want, "type")
		for name, n := range c.extra {
			want[name] += n
		}
		for name, n := range want {
			if n == 0 {
				delete(want, name)
			}
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: the claim's calls %v, want %v (those before ids, an EXISTS in place of the TYPE)", c.name, got, want)
		}
	}
}

// TestClaimByteBudgetWeighsProperties (review: expected to FAIL until
// fixed): the claim copies a task's properties as it copies its body,
// into claimed:props and into its reply, but the byte budget weighs the
// bodies alone. Properties of 100 KiB (still under the broker's frame_max)
// under 1-byte bodies go past the 1 MiB budget unchecked: 20 of them are
// 2 MiB in one claim, and a full batch of 1,000 would be 100 MiB, holding
// Redis as the budget exists to prevent.
func TestClaimByteBudgetWeighsProperties(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	props := `{"headers":{"h":"` + strings.Repeat("p", 100<<10) + `"}}`
	for i := range 20 {
		scheduleID(t, rdb, k, 0, "id"+strconv.Itoa(i), "b", props, now-1000+int64(i))
	}
	v, err := claimScript.Run(ctx, rdb, keys, 20, 30000, claimTokens.Add(1), 0, 1<<20).Slice()
	if err != nil {
		t.Fatal(err)
	}
	got, bytes := triplesOf(t, v), 0
	for _, tr := range got {
		bytes += len(tr.body.(string)) + len(tr.props.(string))
	}
	// The budget may be passed by the task that reaches it, no more.
	if bytes > 1<<20+len(props)+1 {
		t.Fatalf("claimed %d tasks with %d bytes of bodies and properties under a byte budget of 1 MiB", len(got), bytes)
	}
}

// TestClaimOwnEntriesNotByDeadline: an entry already in flight whose lease
// happens to equal the new claim's deadline (here forced through the
// shard's last-claim record, so that it does not hang on hitting one ms)
// is still the live holder's: the claim hands out only what it added
// itself and leaves the holder's body, properties and lease alone.
func TestClaimOwnEntriesNotByDeadline(t *testing.T) {
	rdb, k, keys := setup(t)
	ctx := context.Background()
	now := serverMs(t, rdb)
	last := now + 1_000_000_000
	rdb.Set(ctx, k.LastClaim(0), "someone "+strconv.FormatInt(last, 10), 0)
	deadline := last + 1 // the next claim's deadline: last one's + 1
	held := EntryOf([]byte("id"), now-100)
	rdb.ZAdd(ctx, k.Inflight(0), redis.Z{Score: float64(deadline), Member: held})
	rdb.HSet(ctx, k.ClaimedBody(0), held, "first")
	rdb.HSet(ctx, k.ClaimedProps(0), held, `{"type":"first"}`)
	scheduleID(t, rdb, k, 0, "id", "second", `{"type":"second"}`, now-100)
	scheduleID(t, rdb, k, 0, "other", "o", "", now-50)
	v := claim(t, rdb, keys, 10, 30000)
	if got := v[4]; got != strconv.FormatInt(deadline, 10) {
		t.Fatalf("the claim's deadline is %v, want %d (the held entry's lease)", got, deadline)
	}
	wantTriples(t, "claim", triplesOf(t, v), []triple{{EntryOf([]byte("other"), now-50), "o", nil}})
	wantHash(t, rdb, k.ClaimedBody(0), map[string]string{held: "first", EntryOf([]byte("other"), now-50): "o"})
	wantHash(t, rdb, k.ClaimedProps(0), map[string]string{held: `{"type":"first"}`})
	if n := rdb.Exists(ctx, k.Pending(0), k.Tasks(0), k.Props(0)).Val(); n != 0 {
		t.Fatalf("the merged pending copy left %d of pending, :tasks, :props behind", n)
	}
}

// TestAckShardsOneBrokenShard: one call acks several shards; a shard
// whose in-flight key is of the wrong type reports its error, and the
// shards before and after it are acked all the same, their attempts and
// claimed fields with them; a plain queue's call runs one EXISTS in all.
func TestAckShardsOneBrokenShard(t *testing.T) {
	rdb, k, _ := setup(t)
	ctx := context.Background()
	st := &store{rdb: rdb, keys: k}
	for _, i := range []int{0, 2} {
		rdb.ZAdd(ctx, k.Inflight(i), redis.Z{Score: 5, Member: "1:a"}, redis.Z{Score: 5, Member: "1:b"})
	}
	rdb.HSet(ctx, k.Attempts(0), "1:a", 2)
	rdb.ZAdd(ctx, k.Retrying(0), redis.Z{Score: 1, Member: "1:a"})
	rdb.HSet(ctx, k.ClaimedBody(2), "1:b", "body")
	rdb.Set(ctx, k.Inflight(1), "not a set", 0)
	ns, errs, err := st.ackShards(ctx, []int{0, 1, 2}, [][]string{{"1:a", "1:b"}, {"1:a"}, {"1:a", "1:b", "1:c"}})
	if err != nil {
		t.Fatal(err)
	}
	if ns[0] != 2 || errs[0] != nil || ns[2] != 2 || errs[2] != nil {
		t.Fatalf("shards 0 and 2: acked %v, errors %v; want 2 each, no error", ns, errs)
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") || !strings.Contains(errs[1].Error(), k.Inflight(1)) || !isReply(errs[1]) {
		t.Fatalf("shard 1: %v; want a WRONGTYPE reply naming %s", errs[1], k.Inflight(1))
	}
	if n := rdb.Exists(ctx, k.Inflight(0), k.Inflight(2), k.Attempts(0), k.Retrying(0), k.ClaimedBody(2)).Val(); n != 0 {
		t.Fatalf("%d of the acked shards' keys are left", n)
	}
	// A queue without ids whose tasks never failed: one EXISTS for the
	// call, one ZREM per shard (counted on a Redis of its own: the counts
	// are server-wide).
	rdb = testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	st.rdb = rdb
	for _, i := range []int{0, 1, 2} {
		rdb.ZAdd(ctx, k.Inflight(i), redis.Z{Score: 5, Member: "2:a"})
	}
	before := commandCalls(t, rdb)
	if _, errs, err := st.ackShards(ctx, []int{0, 1, 2}, [][]string{{"2:a"}, {"2:a"}, {"2:a"}}); err != nil || errs[0] != nil || errs[1] != nil || errs[2] != nil {
		t.Fatalf("plain ack: %v %v", err, errs)
	}
	got := commandCalls(t, rdb)
	for name, n := range before {
		got[name] -= n
	}
	if got["exists"] != 1 || got["zrem"] != 3 || got["hdel"] != 0 {
		t.Fatalf("plain ack of 3 shards ran %v; want 1 exists, 3 zrem, no hdel", got)
	}
}

// commandCalls is INFO commandstats' calls per command.
func commandCalls(t *testing.T, rdb *redis.Client) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, line := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _, _ := strings.Cut(rest, ",")
		out[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.Atoi(n)
	}
	return out
}

// TestClaimWritesItsOwnerRecordOnce: a claim that takes tasks under a
// liveness id writes its owner record with one ZADD, the first write, and
// prunes run-out records in one claim of 8 (by deadline); the hand-back
// then finds exactly the entries of the records still live. Counted on a
// private Redis by INFO commandstats.
func TestClaimWritesItsOwnerRecordOnce(t *testing.T) {
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	ctx := context.Background()
	k := shard.Keys{Prefix: "p", Queue: "q"}
	keys := append(claimKeysOf(k, 0), k.Owners(0))
	// An old record whose lease ran out long ago: some claim prunes it.
	rdb.ZAdd(ctx, k.Owners(0), redis.Z{Score: 1, Member: "gone 1"})
	pruned, claims := false, 0
	// Until one claim pruned: one in 8 does, and deadlines grow by one ms
	// at least per claim ((7/8)^200 that none does in 200).
	for n := 0; n < 200 && !pruned; n++ {
		claims++
		rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: 0, Member: fmt.Sprintf("m%d", n)})
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		v, err := claimScript.Run(ctx, rdb, keys, 10, 30_000, fmt.Sprintf("tok-%d", n), 0, 0, "me").Slice()
		if err != nil {
			t.Fatal(err)
		}
		got := commandCalls(t, rdb)
		deadline, _ := strconv.ParseInt(v[4].(string), 10, 64)
		if got["zadd"] != 2 { // the in-flight entry and the record
			t.Fatalf("claim %d: %d ZADDs, want 2 (in flight, owner record once)", n, got["zadd"])
		}
		if want := 0; deadline%8 == 0 {
			want = 1
			if got["zremrangebyscore"] != want {
				t.Fatalf("claim %d (deadline %d): %d prunes, want %d", n, deadline, got["zremrangebyscore"], want)
			}
			pruned = true
		} else if got["zremrangebyscore"] != want {
			t.Fatalf("claim %d (deadline %d): %d prunes, want %d", n, deadline, got["zremrangebyscore"], want)
		}
		if s, err := rdb.ZScore(ctx, k.Owners(0), fmt.Sprintf("me %d", deadline)).Result(); err != nil || int64(s) != deadline {
			t.Fatalf("claim %d: owner record %v, %v; want score %d", n, s, err, deadline)
		}
	}
	if !pruned {
		t.Fatalf("no claim of %d pruned", claims)
	}
	if n, _ := rdb.ZScore(ctx, k.Owners(0), "gone 1").Result(); n != 0 {
		t.Fatalf("the run-out record is still there")
	}
	n, err := handBackScript.Run(ctx, rdb, []string{k.Inflight(0), k.Owners(0)}, "me").Int()
	if err != nil || n != claims {
		t.Fatalf("hand-back: %d, %v; want the %d entries", n, err, claims)
	}
}

// TestSweepOfAQuietQueue: one call sweeps a queue's shards. An empty queue
// costs it three commands (EVALSHA, TIME, one EXISTS) whatever its number
// of shards; a queue with tasks gets every shard's earliest pending task
// and lease, and a shard whose key has the wrong type gets its own error
// while the others' heads stand. Counted on a private Redis.
func TestSweepOfAQuietQueue(t *testing.T) {
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	ctx := context.Background()
	k := shard.Keys{Prefix: "p", Queue: "q"}
	st := &store{rdb: rdb, keys: k}
	shards := make([]int, 16)
	for i := range shards {
		shards[i] = i
	}
	sweep := func(probe bool) []any {
		t.Helper()
		pipe := rdb.Pipeline()
		cmd := st.sweepCmd(ctx, pipe, shards, probe)
		_, _ = pipe.Exec(ctx)
		vals, err := cmd.Slice()
		if err != nil {
			t.Fatal(err)
		}
		return vals
	}
	if err := sweepScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, rdb)
	vals := sweep(true)
	got := commandCalls(t, rdb)
	total := 0
	for name, n := range got {
		if name != "info" && name != "hello" { // a connection of the pool's
			total += n - before[name]
		}
	}
	if total != 3 || got["exists"]-before["exists"] != 1 {
		t.Fatalf("sweep of an empty queue of 16 shards ran %d commands (%v before, %v after); want 3: evalsha, time, exists", total, before, got)
	}
	for at := range shards {
		if v, err := sweptShard(vals, at); err != nil || v[1] != "" || v[2] != "" {
			t.Fatalf("empty shard %d: %v, %v; want no pending task and no lease", at, v, err)
		}
	}

	rdb.ZAdd(ctx, k.Pending(3), redis.Z{Score: 1700000000123, Member: "a"}, redis.Z{Score: 1800000000000, Member: "b"})
	rdb.ZAdd(ctx, k.Inflight(3), redis.Z{Score: 42, Member: "1:c"})
	rdb.ZAdd(ctx, k.Inflight(9), redis.Z{Score: 7, Member: "1:d"})
	rdb.Set(ctx, k.Pending(5), "not a set", 0)
	// A queue with tasks, swept without the probe (as one with tasks known
	// is): no EXISTS, the same answers.
	for _, probe := range []bool{true, false} {
		before = commandCalls(t, rdb)
		vals = sweep(probe)
		if n := commandCalls(t, rdb)["exists"] - before["exists"]; n != map[bool]int{true: 1, false: 0}[probe] {
			t.Fatalf("sweep (probe %v) ran %d EXISTS", probe, n)
		}
		checkBusySweep(t, vals, shards)
	}
}

// checkBusySweep checks TestSweepOfAQuietQueue's sweep of a queue with
// tasks in shards 3 and 9 and a string at shard 5's pending key.
func checkBusySweep(t *testing.T, vals []any, shards []int) {
	t.Helper()
	for at := range shards {
		v, err := sweptShard(vals, at)
		switch at {
		case 3:
			if err != nil || v[1] != "1700000000123" || v[2] != "42" {
				t.Fatalf("shard 3: %v, %v; want pending 1700000000123, lease 42", v, err)
			}
		case 5:
			if err == nil || !isReply(err) || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Fatalf("shard 5 (a string): %v, %v; want its WRONGTYPE reply", v, err)
			}
		case 9:
			if err != nil || v[1] != "" || v[2] != "7" {
				t.Fatalf("shard 9: %v, %v; want no pending task, lease 7", v, err)
			}
		default:
			if err != nil || v[1] != "" || v[2] != "" {
				t.Fatalf("shard %d: %v, %v; want nothing", at, v, err)
			}
		}
		if err != nil {
			continue
		}
		if now, _ := v[0].(int64); now < 1e15 {
			t.Fatalf("shard %d: clock %v µs, want the server's", at, v[0])
		}
	}
}
