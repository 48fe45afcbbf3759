package recurring

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newKeys(t *testing.T, rdb *redis.Client, m int) shard.Keys {
	t.Helper()
	keys := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	testenv.CleanRedis(t, rdb, keys.Prefix)
	if err := rdb.Set(context.Background(), keys.ShardCount(), m, 0).Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestStepScript: the materialising script is a compare-and-set on the
// state, and refuses to ZADD a body that is pending (a second ZADD would
// reschedule it); run twice, as after a lost reply, it changes nothing
// the second time.
func TestStepScript(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := newKeys(t, rdb, 1)
	k := []string{keys.Pending(0), keys.RecurringState(0), keys.Tasks(0), keys.Props(0)}
	run := func(expect, next, due string) []any {
		t.Helper()
		res, err := stepScript.Run(ctx, rdb, k, "s", "body", expect, next, due, "").Slice()
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := run("", "1:1000:", "1000"); res[0] != int64(1) {
		t.Fatalf("first: %v", res)
	}
	// The same call again (go-redis retrying after a lost reply, or a
	// second instance that read the same state): the state moved on.
	if res := run("", "1:1000:", "1000"); res[0] != int64(0) || res[1] != "1:1000:" {
		t.Fatalf("again: %v", res)
	}
	// Occurrence 1000 still pending: 2000 must wait.
	if res := run("1:1000:", "1:2000:", "2000"); res[0] != int64(2) || res[1] != "1000" {
		t.Fatalf("busy: %v", res)
	}
	if sc := rdb.ZScore(ctx, k[0], "body").Val(); sc != 1000 {
		t.Fatalf("score %v: the pending occurrence was rescheduled", sc)
	}
	rdb.ZRem(ctx, k[0], "body") // claimed
	if res := run("1:1000:", "1:2000:", "2000"); res[0] != int64(1) {
		t.Fatalf("next: %v", res)
	}
	if sc := rdb.ZScore(ctx, k[0], "body").Val(); sc != 2000 {
		t.Fatalf("score %v", sc)
	}
	if v := rdb.HGet(ctx, k[1], "s").Val(); v != "1:2000:" {
		t.Fatalf("state %q", v)
	}
}

// TestRetireScript: retiring cancels the occurrence if it has not left
// pending (the floor is then 0: nothing of it was delivered), and keeps
// its due time as the floor if it has (it is delivered; a fresh start must
// come after it).
func TestRetireScript(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := newKeys(t, rdb, 1)
	k := []string{keys.Pending(0), keys.RecurringState(0), keys.Tasks(0), keys.Props(0)}
	rdb.HSet(ctx, k[1], "s", "3:5000:")
	rdb.ZAdd(ctx, k[0], redis.Z{Score: 5000, Member: "body"})
	rdb.HSet(ctx, k[3], "body", `{"type":"tick"}`) // its properties go with it
	res, err := retireScript.Run(ctx, rdb, k, "s", "body", "3:5000:", 4).Slice()
	if err != nil || res[0] != int64(1) || res[1] != int64(1) {
		t.Fatalf("retire pending: %v %v", res, err)
	}
	if rdb.Exists(ctx, k[0], k[2], k[3]).Val() != 0 || rdb.HGet(ctx, k[1], "s").Val() != "4:0:r" {
		t.Fatalf("after: pending %d, state %q", rdb.ZCard(ctx, k[0]).Val(), rdb.HGet(ctx, k[1], "s").Val())
	}
	// Claimed already; a one-off task with the same body at another score is
	// not the occurrence and stays.
	rdb.HSet(ctx, k[1], "s", "4:6000:")
	rdb.ZAdd(ctx, k[0], redis.Z{Score: 9999, Member: "body"})
	res, err = retireScript.Run(ctx, rdb, k, "s", "body", "4:6000:", 5).Slice()
	if err != nil || res[0] != int64(1) || res[1] != int64(0) {
		t.Fatalf("retire claimed: %v %v", res, err)
	}
	if rdb.ZScore(ctx, k[0], "body").Val() != 9999 || rdb.HGet(ctx, k[1], "s").Val() != "5:6000:r" {
		t.Fatal("the one-off task or the floor")
	}
	// A stale expectation changes nothing.
	if res, _ := retireScript.Run(ctx, rdb, k, "s", "body", "4:6000:", 6).Slice(); res[0] != int64(0) {
		t.Fatalf("stale: %v", res)
	}
}

// TestRetireRemovesLeftProperties: an occurrence cancelled with a bare
// ZREM (a producer of its own, not the packages' MULTI) leaves its
// properties behind; retiring the schedule removes them, or a later
// one-off task with the same body would go out with them. A pending
// member with that body keeps its own.
func TestRetireRemovesLeftProperties(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := newKeys(t, rdb, 1)
	k := []string{keys.Pending(0), keys.RecurringState(0), keys.Tasks(0), keys.Props(0)}
	rdb.HSet(ctx, k[1], "s", "3:5000:")
	rdb.HSet(ctx, k[3], "body", `{"routing_key":"cron","headers":{"src":"cron"}}`) // its ZREM left them
	res, err := retireScript.Run(ctx, rdb, k, "s", "body", "3:5000:", 4).Slice()
	if err != nil || res[0] != int64(1) || res[1] != int64(0) {
		t.Fatalf("retire: %v %v", res, err)
	}
	if n := rdb.HLen(ctx, k[3]).Val(); n != 0 {
		t.Fatalf("%d properties left in %s after the schedule's retirement", n, k[3])
	}
	// Pending at another score (a reschedule by ZADD): not removed, and
	// neither are its properties.
	rdb.HSet(ctx, k[1], "s", "4:6000:")
	rdb.ZAdd(ctx, k[0], redis.Z{Score: 9999, Member: "body"})
	rdb.HSet(ctx, k[3], "body", `{"type":"tick"}`)
	if _, err := retireScript.Run(ctx, rdb, k, "s", "body", "4:6000:", 5).Slice(); err != nil {
		t.Fatal(err)
	}
	if rdb.HGet(ctx, k[3], "body").Val() != `{"type":"tick"}` {
		t.Fatal("a pending member's properties were removed")
	}
}

// claimer stands in for the dispatchers: it takes what is due within the
// look-ahead out of pending, as the claim script does, and records each
// scheduling it took.
func claimer(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, m int, took map[string]map[int64]int, mu *sync.Mutex) {
	for ctx.Err() == nil {
		now := time.Now().Add(100 * time.Millisecond).UnixMilli()
		for i := range m {
			zs, _ := rdb.ZRangeByScoreWithScores(ctx, keys.Pending(i), &redis.ZRangeBy{Min: "-inf", Max: fmt.Sprint(now)}).Result()
			for _, z := range zs {
				if rdb.ZRem(ctx, keys.Pending(i), z.Member).Val() == 1 {
					mu.Lock()
					b := z.Member.(string)
					if took[b] == nil {
						took[b] = map[int64]int{}
					}
					took[b][int64(z.Score)]++
					mu.Unlock()
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestMaterialisersRace runs three materialisers that all think they
// sweep the queue (a stalled sweeper waking up beside its successor) over
// five `@every 1s` schedules for 6 s: every occurrence is scheduled once.
func TestMaterialisersRace(t *testing.T) {
	rdb := testenv.Redis(t)
	race(t, rdb, newKeys(t, rdb, 4))
}

// TestMaterialisersRaceOnCluster is the same on a private Redis Cluster
// (3 primaries): each script touches one slot (the state beside the
// body's shard, the definitions beside the queue's other keys), so none is
// refused with CROSSSLOT.
func TestMaterialisersRaceOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	rdb := c.Client()
	keys := shard.Keys{Prefix: "rc", Queue: "q"}
	if err := rdb.Set(context.Background(), keys.ShardCount(), 4, 0).Err(); err != nil {
		t.Fatal(err)
	}
	race(t, rdb, keys)
}

func race(t *testing.T, rdb redis.UniversalClient, keys shard.Keys) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := NewStore(rdb, keys)
	for k := range 5 {
		if _, err := st.Put(ctx, Def{Queue: "q", Name: fmt.Sprint("s", k), Cron: "@every 1s", Body: fmt.Sprint("b", k)}); err != nil {
			t.Fatal(err)
		}
	}
	took := map[string]map[int64]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); claimer(ctx, rdb, keys, 4, took, &mu) }()
	var ms []*Materialiser
	for range 3 {
		m := New(rdb, Options{Keys: keys, Sweeping: func() bool { return true }, Logger: quiet,
			Layout: func() shard.Layout { return shard.Layout{Shards: 4} }, RevPoll: 100 * time.Millisecond})
		ms = append(ms, m)
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.Run(ctx) }()
	}
	time.Sleep(6 * time.Second)
	cancel()
	wg.Wait()
	raced := int64(0)
	for _, m := range ms {
		raced += m.raced.Load()
	}
	t.Logf("%d steps overtaken by another materialiser's", raced)
	if raced == 0 {
		t.Error("the materialisers never raced: the test proves nothing")
	}
	for k := range 5 {
		b := fmt.Sprint("b", k)
		var first, last int64
		for d, n := range took[b] {
			if n != 1 {
				t.Errorf("%s at %d scheduled %d times", b, d, n)
			}
			if first == 0 || d < first {
				first = d
			}
			last = max(last, d)
		}
		if len(took[b]) < 4 {
			t.Errorf("%s: %d occurrences", b, len(took[b]))
		}
		for d := first; d <= last; d += 1000 {
			if took[b][d] == 0 {
				t.Errorf("%s: occurrence %d missing", b, d)
			}
		}
	}
	sts, err := st.Statuses(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range sts {
		if s.Error != "" {
			t.Errorf("%s: %s", name, s.Error)
		}
	}
}

// TestStoreChanges: an unchanged Put costs no revision; a changed body
// cancels the old body's pending occurrence; a paused schedule
// materialises nothing and resumes after now; Remove cancels what is
// pending.
func TestStoreChanges(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := newKeys(t, rdb, 4)
	st := NewStore(rdb, keys)
	d := Def{Queue: "q", Name: "s", Cron: "@daily", Body: "old", Source: "cli"}
	if ch, err := st.Put(ctx, d); !ch || err != nil {
		t.Fatal(ch, err)
	}
	rev, _ := st.Rev(ctx, nil)
	if ch, _ := st.Put(ctx, d); ch {
		t.Fatal("an equal Put changed something")
	}
	if r, _ := st.Rev(ctx, nil); r != rev {
		t.Fatalf("rev %d -> %d", rev, r)
	}
	m := New(rdb, Options{Keys: keys, Sweeping: func() bool { return true }, Logger: quiet, Layout: func() shard.Layout { return shard.Layout{Shards: 4} }})
	step := func() {
		t.Helper()
		if err := m.refresh(ctx); err != nil {
			t.Fatal(err)
		}
		for range 3 { // a migration or retirement takes a step of its own
			m.step(ctx, m.entries["s"])
		}
	}
	step()
	oldShard := shard.Index([]byte("old"), 4)
	if rdb.ZScore(ctx, keys.Pending(oldShard), "old").Err() != nil {
		t.Fatal("the first occurrence is not pending")
	}
	d.Body = "new"
	if _, err := st.Put(ctx, d); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, keys.Pending(oldShard), "old").Err() != redis.Nil {
		t.Fatal("the old body's occurrence is still pending")
	}
	step()
	newShard := shard.Index([]byte("new"), 4)
	if rdb.ZScore(ctx, keys.Pending(newShard), "new").Err() != nil {
		t.Fatal("the new body's occurrence is not pending")
	}
	if _, err := st.SetPaused(ctx, "s", true); err != nil {
		t.Fatal(err)
	}
	step()
	if rdb.ZScore(ctx, keys.Pending(newShard), "new").Err() != redis.Nil {
		t.Fatal("paused, the occurrence is still pending")
	}
	if _, err := st.SetPaused(ctx, "s", false); err != nil {
		t.Fatal(err)
	}
	step()
	if rdb.ZScore(ctx, keys.Pending(newShard), "new").Err() != nil {
		t.Fatal("resumed, no occurrence pending")
	}
	if _, err := st.Remove(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if rdb.ZScore(ctx, keys.Pending(newShard), "new").Err() != redis.Nil {
		t.Fatal("removed, the occurrence is still pending")
	}
	if l, _ := st.List(ctx); len(l) != 0 {
		t.Fatalf("list after remove: %v", l)
	}
}

// TestReconcileRename: a schedule renamed in the file (same body, another
// name) replaces the old one; it used to be refused for the old name's
// body, after which the old one was removed: no schedule at all.
func TestReconcileRename(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	keys := newKeys(t, rdb, 4)
	r := NewReconciler(rdb, keys.Prefix, []string{keys.Queue}, quiet)
	def := func(name string) File {
		return File{Schedules: []Def{{Queue: keys.Queue, Name: name, Cron: "@daily", Body: "report"}}}
	}
	if _, err := r.Reconcile(ctx, def("old")); err != nil {
		t.Fatal(err)
	}
	res, err := r.Reconcile(ctx, def("new"))
	if err != nil || len(res.Invalid) != 0 {
		t.Fatalf("rename: %+v, %v", res, err)
	}
	defs, _, err := NewStore(rdb, keys).Defs(ctx)
	if err != nil || len(defs) != 1 || defs[0].Name != "new" {
		t.Fatalf("after the rename: %+v, %v; want only \"new\"", defs, err)
	}
}

// outage is a schedule behind by an outage, for catchUpOnRedis.
type outage struct {
	def      Def
	behind   time.Duration // the state's cursor before the Redis clock
	maxSteps int
	tweak    func(s *Schedule, start time.Time) // changes the parsed schedule before the first step
}

// caughtUp is what catchUpOnRedis saw.
type caughtUp struct {
	taken         []time.Time // due times of the occurrences taken, oldest first
	start, cursor time.Time   // the Redis clock at the start, the state's cursor
	skipped       float64     // dispatcher_recurring_skipped_total
	log           string
}

// catchUpOnRedis stores o's schedule with its state's cursor o.behind the
// Redis clock (as the last instance left it before an outage), then steps
// a materialiser as the sweeper would, taking each occurrence out of
// pending as a dispatcher's claim does, until the one it materialised is
// due in the future.
func catchUpOnRedis(t *testing.T, o outage) caughtUp {
	t.Helper()
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := newKeys(t, rdb, 4)
	st := NewStore(rdb, keys)
	def := o.def
	def.Queue = keys.Queue
	if _, err := st.Put(ctx, def); err != nil {
		t.Fatal(err)
	}
	defs, _, err := st.Defs(ctx)
	if err != nil || len(defs) != 1 {
		t.Fatalf("defs %v, %v", defs, err)
	}
	var c caughtUp
	c.start, err = rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	c.cursor = c.start.Add(-o.behind).Truncate(time.Millisecond)
	i := shard.Index([]byte(def.Body), 4)
	if err := rdb.HSet(ctx, keys.RecurringState(i), def.Name, fmt.Sprintf("%d:%d:", defs[0].Rev, c.cursor.UnixMilli())).Err(); err != nil {
		t.Fatal(err)
	}
	met := NewMetrics(nil)
	var log bytes.Buffer
	m := New(rdb, Options{Keys: keys, Sweeping: func() bool { return true }, Metrics: met,
		Logger: slog.New(slog.NewTextHandler(&log, nil)),
		Layout: func() shard.Layout { return shard.Layout{Shards: 4} }})
	if err := m.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	e := m.entries[def.Name]
	if o.tweak != nil {
		o.tweak(e.sched, c.start)
	}
	for range o.maxSteps {
		m.step(ctx, e)
		if e.status.Error != "" {
			t.Fatalf("step: %s", e.status.Error)
		}
		sc, err := rdb.ZScore(ctx, keys.Pending(i), def.Body).Result()
		if err != nil {
			t.Fatalf("nothing pending after a step: %v", err)
		}
		due := time.UnixMilli(int64(sc))
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if due.After(now) {
			c.skipped = testutil.ToFloat64(met.skipped.WithLabelValues(keys.Queue))
			c.log = log.String()
			return c
		}
		c.taken = append(c.taken, due)
		if err := rdb.ZRem(ctx, keys.Pending(i), def.Body).Err(); err != nil { // claimed
			t.Fatal(err)
		}
	}
	t.Fatalf("still catching up after %d steps: %d taken", o.maxSteps, len(c.taken))
	return c
}

// TestMaterialiserLatestAfterLongOutage: an `@every 1s` schedule 2.1 M
// seconds behind with "latest" fires its latest occurrence at or before
// now once, then goes on; none of the stale ones (the search stopped
// after a million steps and fired 1.1 M and 100 k seconds old ones first).
func TestMaterialiserLatestAfterLongOutage(t *testing.T) {
	c := catchUpOnRedis(t, outage{def: Def{Name: "s", Cron: "@every 1s", Body: "b", CatchUp: CatchUpLatest},
		behind: 2_100_000 * time.Second, maxSteps: 50})
	if len(c.taken) == 0 {
		t.Fatal("the latest missed occurrence did not fire")
	}
	for _, d := range c.taken {
		if d.Before(c.start.Add(-time.Second)) {
			t.Errorf("fired an occurrence %s before the start", c.start.Sub(d))
		}
	}
	// Every occurrence from the cursor's next up to the one fired was skipped.
	n := c.cursor.Truncate(time.Second).Add(time.Second)
	if want := float64(c.taken[0].Sub(n) / time.Second); c.skipped != want {
		t.Errorf("skipped %v, want %v", c.skipped, want)
	}
	if !strings.Contains(c.log, "skipped=") {
		t.Errorf("the skipped occurrences are not logged:\n%s", c.log)
	}
	t.Logf("%d fired, the first %s before the start; %v skipped", len(c.taken), c.start.Sub(c.taken[0]), c.skipped)
}

// TestMaterialiserAllAfterOutage: exactly 2*MaxCatchUp+1 occurrences of
// an hourly schedule missed with "all": the most recent MaxCatchUp fire,
// oldest first, and the older ones do not (the oldest used to fire first:
// 1,001 in all).
func TestMaterialiserAllAfterOutage(t *testing.T) {
	missed := 2*MaxCatchUp + 1
	c := catchUpOnRedis(t, outage{def: Def{Name: "s", Cron: "@every 1h", Body: "b", CatchUp: CatchUpAll},
		behind: time.Duration(missed)*time.Hour + 30*time.Minute, maxSteps: 3 * MaxCatchUp})
	first := c.cursor.Truncate(time.Second).Add(time.Duration(missed-MaxCatchUp+1) * time.Hour)
	if len(c.taken) != MaxCatchUp || !c.taken[0].Equal(first) {
		t.Fatalf("%d fired, the first %s; want %d, the first %s", len(c.taken), c.taken[0].UTC(), MaxCatchUp, first.UTC())
	}
	for i := 1; i < len(c.taken); i++ {
		if c.taken[i].Sub(c.taken[i-1]) != time.Hour {
			t.Fatalf("%s fired after %s", c.taken[i].UTC(), c.taken[i-1].UTC())
		}
	}
	if c.skipped != float64(missed-MaxCatchUp) {
		t.Errorf("skipped %v, want %d", c.skipped, missed-MaxCatchUp)
	}
}

// TestMaterialiserCatchUpLost: when the search for the latest missed
// occurrence contradicts itself (an expression whose Next disagrees with
// itself), nothing stale fires: the schedule goes on with the first
// occurrence after now, and says so at warn level.
func TestMaterialiserCatchUpLost(t *testing.T) {
	var far time.Time
	c := catchUpOnRedis(t, outage{def: Def{Name: "s", Cron: "* * * * * *", Body: "b", CatchUp: CatchUpLatest},
		behind: time.Hour, maxSteps: 5, tweak: func(s *Schedule, start time.Time) {
			far = start.Add(time.Hour).Truncate(time.Second)
			s.cron = liar{a: start.Add(-30 * time.Minute).Truncate(time.Second), far: far}
		}})
	if len(c.taken) != 0 {
		t.Errorf("fired %v", c.taken)
	}
	if !strings.Contains(c.log, "could not be found") || !strings.Contains(c.log, far.UTC().Format(time.RFC3339)) {
		t.Errorf("no warning naming the occurrence fired instead:\n%s", c.log)
	}
}

// TestOccurrenceProperties: a schedule's properties are written to the
// props hash under the body with each occurrence, in the step that ZADDs
// it (a field left in the tasks hash would make the body an id: it goes);
// a changed definition without properties writes its occurrence without
// them, and the cancelled occurrence of the old definition leaves no
// field behind.
func TestOccurrenceProperties(t *testing.T) {
	rdb := testenv.Redis(t)
	ctx := context.Background()
	keys := newKeys(t, rdb, 4)
	st := NewStore(rdb, keys)
	d := Def{Queue: "q", Name: "s", Cron: "@daily", Body: "tick", Source: "cli",
		Properties: `{"headers": {"tenant": "acme", "n": 7}, "content_type": "text/plain", "expiration_ms": 60000}`}
	if _, err := Parse(d); err != nil {
		t.Fatal(err)
	}
	i := shard.Index([]byte("tick"), 4)
	rdb.HSet(ctx, keys.Tasks(i), "tick", "left over from an earlier task")
	if _, err := st.Put(ctx, d); err != nil {
		t.Fatal(err)
	}
	m := New(rdb, Options{Keys: keys, Sweeping: func() bool { return true }, Logger: quiet, Layout: func() shard.Layout { return shard.Layout{Shards: 4} }})
	step := func() {
		t.Helper()
		if err := m.refresh(ctx); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			m.step(ctx, m.entries["s"])
		}
	}
	step()
	if rdb.ZScore(ctx, keys.Pending(i), "tick").Err() != nil {
		t.Fatal("the occurrence is not pending")
	}
	got, err := rdb.HGet(ctx, keys.Props(i), "tick").Result()
	if err != nil {
		t.Fatalf("the occurrence has no props field: %v", err)
	}
	p, err := shard.ParseProperties([]byte(got))
	if err != nil || p.ContentType != "text/plain" || p.Headers["tenant"] != "acme" || p.Headers["n"] != int64(7) || p.ExpirationMs == nil || *p.ExpirationMs != 60000 {
		t.Errorf("props field %s: %+v, %v", got, p, err)
	}
	if rdb.HExists(ctx, keys.Tasks(i), "tick").Val() {
		t.Error("the tasks field left over is still there: the occurrence would go out with its body")
	}
	// Without properties now: the pending occurrence is cancelled with its
	// field, the next one has none.
	d.Properties = ""
	if _, err := st.Put(ctx, d); err != nil {
		t.Fatal(err)
	}
	step()
	if rdb.ZScore(ctx, keys.Pending(i), "tick").Err() != nil {
		t.Fatal("no occurrence pending after the change")
	}
	if rdb.HExists(ctx, keys.Props(i), "tick").Val() {
		t.Errorf("the occurrence of a schedule without properties has a props field: %q", rdb.HGet(ctx, keys.Props(i), "tick").Val())
	}
	// With them again, then removed: nothing is left.
	d.Properties = `{"type":"tick"}`
	if _, err := st.Put(ctx, d); err != nil {
		t.Fatal(err)
	}
	step()
	if v := rdb.HGet(ctx, keys.Props(i), "tick").Val(); v != `{"type":"tick"}` {
		t.Errorf("props field %q", v)
	}
	if _, err := st.Remove(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, keys.Pending(i), keys.Props(i), keys.Tasks(i)).Val(); n != 0 {
		t.Errorf("after remove, %d of the pending, props and tasks keys are left", n)
	}
}
