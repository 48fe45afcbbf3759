package bulk

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is a queue of m shards under a prefix of the test's own.
type fixture struct {
	t    *testing.T
	rdb  redis.UniversalClient
	keys shard.Keys
	m    int
}

func newFixture(t *testing.T, m int) *fixture {
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	return &fixture{t: t, rdb: rdb, keys: shard.Keys{Prefix: prefix, Queue: "q"}, m: m}
}

// add schedules n tasks name-0 .. name-(n-1), due at due(k).
func (f *fixture) add(name string, n int, due func(k int) int64) {
	f.t.Helper()
	ctx := context.Background()
	pipe := f.rdb.Pipeline()
	for k := range n {
		member := fmt.Sprintf("%s-%d", name, k)
		pipe.ZAdd(ctx, f.keys.Shard([]byte(member), f.m), redis.Z{Score: float64(due(k)), Member: member})
		if k%1000 == 999 || k == n-1 {
			if _, err := pipe.Exec(ctx); err != nil {
				f.t.Fatal(err)
			}
		}
	}
}

// due is a member's due ms, or -1 if not pending.
func (f *fixture) due(member string) int64 {
	s, err := f.rdb.ZScore(context.Background(), f.keys.Shard([]byte(member), f.m), member).Result()
	if errors.Is(err, redis.Nil) {
		return -1
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return int64(s)
}

func (f *fixture) runner(id string, s Spec) *Runner {
	s.Shards = f.m
	if id != "" {
		if err := Record(context.Background(), f.rdb, f.keys, id, s, time.Hour); err != nil {
			f.t.Fatal(err)
		}
	}
	return &Runner{RDB: f.rdb, Keys: f.keys, ID: id, Spec: s, Batch: 100}
}

func ptr(v int64) *int64 { return &v }

const base = int64(1_900_000_000_000) // 2030: never due during a test

// TestBulkCancelMatch: of 5,000 tasks matching the glob and 5,000 not,
// interleaved on the same due times, exactly the matching ones within the
// due-time range go; a dry run before counts them and changes nothing.
func TestBulkCancelMatch(t *testing.T) {
	f := newFixture(t, 4)
	ctx := context.Background()
	due := func(k int) int64 { return base + int64(k%50) } // 100 tasks per ms
	f.add("order", 5000, due)
	f.add("other", 5000, due)
	spec := Spec{Mode: Cancel, Match: "order-*", FromMs: ptr(base + 10), ToMs: ptr(base + 39)}

	dry := f.runner("", spec)
	dry.DryRun = true
	res, err := dry.Run(ctx)
	if err != nil || res.Matched != 3000 || res.Changed != 0 || len(res.Sample) != 10 {
		t.Fatalf("dry run: %+v, %v; want 3000 matched, nothing changed, 10 in the sample", res, err)
	}
	if n := f.rdb.Exists(ctx, f.keys.BulkProgress(0, "")).Val(); n != 0 {
		t.Errorf("the dry run wrote progress")
	}

	res, err = f.runner(NewID(), spec).Run(ctx)
	if err != nil || res.Matched != 3000 || res.Changed != 3000 || res.Skipped != 0 {
		t.Fatalf("run: %+v, %v; want 3000 matched and cancelled", res, err)
	}
	for k := range 5000 {
		d := due(k) - base
		if got, want := f.due(fmt.Sprintf("order-%d", k)) != -1, d < 10 || d > 39; got != want {
			t.Fatalf("order-%d due +%d ms: pending %v, want %v", k, d, got, want)
		}
		if f.due(fmt.Sprintf("other-%d", k)) == -1 {
			t.Fatalf("other-%d was cancelled", k)
		}
	}
}

// TestBulkRescheduleTies: 3,000 tasks sharing one due time (and 300 at
// another), walked 100 at a time: --by later, --by earlier and --at move
// each exactly once, whatever the direction.
func TestBulkRescheduleTies(t *testing.T) {
	f := newFixture(t, 2)
	ctx := context.Background()
	f.add("a", 3000, func(int) int64 { return base })
	f.add("b", 300, func(int) int64 { return base + 5 })
	check := func(step string, wantA, wantB int64) {
		t.Helper()
		for k := range 3000 {
			if got := f.due(fmt.Sprintf("a-%d", k)); got != wantA {
				t.Fatalf("%s: a-%d due %d, want %d", step, k, got-base, wantA-base)
			}
		}
		for k := range 300 {
			if got := f.due(fmt.Sprintf("b-%d", k)); got != wantB {
				t.Fatalf("%s: b-%d due %d, want %d", step, k, got-base, wantB-base)
			}
		}
	}
	for _, c := range []struct {
		step         string
		spec         Spec
		changed      int64
		wantA, wantB int64
	}{
		// Each shift lands inside the range (on the other group's due time
		// too): a walk toward it would move tasks again.
		{"by +5", Spec{Mode: By, ByMs: 5}, 3300, base + 5, base + 10},
		{"by -5", Spec{Mode: By, ByMs: -5}, 3300, base, base + 5},
		{"by +5 on a only", Spec{Mode: By, ByMs: 5, Match: "a-*"}, 3000, base + 5, base + 5},
		{"at +7 from +5", Spec{Mode: At, AtMs: base + 7, FromMs: ptr(base + 5)}, 3300, base + 7, base + 7},
		{"at +7 again", Spec{Mode: At, AtMs: base + 7}, 0, base + 7, base + 7},
		{"at 0 up to +7", Spec{Mode: At, AtMs: base, ToMs: ptr(base + 7)}, 3300, base, base},
	} {
		res, err := f.runner(NewID(), c.spec).Run(ctx)
		if err != nil || res.Changed != c.changed || res.Skipped != 0 {
			t.Fatalf("%s: %+v, %v; want %d changed", c.step, res, err, c.changed)
		}
		check(c.step, c.wantA, c.wantB)
	}
}

// TestBulkClaimedSkipped: tasks claimed (moved to in-flight), cancelled or
// rescheduled between a batch's read and its change are not touched, and
// are counted and listed as skipped.
func TestBulkClaimedSkipped(t *testing.T) {
	f := newFixture(t, 1)
	ctx := context.Background()
	f.add("t", 1000, func(k int) int64 { return base + int64(k) })
	r := f.runner(NewID(), Spec{Mode: By, ByMs: time.Hour.Milliseconds()})
	var claimed []string
	r.beforeAct = func(i int, matched []string) {
		if len(claimed) > 0 {
			return
		}
		// The batch's first task is claimed, its second rescheduled by a
		// producer (later than the walk's cursor, so it is not met again):
		// both must stay as the other party left them.
		m0, m1 := matched[0], matched[2]
		claimed = append(claimed, m0, m1)
		pipe := f.rdb.TxPipeline()
		pipe.ZRem(ctx, f.keys.Pending(i), m0)
		pipe.ZAdd(ctx, f.keys.Inflight(i), redis.Z{Score: float64(base), Member: matched[1] + ":" + m0})
		pipe.ZAdd(ctx, f.keys.Pending(i), redis.Z{Score: float64(base + 2_000_000), Member: m1})
		if _, err := pipe.Exec(ctx); err != nil {
			t.Error(err)
		}
	}
	res, err := r.Run(ctx)
	if err != nil || res.Matched != 1000 || res.Changed != 998 || res.Skipped != 2 ||
		strings.Join(res.SkippedSample, ",") != strings.Join(claimed, ",") {
		t.Fatalf("%+v, %v; want 998 changed, %v skipped", res, err, claimed)
	}
	if f.due(claimed[0]) != -1 || f.due(claimed[1]) != base+2_000_000 {
		t.Errorf("claimed %s due %d, rescheduled %s due %d: touched", claimed[0], f.due(claimed[0]), claimed[1], f.due(claimed[1]))
	}
}

// TestBulkResume: a run stopped after a few batches (as by Ctrl-C or kill
// -9: the progress is written with each batch) and continued by a new
// runner with its id shifts each task exactly once; a second process on
// the same run is refused.
func TestBulkResume(t *testing.T) {
	f := newFixture(t, 3)
	ctx := context.Background()
	f.add("t", 2000, func(k int) int64 { return base + int64(k%3) })
	id := NewID()
	spec := Spec{Mode: By, ByMs: -1000, Match: "t-*"}
	r := f.runner(id, spec)
	r.StopAfter = 7
	res, err := r.Run(ctx)
	if !errors.Is(err, ErrStopped) || res.Changed < 600 || res.Changed >= 2000 {
		t.Fatalf("first run: %+v, %v; want stopped after 7 batches of 100 or less", res, err)
	}
	loaded, err := Load(ctx, f.rdb, f.keys, id, time.Hour)
	if err != nil || loaded.ByMs != -1000 || loaded.Match != "t-*" || loaded.Shards != 3 {
		t.Fatalf("Load: %+v, %v", loaded, err)
	}
	r2 := &Runner{RDB: f.rdb, Keys: f.keys, ID: id, Spec: loaded, Batch: 150}
	res, err = r2.Run(ctx)
	if err != nil || res.Matched != 2000 || res.Changed != 2000 {
		t.Fatalf("resumed: %+v, %v; want 2000 in all", res, err)
	}
	for k := range 2000 {
		if got, want := f.due(fmt.Sprintf("t-%d", k)), base+int64(k%3)-1000; got != want {
			t.Fatalf("t-%d due %d, want %d", k, got, want)
		}
	}
	// Once done, running it again changes nothing and reports the totals.
	if res, err = r2.Run(ctx); err != nil || res.Changed != 2000 {
		t.Fatalf("again: %+v, %v", res, err)
	}
	// Two processes on one run: the progress's seq tells.
	id2 := NewID()
	a, b := f.runner(id2, spec), &Runner{RDB: f.rdb, Keys: f.keys, ID: id2, Spec: Spec{Mode: By, ByMs: -1000, Shards: 3}, TTL: time.Hour}
	a.beforeAct = func(int, []string) {
		if _, err := b.act(ctx, 0, progressOf{}, progressOf{phase: 0, score: "1", member: "x"}, nil, &Result{}); err != nil {
			t.Error(err)
		}
	}
	if _, err := a.Run(ctx); !errors.Is(err, ErrBusy) {
		t.Fatalf("two processes on one run: %v, want ErrBusy", err)
	}
	if _, err := Load(ctx, f.rdb, f.keys, "0000000000", time.Hour); !errors.Is(err, ErrNoRun) {
		t.Errorf("Load of an unknown run: %v", err)
	}
}

// TestBulkRefusesDuringReshard: while the shard count changes, tasks move
// between shards: a run refuses to start.
func TestBulkRefusesDuringReshard(t *testing.T) {
	f := newFixture(t, 4)
	ctx := context.Background()
	f.rdb.Set(ctx, f.keys.ShardCount(), 4, 0)
	f.rdb.HSet(ctx, f.keys.Reshard(), "from", 2)
	_, err := f.runner(NewID(), Spec{Mode: Cancel, Match: "*"}).Run(ctx)
	if !errors.Is(err, ErrChanging) || !strings.Contains(err.Error(), "finish it first") {
		t.Fatalf("%v, want ErrChanging", err)
	}
}

// TestBulkRefusesNonASCIIRange: a glob whose class range ends past ASCII
// reads differently on different Redis platforms (glob.Check): the run
// refuses it, naming it, and changes nothing.
func TestBulkRefusesNonASCIIRange(t *testing.T) {
	f := newFixture(t, 4)
	ctx := context.Background()
	f.add("b", 10, func(int) int64 { return base })
	_, err := f.runner(NewID(), Spec{Mode: Cancel, Match: "[a-é]*"}).Run(ctx)
	if err == nil || !strings.Contains(err.Error(), `glob "[a-é]*"`) {
		t.Fatalf("%v, want the glob refused", err)
	}
	for k := range 10 {
		if f.due(fmt.Sprintf("b-%d", k)) == -1 {
			t.Fatalf("b-%d was cancelled", k)
		}
	}
}

// TestBulkCluster: cancel and reschedule on a Redis Cluster of three
// primaries, the queue's 8 shards spread over them.
func TestBulkCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	rdb := c.Client()
	f := &fixture{t: t, rdb: rdb, keys: shard.Keys{Prefix: "dq", Queue: "bulk"}, m: 8}
	ctx := context.Background()
	f.add("x", 1000, func(k int) int64 { return base + int64(k%2) })
	f.add("y", 1000, func(k int) int64 { return base + int64(k%2) })
	res, err := f.runner(NewID(), Spec{Mode: Cancel, Match: "x-*"}).Run(ctx)
	if err != nil || res.Changed != 1000 {
		t.Fatalf("cancel: %+v, %v", res, err)
	}
	res, err = f.runner(NewID(), Spec{Mode: By, ByMs: 60_000, ToMs: ptr(base)}).Run(ctx)
	if err != nil || res.Changed != 500 {
		t.Fatalf("by: %+v, %v", res, err)
	}
	for k := range 1000 {
		if f.due(fmt.Sprintf("x-%d", k)) != -1 {
			t.Fatalf("x-%d still pending", k)
		}
		want := base + 1
		if k%2 == 0 {
			want = base + 60_000
		}
		if got := f.due(fmt.Sprintf("y-%d", k)); got != want {
			t.Fatalf("y-%d due %d, want %d", k, got, want)
		}
	}
}

// TestBulkResumeKeepsFinishedShards: every invocation keeps the progress of
// the shards finished before, as long as the run's record: a shard whose
// progress expired while the record lived on would be walked again on
// resume, and its tasks shifted twice (found in review).
func TestBulkResumeKeepsFinishedShards(t *testing.T) {
	f := newFixture(t, 2)
	ctx := context.Background()
	f.add("t", 400, func(k int) int64 { return base + int64(k%3) })
	id := NewID()
	ttl := 1500 * time.Millisecond
	run := func(spec Spec, stopAfter int) (Result, error) {
		r := &Runner{RDB: f.rdb, Keys: f.keys, ID: id, Spec: spec, Batch: 50, TTL: ttl, StopAfter: stopAfter}
		return r.Run(ctx)
	}
	spec := Spec{Mode: By, ByMs: 1000, Match: "t-*", Shards: 2}
	if err := Record(ctx, f.rdb, f.keys, id, spec, ttl); err != nil {
		t.Fatal(err)
	}
	// Shard 0 (some 200 tasks, 50 a batch) finished, shard 1 begun.
	if _, err := run(spec, 6); !errors.Is(err, ErrStopped) {
		t.Fatalf("first invocation: %v, want stopped", err)
	}
	time.Sleep(time.Second)
	loaded, err := Load(ctx, f.rdb, f.keys, id, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(loaded, 1); !errors.Is(err, ErrStopped) {
		t.Fatalf("second invocation: %v, want stopped", err)
	}
	time.Sleep(time.Second) // past shard 0's last batch's TTL, not the record's
	if loaded, err = Load(ctx, f.rdb, f.keys, id, ttl); err != nil {
		t.Fatal(err)
	}
	if _, err := run(loaded, 0); err != nil {
		t.Fatal(err)
	}
	for k := range 400 {
		if got, want := f.due(fmt.Sprintf("t-%d", k)), base+int64(k%3)+1000; got != want {
			t.Fatalf("t-%d due %d, want %d (shifted once)", k, got, want)
		}
	}
}

// TestBulkCancelTakesFieldsRescheduleKeeps: tasks with an id (a body
// field) and properties, cancelled in bulk, leave no field behind, and
// tasks that did not match keep theirs; rescheduled in bulk, they keep
// body and properties.
func TestBulkCancelTakesFieldsRescheduleKeeps(t *testing.T) {
	f := newFixture(t, 4)
	ctx := context.Background()
	f.add("order", 600, func(k int) int64 { return base + int64(k%7) })
	f.add("other", 600, func(k int) int64 { return base + int64(k%7) })
	pipe := f.rdb.Pipeline()
	fields := func(member string) (string, string) {
		i := shard.Index([]byte(member), f.m)
		return f.keys.Tasks(i), f.keys.Props(i)
	}
	for k := range 600 {
		for _, name := range []string{"order", "other"} {
			m := fmt.Sprintf("%s-%d", name, k)
			tasks, props := fields(m)
			pipe.HSet(ctx, tasks, m, "body of "+m)
			pipe.HSet(ctx, props, m, `{"type":"`+name+`"}`)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	count := func() (tasks, props int64) {
		for i := range f.m {
			tasks += f.rdb.HLen(ctx, f.keys.Tasks(i)).Val()
			props += f.rdb.HLen(ctx, f.keys.Props(i)).Val()
		}
		return tasks, props
	}
	res, err := f.runner(NewID(), Spec{Mode: By, Match: "other-*", ByMs: 60_000}).Run(ctx)
	if err != nil || res.Changed != 600 {
		t.Fatalf("reschedule: %+v, %v", res, err)
	}
	if nt, np := count(); nt != 1200 || np != 1200 {
		t.Fatalf("after the reschedule: %d body and %d props fields, want 1200 each", nt, np)
	}
	res, err = f.runner(NewID(), Spec{Mode: Cancel, Match: "order-*"}).Run(ctx)
	if err != nil || res.Changed != 600 {
		t.Fatalf("cancel: %+v, %v", res, err)
	}
	for k := range 600 {
		m := fmt.Sprintf("order-%d", k)
		tasks, props := fields(m)
		if f.due(m) != -1 || f.rdb.HExists(ctx, tasks, m).Val() || f.rdb.HExists(ctx, props, m).Val() {
			t.Fatalf("%s: pending at %d, or a field left", m, f.due(m))
		}
		o := fmt.Sprintf("other-%d", k)
		tasks, props = fields(o)
		if f.due(o) != base+int64(k%7)+60_000 || f.rdb.HGet(ctx, tasks, o).Val() != "body of "+o || f.rdb.HGet(ctx, props, o).Val() != `{"type":"other"}` {
			t.Fatalf("%s: due %d, fields %q %q", o, f.due(o)-base, f.rdb.HGet(ctx, tasks, o).Val(), f.rdb.HGet(ctx, props, o).Val())
		}
	}
	if nt, np := count(); nt != 600 || np != 600 {
		t.Errorf("after the cancel: %d body and %d props fields, want 600 each", nt, np)
	}
}
