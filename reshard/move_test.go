package reshard

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/admin"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// moveFixture is a queue changing from 2 to 4 shards, with member m
// pending in its shard by 2 (i), which is not its shard by 4 (j).
type moveFixture struct {
	rdb  *redis.Client
	keys shard.Keys
	prod *shard.Producer
	m    string
	i, j int
	due  int64
}

func newMoveFixture(t *testing.T) *moveFixture {
	t.Helper()
	ctx := context.Background()
	f := &moveFixture{rdb: testenv.Redis(t), keys: shard.Keys{Prefix: testenv.Name(t), Queue: "q"}}
	testenv.CleanRedis(t, f.rdb, f.keys.Prefix)
	for k := 0; ; k++ {
		f.m = "task-" + strconv.Itoa(k)
		if f.i, f.j = shard.Index([]byte(f.m), 2), shard.Index([]byte(f.m), 4); f.i != f.j {
			break
		}
	}
	f.due = time.Now().Add(time.Hour).UnixMilli()
	if err := f.rdb.Set(ctx, f.keys.ShardCount(), 2, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.rdb.ZAdd(ctx, f.keys.Pending(f.i), redis.Z{Score: float64(f.due), Member: f.m}).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, f.rdb, f.keys, 4); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.prod, err = shard.NewProducer(f.rdb, f.keys.Prefix, f.keys.Queue, 2); err != nil {
		t.Fatal(err)
	}
	f.prod.SetWakeWithin(0)
	return f
}

// pending returns the member's score in each shard of the change.
func (f *moveFixture) pending(t *testing.T) map[int]int64 {
	t.Helper()
	out := map[int]int64{}
	for _, k := range []int{f.i, f.j} {
		s, err := f.rdb.ZScore(context.Background(), f.keys.Pending(k), f.m).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[k] = int64(s)
	}
	return out
}

// TestMoveKeepsProducerSchedule interleaves the layout-aware producer's
// schedule of the same due time as the task being moved with a batch's
// steps: the task was scheduled last, so it must end pending in its new
// shard (found by the model test, seed 14041695681753396373: the undo
// removed the producer's copy, same score as the one the move added).
func TestMoveKeepsProducerSchedule(t *testing.T) {
	cases := []struct {
		name  string
		after int // the producer acts after this step
		do    func(t *testing.T, f *moveFixture)
	}{
		{"Schedule of the same due between add and take", 1, func(t *testing.T, f *moveFixture) {
			if err := f.prod.Schedule(context.Background(), []byte(f.m), time.UnixMilli(f.due)); err != nil {
				t.Fatal(err)
			}
		}},
		{"old-count cancel between add and take, Schedule of the same due between take and undo", 2, func(t *testing.T, f *moveFixture) {
			if err := f.prod.Schedule(context.Background(), []byte(f.m), time.UnixMilli(f.due)); err != nil {
				t.Fatal(err)
			}
		}},
		{"old-count cancel between add and take, Reschedule of the same due between take and undo", 2, func(t *testing.T, f *moveFixture) {
			if err := f.prod.Reschedule(context.Background(), []byte(f.m), time.UnixMilli(f.due)); err != nil {
				t.Fatalf("Reschedule: %v", err)
			}
		}},
		{"old-count cancel, then ScheduleMany of the same due, between add and take", 1, func(t *testing.T, f *moveFixture) {
			ctx := context.Background()
			if err := f.rdb.ZRem(ctx, f.keys.Pending(f.i), f.m).Err(); err != nil {
				t.Fatal(err)
			}
			if err := f.prod.ScheduleMany(ctx, []shard.Task{{Member: []byte(f.m), Due: time.UnixMilli(f.due)}}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			f := newMoveFixture(t)
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			b := m.batch(f.i, f.j, []task{{score: strconv.FormatInt(f.due, 10), member: f.m}})
			if err := b.mark(ctx); err != nil {
				t.Fatal(err)
			}
			if err := b.add(ctx); err != nil {
				t.Fatal(err)
			}
			if c.after == 1 {
				c.do(t, f)
			} else if err := f.rdb.ZRem(ctx, f.keys.Pending(f.i), f.m).Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.take(ctx); err != nil {
				t.Fatal(err)
			}
			if c.after == 2 {
				c.do(t, f)
			}
			var p Progress
			if err := b.undo(ctx, &p); err != nil {
				t.Fatal(err)
			}
			if got := f.pending(t); len(got) != 1 || got[f.j] != f.due {
				t.Errorf("after the move (added %v, taken %v, %+v): %q pending %v (shard: score), want only in shard %d with %d, the schedule that came last",
					b.added, b.taken, p, f.m, got, f.j, f.due)
			}
		})
	}
}

// TestMoveTwoMovers interleaves the steps of two movers' batches of the
// same task: a mover that lost its lock (A, paused past the lock's TTL)
// still runs its page's steps while the next holder (B) moves the same
// task. Whatever the order, the task must end pending in exactly one
// shard, its new one, with its score: neither mover may undo the copy
// the other's take relies on.
func TestMoveTwoMovers(t *testing.T) {
	for _, order := range []string{"A1 B1 B2 A2 A3 B3", "A1 B1 B2 B3 A2 A3", "A1 B1 B2 B3", "B1 A1 A2 B2 B3 A3", "A1 B1 A2 B2 A3 B3", "B1 A1 B2 A2 A3 B3"} {
		t.Run(order, func(t *testing.T) {
			ctx := context.Background()
			f := newMoveFixture(t)
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			ts := []task{{score: strconv.FormatInt(f.due, 10), member: f.m}}
			movers := map[byte]*batchMove{'A': m.batch(f.i, f.j, ts)}
			progress := map[byte]*Progress{'A': {}, 'B': {}}
			// A (the mover that lost its lock) scanned and marked the
			// task first; B scans it after, with A's marker, and B's mark,
			// listing it under B's token, supersedes A's at the source.
			if err := movers['A'].mark(ctx); err != nil {
				t.Fatal(err)
			}
			s, err := f.rdb.ZScore(ctx, f.keys.Pending(f.i), f.m).Result()
			if err != nil || s != float64(f.due)+0.5 {
				t.Fatalf("after A's mark: %v, %v; want the marker %d.5", s, err, f.due)
			}
			movers['B'] = m.batch(f.i, f.j, []task{{score: strconv.FormatFloat(s, 'f', -1, 64), member: f.m}})
			if err := movers['B'].mark(ctx); err != nil {
				t.Fatal(err)
			}
			for _, st := range strings.Fields(order) {
				b := movers[st[0]]
				var err error
				switch st[1] {
				case '1':
					err = b.add(ctx)
				case '2':
					err = b.take(ctx)
				case '3':
					err = b.undo(ctx, progress[st[0]])
				}
				if err != nil {
					t.Fatalf("%s: %v", st, err)
				}
			}
			if got := f.exact(t); len(got) != 1 || got[f.j] != float64(f.due) {
				t.Errorf("after %s (A added %v taken %v, B added %v taken %v): %q pending %v (shard: score), want only in shard %d with %d",
					order, movers['A'].added, movers['A'].taken, movers['B'].added, movers['B'].taken, f.m, got, f.j, f.due)
			}
		})
	}
}

// TestMoveSameScoreAgain interleaves a batch's steps with producers that
// write only ZADD and ZREM (no layout, no unlisting) and schedule a task
// again with the very due time it had, which Redis cannot tell from no
// write: the task was scheduled last, so it must stay pending, and a pass
// must then leave it once in its new shard with its due time (no marker
// score left). All three lost the task before the mark and the batch
// tokens (the model test found them: seeds 14098515862825334917,
// 4536624000409008727 and 3221184166855260179).
func TestMoveSameScoreAgain(t *testing.T) {
	type step func(t *testing.T, f *moveFixture, a, b *batchMove)
	ctx := context.Background()
	zadd := func(shard func(f *moveFixture) int) step {
		return func(t *testing.T, f *moveFixture, a, b *batchMove) {
			if err := f.rdb.ZAdd(ctx, f.keys.Pending(shard(f)), redis.Z{Score: float64(f.due), Member: f.m}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	zrem := func(shard func(f *moveFixture) int) step {
		return func(t *testing.T, f *moveFixture, a, b *batchMove) {
			if err := f.rdb.ZRem(ctx, f.keys.Pending(shard(f)), f.m).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	old := func(f *moveFixture) int { return f.i }
	nw := func(f *moveFixture) int { return f.j }
	run := func(which byte, n int) step {
		return func(t *testing.T, f *moveFixture, a, b *batchMove) {
			bm := a
			if which == 'B' {
				bm = b
			}
			var err error
			switch n {
			case 0:
				err = bm.mark(ctx)
			case 1:
				err = bm.add(ctx)
			case 2:
				err = bm.take(ctx)
			case 3:
				err = bm.undo(ctx, &Progress{})
			}
			if err != nil {
				t.Fatalf("%c%d: %v", which, n, err)
			}
		}
	}
	cancel := func(t *testing.T, f *moveFixture, a, b *batchMove) {
		if _, err := f.prod.Cancel(ctx, []byte(f.m)); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name   string
		steps  []step
		in     func(f *moveFixture) int // where the task must be pending after the steps
		second bool                     // a second mover's batch B
	}{
		// A (a mover that lost its lock) adds; a layout-aware Cancel
		// removes both copies; A's take finds nothing; an old-count
		// producer schedules the task again with the same due; the next
		// holder's batch B marks and adds it; A's undo then removed B's
		// copy (the same score listed) and B's take the source's.
		{"two movers: the lost-lock mover's undo after the next holder's add", []step{
			run('A', 0), run('A', 1), cancel, run('A', 2), zadd(old), run('B', 0), run('B', 1), run('A', 3), run('B', 2), run('B', 3),
		}, nw, true},
		// An old-count producer cancels the task during the move, a
		// new-count one schedules it again with the same due: the undo
		// removed that schedule with the copy step 1 had added.
		{"old-count cancel, new-count schedule of the same due before the undo", []step{
			run('A', 0), run('A', 1), zrem(old), run('A', 2), zadd(nw), run('A', 3),
		}, nw, false},
		// A new-count producer cancels the copy step 1 added, an old-count
		// one schedules the task again with the same due: the take removed
		// that schedule from the source.
		{"new-count cancel, old-count schedule of the same due before the take", []step{
			run('A', 0), run('A', 1), zrem(nw), zadd(old), run('A', 2), run('A', 3),
		}, old, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newMoveFixture(t)
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			ts := []task{{score: strconv.FormatInt(f.due, 10), member: f.m}}
			a, b := m.batch(f.i, f.j, ts), m.batch(f.i, f.j, ts)
			for _, st := range c.steps {
				st(t, f, a, b)
			}
			want := map[int]float64{c.in(f): float64(f.due)}
			if got := f.exact(t); !maps.Equal(got, want) {
				t.Fatalf("after the steps: %q pending %v (shard: score), want %v: the task scheduled last was lost", f.m, got, want)
			}
			l := shard.Layout{Shards: 4, From: 2}
			if _, err := (&Mover{RDB: f.rdb, Keys: f.keys, Horizon: -1}).Pass(ctx, l, 0, 4); err != nil {
				t.Fatal(err)
			}
			if got, want := f.exact(t), map[int]float64{f.j: float64(f.due)}; !maps.Equal(got, want) {
				t.Fatalf("after a pass: %q pending %v (shard: score), want %v", f.m, got, want)
			}
			for k := range 4 {
				if n, err := f.rdb.Exists(ctx, f.keys.Moving(k)).Result(); err != nil || n != 0 {
					t.Errorf("shard %d: moving hash left after the pass (%d, %v)", k, n, err)
				}
			}
		})
	}
}

// exact returns the member's exact score in each shard of the change.
func (f *moveFixture) exact(t *testing.T) map[int]float64 {
	t.Helper()
	out := map[int]float64{}
	for k := range 4 {
		s, err := f.rdb.ZScore(context.Background(), f.keys.Pending(k), f.m).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[k] = s
	}
	return out
}

// TestDeadMoveRaces runs an operator's requeue or purge of a dead letter
// (internal/admin, what `dispatcher dead requeue|purge` runs), or the
// letter requeued and dead-lettered again with another reason, before
// each step of a batch moving it, then lets the next pass settle what is
// left. The letter must end as the operator left it: requeued (pending,
// dead nowhere), purged (dead nowhere), or dead once in its new shard with
// its latest reason; never duplicated, brought back, or with a stale
// reason.
func TestDeadMoveRaces(t *testing.T) {
	type outcome struct {
		dead    map[int]string // shard -> reason
		pending bool           // pending in its shard by 2
	}
	actions := []struct {
		name string
		do   func(t *testing.T, f *moveFixture, q admin.Queue, d admin.Dead) outcome
	}{
		{"requeue", func(t *testing.T, f *moveFixture, q admin.Queue, d admin.Dead) outcome {
			ok, err := admin.Requeue(context.Background(), f.rdb, q, d, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return outcome{dead: map[int]string{f.j: "nacked"}}
			}
			return outcome{dead: map[int]string{}, pending: true}
		}},
		{"purge", func(t *testing.T, f *moveFixture, q admin.Queue, d admin.Dead) outcome {
			ok, err := admin.Purge(context.Background(), f.rdb, q, d)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return outcome{dead: map[int]string{f.j: "nacked"}}
			}
			return outcome{dead: map[int]string{}}
		}},
		{"requeued and dead again", func(t *testing.T, f *moveFixture, q admin.Queue, d admin.Dead) outcome {
			ctx := context.Background()
			ok, err := admin.Requeue(ctx, f.rdb, q, d, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				return outcome{dead: map[int]string{f.j: "nacked"}}
			}
			// Dispatched from shard i, failed, dead-lettered there again.
			pipe := f.rdb.TxPipeline()
			pipe.ZRem(ctx, f.keys.Pending(f.i), d.Member)
			pipe.ZAdd(ctx, f.keys.Dead(f.i), redis.Z{Score: float64(d.DueMs), Member: d.Entry})
			pipe.HSet(ctx, f.keys.DeadReason(f.i), d.Entry, "again")
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			return outcome{dead: map[int]string{f.j: "again"}}
		}},
	}
	steps := len((&deadMove{}).steps())
	for _, a := range actions {
		for before := range steps {
			t.Run(fmt.Sprintf("%s before step %d of %d", a.name, before+1, steps), func(t *testing.T) {
				ctx := context.Background()
				f := newMoveFixture(t)
				// The task pending in the fixture is not the dead letter's
				// body: a requeue would find it pending.
				if err := f.rdb.ZRem(ctx, f.keys.Pending(f.i), f.m).Err(); err != nil {
					t.Fatal(err)
				}
				dueMs := time.Now().Add(-time.Minute).UnixMilli()
				d := admin.Dead{Shard: f.i, DueMs: dueMs, Member: f.m, Entry: fmt.Sprintf("%d:%s", dueMs, f.m)}
				pipe := f.rdb.TxPipeline()
				pipe.ZAdd(ctx, f.keys.Dead(f.i), redis.Z{Score: float64(dueMs), Member: d.Entry})
				pipe.HSet(ctx, f.keys.DeadReason(f.i), d.Entry, "nacked")
				if _, err := pipe.Exec(ctx); err != nil {
					t.Fatal(err)
				}
				q := admin.Queue{Keys: f.keys, Shards: 4, Layout: shard.Layout{Shards: 4, From: 2}}
				m := &Mover{RDB: f.rdb, Keys: f.keys}
				b := m.deadBatch(f.i, f.j, []task{{score: strconv.FormatInt(dueMs, 10), member: d.Entry}})
				var want outcome
				for k, step := range b.steps() {
					if k == before {
						want = a.do(t, f, q, d)
					}
					if err := step(ctx); err != nil {
						t.Fatalf("step %d: %v", k+1, err)
					}
				}
				// The next pass settles what the batch left.
				if _, err := m.Pass(ctx, shard.Layout{Shards: 4, From: 2}, 0, 4); err != nil {
					t.Fatal(err)
				}
				got := outcome{dead: map[int]string{}}
				for k := range 4 {
					if err := f.rdb.ZScore(ctx, f.keys.Dead(k), d.Entry).Err(); err == nil {
						got.dead[k] = f.rdb.HGet(ctx, f.keys.DeadReason(k), d.Entry).Val()
					} else if err != redis.Nil {
						t.Fatal(err)
					}
				}
				got.pending = f.rdb.ZScore(ctx, f.keys.Pending(f.i), f.m).Err() == nil
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("dead letter %q (shard %d -> %d): dead in (shard: reason) %v, pending %v; want dead in %v, pending %v",
						d.Entry, f.i, f.j, got.dead, got.pending, want.dead, want.pending)
				}
			})
		}
	}
}

// TestDeadMoveTwoMovers is TestMoveTwoMovers for a dead letter: two
// movers' batches of it interleaved (one lost its lock and runs on) leave
// it dead once, in its new shard, with its reason.
func TestDeadMoveTwoMovers(t *testing.T) {
	for _, order := range []string{"A1 A2 B1 B2 B3 A3 A4 B4", "A1 A2 B1 B2 A3 B3 B4 A4", "B1 B2 A1 A2 A3 B3 B4 A4", "A1 A2 B1 B2 B3 B4"} {
		t.Run(order, func(t *testing.T) {
			ctx := context.Background()
			f := newMoveFixture(t)
			dueMs := time.Now().Add(-time.Minute).UnixMilli()
			e := fmt.Sprintf("%d:%s", dueMs, f.m)
			pipe := f.rdb.TxPipeline()
			pipe.ZAdd(ctx, f.keys.Dead(f.i), redis.Z{Score: float64(dueMs), Member: e})
			pipe.HSet(ctx, f.keys.DeadReason(f.i), e, "nacked")
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			ts := []task{{score: strconv.FormatInt(dueMs, 10), member: e}}
			steps := map[byte][]func(context.Context) error{'A': m.deadBatch(f.i, f.j, ts).steps(), 'B': m.deadBatch(f.i, f.j, ts).steps()}
			for _, st := range strings.Fields(order) {
				if err := steps[st[0]][st[1]-'1'](ctx); err != nil {
					t.Fatalf("%s: %v", st, err)
				}
			}
			got := map[int]string{}
			for k := range 4 {
				if f.rdb.ZScore(ctx, f.keys.Dead(k), e).Err() == nil {
					got[k] = f.rdb.HGet(ctx, f.keys.DeadReason(k), e).Val()
				}
			}
			if len(got) != 1 || got[f.j] != "nacked" {
				t.Errorf("after %s: dead letter %q in (shard: reason) %v, want only in %d with %q", order, e, got, f.j, "nacked")
			}
		})
	}
}

// TestMoveCarriesFields runs producers' writes of a task with an id
// (the contract's MULTI: body, properties, ZADD; or cancel) between a
// batch's steps. The task must end pending once, in its new shard, with
// the body and properties of the write that wins (the last one, or the
// new count's copy by the conflict rule), and no field of :tasks or
// :props may be left in a shard that does not hold the member pending.
func TestMoveCarriesFields(t *testing.T) {
	type write struct {
		before      int  // the write runs before this step (0 read, 1 add, 2 take, 3 undo; 4 after)
		shard       byte // 'i' the old count's shard, 'j' the new one's
		cancel      bool
		body, props string
	}
	cases := []struct {
		name        string
		writes      []write
		body, props string // what the task must end with
	}{
		{"moved with its fields", nil, "b1", `{"priority":1}`},
		{"scheduled again with the same due and another body before the read",
			[]write{{before: 0, shard: 'i', body: "b2"}}, "b2", ""},
		{"scheduled again with the same due and another body between read and add",
			[]write{{before: 1, shard: 'i', body: "b2", props: `{"priority":2}`}}, "b2", `{"priority":2}`},
		{"scheduled again with the same due and other properties between add and take",
			[]write{{before: 2, shard: 'i', body: "b1", props: `{"priority":3}`}}, "b1", `{"priority":3}`},
		{"old-count cancel between add and take, new-count schedule of the same due with another body between take and undo",
			[]write{{before: 2, shard: 'i', cancel: true}, {before: 3, shard: 'j', body: "b3"}}, "b3", ""},
		{"new-count schedule before the read: its copy wins, with its fields",
			[]write{{before: 0, shard: 'j', body: "new", props: `{"type":"new"}`}}, "new", `{"type":"new"}`},
		{"new-count schedule between add and take: the last write wins",
			[]write{{before: 2, shard: 'j', body: "new"}}, "new", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			f := newMoveFixture(t)
			schedule := func(w write) {
				k := f.i
				if w.shard == 'j' {
					k = f.j
				}
				pipe := f.rdb.TxPipeline()
				if w.cancel {
					pipe.ZRem(ctx, f.keys.Pending(k), f.m)
					pipe.HDel(ctx, f.keys.Tasks(k), f.m)
					pipe.HDel(ctx, f.keys.Props(k), f.m)
				} else {
					pipe.HSet(ctx, f.keys.Tasks(k), f.m, w.body)
					if w.props != "" {
						pipe.HSet(ctx, f.keys.Props(k), f.m, w.props)
					} else {
						pipe.HDel(ctx, f.keys.Props(k), f.m)
					}
					pipe.ZAdd(ctx, f.keys.Pending(k), redis.Z{Score: float64(f.due), Member: f.m})
				}
				if _, err := pipe.Exec(ctx); err != nil {
					t.Fatal(err)
				}
			}
			schedule(write{shard: 'i', body: "b1", props: `{"priority":1}`})
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			b := m.batch(f.i, f.j, []task{{score: strconv.FormatInt(f.due, 10), member: f.m}})
			for k, st := range append(b.steps(), nil) {
				for _, w := range c.writes {
					if w.before == k {
						schedule(w)
					}
				}
				if st == nil {
					break
				}
				if err := st(ctx); err != nil {
					t.Fatalf("step %d: %v", k, err)
				}
			}
			// The next pass settles what the batch left.
			if _, err := m.Pass(ctx, shard.Layout{Shards: 4, From: 2}, 0, 4); err != nil {
				t.Fatal(err)
			}
			if got := f.pending(t); len(got) != 1 || got[f.j] != f.due {
				t.Fatalf("%q pending in (shard: score) %v (added %v, taken %v), want only in %d", f.m, got, b.added, b.taken, f.j)
			}
			for _, k := range []int{f.i, f.j} {
				body, props := f.rdb.HGet(ctx, f.keys.Tasks(k), f.m).Val(), f.rdb.HGet(ctx, f.keys.Props(k), f.m).Val()
				want := [2]string{c.body, c.props}
				if k == f.i {
					want = [2]string{}
				}
				if [2]string{body, props} != want {
					t.Errorf("shard %d: body %q props %q, want %q (added %v, taken %v)", k, body, props, want, b.added, b.taken)
				}
			}
		})
	}
}
