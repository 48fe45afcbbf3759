package reshard

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// retiredFixture is a queue shrunk from 4 to 2 shards, finished, with an
// in-flight entry (member m, due) in retired shard i whose lease ran out;
// j is m's shard by 2.
type retiredFixture struct {
	rdb   *redis.Client
	keys  shard.Keys
	l     shard.Layout
	m     string
	entry string
	i, j  int
	due   int64
	lease float64
}

func newRetiredFixture(t *testing.T) *retiredFixture {
	t.Helper()
	ctx := context.Background()
	f := &retiredFixture{rdb: testenv.Redis(t), keys: shard.Keys{Prefix: testenv.Name(t), Queue: "q"}, l: shard.Layout{Shards: 2, Retired: 4}}
	testenv.CleanRedis(t, f.rdb, f.keys.Prefix)
	for k := 0; ; k++ {
		f.m = "held-" + strconv.Itoa(k)
		if f.i = shard.Index([]byte(f.m), 4); f.i >= 2 {
			break
		}
	}
	f.j = shard.Index([]byte(f.m), 2)
	f.due = time.Now().Add(-time.Minute).UnixMilli()
	f.lease = float64(time.Now().Add(-time.Second).UnixMilli())
	f.entry = fmt.Sprintf("%d:%s", f.due, f.m)
	pipe := f.rdb.TxPipeline()
	pipe.Set(ctx, f.keys.ShardCount(), 2, 0)
	pipe.Set(ctx, f.keys.Retired(), 4, 0)
	pipe.ZAdd(ctx, f.keys.Inflight(f.i), redis.Z{Score: f.lease, Member: f.entry})
	pipe.HSet(ctx, f.keys.Attempts(f.i), f.entry, 2)
	pipe.ZAdd(ctx, f.keys.Retrying(f.i), redis.Z{Score: float64(f.due), Member: f.entry})
	// A task with an id: its claim moved its body and properties under the
	// entry.
	pipe.HSet(ctx, f.keys.ClaimedBody(f.i), f.entry, heldBody)
	pipe.HSet(ctx, f.keys.ClaimedProps(f.i), f.entry, heldProps)
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := shard.ReadLayout(ctx, f.rdb, f.keys); err != nil || l != f.l {
		t.Fatalf("layout %+v, %v; want %+v", l, err, f.l)
	}
	return f
}

const heldBody, heldProps = "body\x00of the held task", `{"priority":4}`

// checkFields fails unless the entry's body and properties are in the
// shard that holds it in flight, and nowhere else.
func (f *retiredFixture) checkFields(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	in := f.inflight(t)
	for k := range 4 {
		body, props := f.rdb.HGet(ctx, f.keys.ClaimedBody(k), f.entry).Val(), f.rdb.HGet(ctx, f.keys.ClaimedProps(k), f.entry).Val()
		want := [2]string{}
		if _, ok := in[k]; ok {
			want = [2]string{heldBody, heldProps}
		}
		if [2]string{body, props} != want {
			t.Errorf("shard %d (entry in flight in %v): claimed body %q props %q, want %q", k, in, body, props, want)
		}
	}
}

// inflight returns the entry's lease in each shard that holds it.
func (f *retiredFixture) inflight(t *testing.T) map[int]float64 {
	t.Helper()
	out := map[int]float64{}
	for k := range 4 {
		s, err := f.rdb.ZScore(context.Background(), f.keys.Inflight(k), f.entry).Result()
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

// TestSweepRetiredInflight: the sweep hands an in-flight entry of a
// retired shard whose lease ran out to its shard by the current count,
// with a lease run out (claimed there at once), its failed attempts and
// its retrying index; an entry whose lease still runs is left to its
// holder.
func TestSweepRetiredInflight(t *testing.T) {
	ctx := context.Background()
	f := newRetiredFixture(t)
	live := fmt.Sprintf("%d:live", f.due)
	liveLease := float64(time.Now().Add(time.Minute).UnixMilli())
	f.rdb.ZAdd(ctx, f.keys.Inflight(f.i), redis.Z{Score: liveLease, Member: live})

	sw, err := SweepRetired(ctx, f.rdb, f.keys, f.l, "test")
	if err != nil || sw != (Swept{Reclaimed: 1}) {
		t.Fatalf("SweepRetired: %+v, %v; want 1 reclaimed", sw, err)
	}
	got := f.inflight(t)
	if lease, ok := got[f.j]; len(got) != 1 || !ok || lease <= 0 || lease >= 1 {
		t.Fatalf("entry in flight in (shard: lease) %v; want only in shard %d with a lease run out in (0, 1)", got, f.j)
	}
	if n := f.rdb.HGet(ctx, f.keys.Attempts(f.j), f.entry).Val(); n != "2" {
		t.Errorf("attempts in shard %d: %q, want 2", f.j, n)
	}
	if s, err := f.rdb.ZScore(ctx, f.keys.Retrying(f.j), f.entry).Result(); err != nil || int64(s) != f.due {
		t.Errorf("retrying index in shard %d: %v, %v; want %d", f.j, s, err, f.due)
	}
	if n := f.rdb.Exists(ctx, f.keys.Attempts(f.i), f.keys.Retrying(f.i)).Val(); n != 0 {
		t.Errorf("the retired shard still has %d of its attempts and retrying keys", n)
	}
	f.checkFields(t)
	if s, err := f.rdb.ZScore(ctx, f.keys.Inflight(f.i), live).Result(); err != nil || s != liveLease {
		t.Errorf("the entry whose lease runs: %v, %v; want left with %v", s, err, liveLease)
	}
	if sw, err := SweepRetired(ctx, f.rdb, f.keys, f.l, "test"); err != nil || sw != (Swept{}) {
		t.Errorf("second SweepRetired: %+v, %v; want nothing", sw, err)
	}
}

// TestHandOverRaces runs what may happen to the retired shard's entry
// before each step of a hand-over: its stalled holder confirms it, or an
// instance that has not yet applied the shrink's finish claims it again.
// The entry must then stay where that left it, not be handed over too.
// Two hand-overs of one entry interleaved (a sweeper that lost its lock
// runs on) must leave it in flight once, in its new shard.
func TestHandOverRaces(t *testing.T) {
	actions := []struct {
		name string
		do   func(f *retiredFixture) error
		want func(f *retiredFixture) map[int]float64
	}{
		{"acked by its holder", func(f *retiredFixture) error {
			ctx := context.Background()
			pipe := f.rdb.TxPipeline()
			pipe.ZRem(ctx, f.keys.Inflight(f.i), f.entry)
			pipe.HDel(ctx, f.keys.ClaimedBody(f.i), f.entry)
			pipe.HDel(ctx, f.keys.ClaimedProps(f.i), f.entry)
			_, err := pipe.Exec(ctx)
			return err
		}, func(f *retiredFixture) map[int]float64 { return map[int]float64{} }},
		{"claimed again in the retired shard", func(f *retiredFixture) error {
			return f.rdb.ZAddXX(context.Background(), f.keys.Inflight(f.i), redis.Z{Score: f.lease + 60_000, Member: f.entry}).Err()
		}, func(f *retiredFixture) map[int]float64 { return map[int]float64{f.i: f.lease + 60_000} }},
	}
	for _, a := range actions {
		for before := range len(inflightSteps) {
			t.Run(fmt.Sprintf("%s before step %d", a.name, before+1), func(t *testing.T) {
				ctx := context.Background()
				f := newRetiredFixture(t)
				m := &Mover{RDB: f.rdb, Keys: f.keys}
				h := handOver{entry: f.entry, lease: strconv.FormatFloat(f.lease, 'f', -1, 64), due: strconv.FormatInt(f.due, 10), attempts: "2",
					f: heldFields()}
				b := m.inflightBatch(f.i, f.j, []handOver{h}, newMarker())
				for k, st := range stepsOf(f.rdb, inflightSteps, b) {
					if k == before {
						if err := a.do(f); err != nil {
							t.Fatal(err)
						}
					}
					if err := st(ctx); err != nil {
						t.Fatalf("step %d: %v", k+1, err)
					}
				}
				got, want := f.inflight(t), a.want(f)
				if before == 2 { // after the take: the entry was handed over already
					want = map[int]float64{f.j: mustFloat(t, b.marker)}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("entry in flight in (shard: lease) %v, want %v (added %v, taken %v)", got, want, b.added, b.taken)
				}
				f.checkFields(t)
			})
		}
	}
	for _, order := range []string{"X1 Y1 Y2 X2 X3 Y3", "X1 Y1 X2 Y2 X3 Y3", "Y1 X1 X2 Y2 Y3 X3", "X1 Y1 Y2 Y3"} {
		t.Run("two hand-overs "+order, func(t *testing.T) {
			ctx := context.Background()
			f := newRetiredFixture(t)
			m := &Mover{RDB: f.rdb, Keys: f.keys}
			h := handOver{entry: f.entry, lease: strconv.FormatFloat(f.lease, 'f', -1, 64), due: strconv.FormatInt(f.due, 10), attempts: "2",
				f: heldFields()}
			steps := map[byte][]func(context.Context) error{
				'X': stepsOf(f.rdb, inflightSteps, m.inflightBatch(f.i, f.j, []handOver{h}, newMarker())),
				'Y': stepsOf(f.rdb, inflightSteps, m.inflightBatch(f.i, f.j, []handOver{h}, newMarker())),
			}
			for _, st := range strings.Fields(order) {
				if err := steps[st[0]][st[1]-'1'](ctx); err != nil {
					t.Fatalf("%s: %v", st, err)
				}
			}
			if got := f.inflight(t); len(got) != 1 || got[f.j] >= 1 {
				t.Errorf("after %s: entry in flight in (shard: lease) %v, want only in shard %d with a lease run out", order, got, f.j)
			}
			f.checkFields(t)
		})
	}
}

func mustFloat(t *testing.T, s string) float64 {
	t.Helper()
	x, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// heldFields are the fields the fixture's entry has, as a hand-over reads
// them.
func heldFields() fields {
	body, props := redis.NewSliceCmd(context.Background()), redis.NewSliceCmd(context.Background())
	body.SetVal([]any{heldBody})
	props.SetVal([]any{heldProps})
	fs, _ := readFields(body, props, 1)
	return fs[0]
}
