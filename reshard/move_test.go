package reshard

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	for _, order := range []string{"A1 B1 B2 A2 A3 B3", "A1 B1 B2 B3 A2 A3", "B1 A1 A2 B2 B3 A3", "A1 B1 A2 B2 A3 B3", "B1 A1 B2 A2 A3 B3"} {
		t.Run(order, func(t *testing.T) {
			ctx := context.Background()
			f := newMoveFixture(t)
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			ts := []task{{score: strconv.FormatInt(f.due, 10), member: f.m}}
			movers := map[byte]*batchMove{'A': m.batch(f.i, f.j, ts), 'B': m.batch(f.i, f.j, ts)}
			progress := map[byte]*Progress{'A': {}, 'B': {}}
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
			if got := f.pending(t); len(got) != 1 || got[f.j] != f.due {
				t.Errorf("after %s (A added %v taken %v, B added %v taken %v): %q pending %v (shard: score), want only in shard %d with %d",
					order, movers['A'].added, movers['A'].taken, movers['B'].added, movers['B'].taken, f.m, got, f.j, f.due)
			}
		})
	}
}
