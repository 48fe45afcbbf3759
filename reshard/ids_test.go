package reshard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/reshard"
	"github.com/dispatcher/dispatcher/shard"
)

// idTask is what a task with an id (or a plain member with properties, or
// a plain member) should be at the end.
type idTask struct {
	due         int64
	body, props string
	hasBody     bool // an empty body is a body
	cancelled   bool
}

// TestReshardIDs changes a queue's shard count from 4 to 8 and from 8 to
// 3 with tasks with an id (binary bodies, an empty one, six of 400 KiB
// going from one shard to one other: more than one call's byte budget),
// plain members with properties, plain members and dead letters with the
// bodies and properties their claim kept; a producer on the new count
// schedules ids again (often with the same due time and another body) and
// cancels some, the contract's way, while the move runs. At the end every
// task is pending once, in its shard by the new count, with its latest
// body and properties; every dead letter likewise; no field of :tasks,
// :props or claimed:* is left anywhere without its member or entry. After
// the shrink, entries left in flight in the retired shards are handed out
// with their bodies and properties.
func TestReshardIDs(t *testing.T) {
	for _, c := range []struct{ from, to int }{{4, 8}, {8, 3}} {
		t.Run(fmt.Sprintf("%d to %d", c.from, c.to), func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			testReshardIDs(t, c.from, c.to)
			t.Logf("%d -> %d: %v", c.from, c.to, time.Since(start).Round(time.Millisecond))
		})
	}
}

func testReshardIDs(t *testing.T, from, to int) {
	ctx := context.Background()
	rdb, k := setup(t, from)
	rng := rand.New(rand.NewPCG(uint64(from), uint64(to)))
	far := time.Now().Add(time.Hour).UnixMilli()
	tasks := map[string]*idTask{}
	var ids []string
	pipe := rdb.TxPipeline()
	add := func(name string, tk *idTask) {
		tasks[name] = tk
		i := shard.Index([]byte(name), from)
		if tk.hasBody {
			pipe.HSet(ctx, k.Tasks(i), name, tk.body)
		}
		if tk.props != "" {
			pipe.HSet(ctx, k.Props(i), name, tk.props)
		}
		pipe.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(tk.due), Member: name})
	}
	for n := range 300 {
		name := fmt.Sprintf("id-%d", n)
		tk := &idTask{due: far + int64(rng.IntN(1000)), body: fmt.Sprintf("body of %d \x00\xff", n), hasBody: true}
		if n == 7 {
			tk.body = "" // an empty body is still a body
		}
		if n%2 == 0 {
			tk.props = fmt.Sprintf(`{"priority":%d,"headers":{"n":%d}}`, n%10, n)
		}
		add(name, tk)
		ids = append(ids, name)
	}
	for n := range 100 {
		tk := &idTask{due: far + int64(rng.IntN(1000))}
		if n%4 > 0 {
			tk.props = fmt.Sprintf(`{"routing_key":"r%d"}`, n)
		}
		add(fmt.Sprintf("plain-%d", n), tk)
	}
	// Six big bodies from one shard to one other: the move's calls carry
	// at most 1 MiB, so theirs is cut.
	big := strings.Repeat("b", 400<<10)
	var a, b = -1, -1
	for n, found := 0, 0; found < 6; n++ {
		name := fmt.Sprintf("big-%d", n)
		i, j := shard.Index([]byte(name), from), shard.Index([]byte(name), to)
		if i == j || a >= 0 && (i != a || j != b) {
			continue
		}
		a, b = i, j
		add(name, &idTask{due: far, body: big + name, hasBody: true, props: `{"type":"big"}`})
		found++
	}
	// Dead letters, with the body and properties their claim kept.
	dead := map[string]idTask{}
	for n := range 40 {
		member := fmt.Sprintf("dead-%d", n)
		if n%3 == 0 {
			member = ids[n]
		}
		e := fmt.Sprintf("%d:%s", far-int64(n), member)
		d := idTask{due: far - int64(n), body: "dead body " + member, hasBody: n%5 > 0, props: ""}
		if n%2 == 0 {
			d.props = `{"priority":1}`
		}
		i := shard.Index([]byte(member), from)
		pipe.ZAdd(ctx, k.Dead(i), redis.Z{Score: float64(d.due), Member: e})
		pipe.HSet(ctx, k.DeadReason(i), e, "nacked "+member)
		if d.hasBody {
			pipe.HSet(ctx, k.ClaimedBody(i), e, d.body)
		}
		if d.props != "" {
			pipe.HSet(ctx, k.ClaimedProps(i), e, d.props)
		}
		dead[e] = d
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	checkNoOrphans(t, rdb, k, max(from, to))

	// Start the change, and let its settle window pass at once.
	if _, err := reshard.Start(ctx, rdb, k, to); err != nil {
		t.Fatal(err)
	}
	started, _ := rdb.HGet(ctx, k.Reshard(), "started_ms").Int64()
	rdb.HSet(ctx, k.Reshard(), "started_ms", started-shard.LayoutSettle.Milliseconds())

	// A producer on the new count while the move runs: schedules ids again
	// (by the new count, then removes the old count's copy) and cancels
	// some (in both shards), each the contract's MULTI.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ops int
	wg.Add(1)
	go func() {
		defer wg.Done()
		prng := rand.New(rand.NewPCG(uint64(to), 7))
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			name := ids[prng.IntN(len(ids))]
			tk := tasks[name]
			if tk.cancelled {
				continue
			}
			i, j := shard.Index([]byte(name), from), shard.Index([]byte(name), to)
			p := rdb.TxPipeline()
			if prng.IntN(5) == 0 {
				for _, s := range []int{j, i} {
					p.ZRem(ctx, k.Pending(s), name)
					p.HDel(ctx, k.Tasks(s), name)
					p.HDel(ctx, k.Props(s), name)
				}
				tk.cancelled = true
			} else {
				if prng.IntN(2) == 0 {
					tk.due++ // else the same due with another body: the undo must tell
				}
				tk.body, tk.props = fmt.Sprintf("again %d of %s", n, name), ""
				p.HSet(ctx, k.Tasks(j), name, tk.body)
				if prng.IntN(2) == 0 {
					tk.props = fmt.Sprintf(`{"correlation_id":"%d"}`, n)
					p.HSet(ctx, k.Props(j), name, tk.props)
				} else {
					p.HDel(ctx, k.Props(j), name)
				}
				p.ZAdd(ctx, k.Pending(j), redis.Z{Score: float64(tk.due), Member: name})
				if i != j {
					p.ZRem(ctx, k.Pending(i), name)
					p.HDel(ctx, k.Tasks(i), name)
					p.HDel(ctx, k.Props(i), name)
				}
			}
			if _, err := p.Exec(ctx); err != nil {
				t.Errorf("producer: %v", err)
				return
			}
			ops++
			time.Sleep(200 * time.Microsecond)
		}
	}()
	st, p, err := reshard.Reshard(ctx, rdb, k, to, reshard.Options{Name: "test", Horizon: -1})
	close(stop)
	wg.Wait()
	if err != nil || st.From != from {
		t.Fatalf("reshard: %+v, %v", st, err)
	}
	t.Logf("reshard %d -> %d: %+v; the producer wrote %d times meanwhile", from, to, p, ops)
	if _, _, err := reshard.Close(ctx, rdb, k, reshard.Options{Name: "test", Horizon: -1, Wait: 5 * time.Second}); err != nil {
		t.Fatalf("close: %v", err)
	}
	span := max(from, to)
	snap := checkNoOrphans(t, rdb, k, span)
	for name, tk := range tasks {
		j := shard.Index([]byte(name), to)
		for s := range span {
			score, ok := snap[s].pending[name]
			switch {
			case !ok:
				if s == j && !tk.cancelled {
					t.Errorf("%s: not pending in its shard %d by %d", name, j, to)
				}
				continue
			case s != j || tk.cancelled:
				t.Errorf("%s: pending in shard %d (cancelled: %v), its shard by %d is %d", name, s, tk.cancelled, to, j)
				continue
			case score != tk.due:
				t.Errorf("%s: due %d, want %d", name, score, tk.due)
			}
			body, hasBody := snap[j].h[0][name]
			if hasBody != tk.hasBody || body != tk.body {
				t.Errorf("%s: body %.40q (present %v), want %.40q (present %v)", name, body, hasBody, tk.body, tk.hasBody)
			}
			if props := snap[j].h[1][name]; props != tk.props {
				t.Errorf("%s: props %q, want %q", name, props, tk.props)
			}
		}
	}
	for e, d := range dead {
		_, member, _ := strings.Cut(e, ":")
		j := shard.Index([]byte(member), to)
		for s := range span {
			if _, in := snap[s].dead[e]; in != (s == j) {
				t.Errorf("dead letter %s in shard %d: %v (its shard by %d is %d)", e, s, in, to, j)
			}
		}
		if body, ok := snap[j].h[2][e]; ok != d.hasBody || ok && body != d.body {
			t.Errorf("dead letter %s: body %q (present %v), want %q (present %v)", e, body, ok, d.body, d.hasBody)
		}
		if props := snap[j].h[3][e]; props != d.props {
			t.Errorf("dead letter %s: props %q, want %q", e, props, d.props)
		}
		if why := rdb.HGet(ctx, k.DeadReason(j), e).Val(); why != "nacked "+member {
			t.Errorf("dead letter %s: reason %q", e, why)
		}
	}
	if to > from {
		return
	}

	// After the shrink: an instance claimed tasks with ids in the retired
	// shards just before it applied the finish, and died.
	l, err := shard.ReadLayout(ctx, rdb, k)
	if err != nil || l != (shard.Layout{Shards: to, Retired: from}) {
		t.Fatalf("layout after the shrink: %+v, %v", l, err)
	}
	held := map[string]idTask{}
	pipe = rdb.TxPipeline()
	for n := 0; len(held) < 20; n++ {
		member := fmt.Sprintf("held-%d", n)
		i := shard.Index([]byte(member), from)
		if i < to {
			continue
		}
		e := fmt.Sprintf("%d:%s", far, member)
		h := idTask{body: "held body " + member, hasBody: n%4 > 0, props: fmt.Sprintf(`{"reply_to":"q%d"}`, n)}
		pipe.ZAdd(ctx, k.Inflight(i), redis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: e})
		if h.hasBody {
			pipe.HSet(ctx, k.ClaimedBody(i), e, h.body)
		}
		pipe.HSet(ctx, k.ClaimedProps(i), e, h.props)
		held[e] = h
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	sw, err := reshard.SweepRetired(ctx, rdb, k, l, "test")
	if err != nil || sw.Reclaimed != int64(len(held)) {
		t.Fatalf("SweepRetired: %+v, %v; want %d handed out", sw, err, len(held))
	}
	snap = checkNoOrphans(t, rdb, k, from)
	for e, h := range held {
		_, member, _ := strings.Cut(e, ":")
		j := shard.Index([]byte(member), to)
		for s := range from {
			if _, in := snap[s].inflight[e]; in != (s == j) {
				t.Errorf("held %s in flight in shard %d: %v (its shard by %d is %d)", e, s, in, to, j)
			}
		}
		if body, ok := snap[j].h[2][e]; ok != h.hasBody || ok && body != h.body {
			t.Errorf("held %s: body %q (present %v), want %q (present %v)", e, body, ok, h.body, h.hasBody)
		}
		if props := snap[j].h[3][e]; props != h.props {
			t.Errorf("held %s: props %q, want %q", e, props, h.props)
		}
	}
}

// shardState is a shard's pending, in-flight and dead sets (member or
// entry -> score) and its :tasks, :props, claimed:body and claimed:props.
type shardState struct {
	pending, inflight, dead map[string]int64
	h                       [4]map[string]string
}

// checkNoOrphans reads shards 0..span-1 and fails on a field of :tasks or
// :props whose member is not pending in that shard, or of claimed:body or
// claimed:props whose entry is neither in flight nor dead there.
func checkNoOrphans(t *testing.T, rdb *redis.Client, k shard.Keys, span int) []shardState {
	t.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	zs := make([][3]*redis.ZSliceCmd, span)
	hs := make([][4]*redis.MapStringStringCmd, span)
	for i := range span {
		for n, key := range []string{k.Pending(i), k.Inflight(i), k.Dead(i)} {
			zs[i][n] = pipe.ZRangeWithScores(ctx, key, 0, -1)
		}
		for n, key := range []string{k.Tasks(i), k.Props(i), k.ClaimedBody(i), k.ClaimedProps(i)} {
			hs[i][n] = pipe.HGetAll(ctx, key)
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	out := make([]shardState, span)
	fields := 0
	for i := range span {
		st := &out[i]
		sets := []*map[string]int64{&st.pending, &st.inflight, &st.dead}
		for n, c := range zs[i] {
			*sets[n] = map[string]int64{}
			for _, z := range c.Val() {
				(*sets[n])[z.Member.(string)] = int64(z.Score)
			}
		}
		for n, c := range hs[i] {
			st.h[n] = c.Val()
			for f := range st.h[n] {
				fields++
				_, pending := st.pending[f]
				_, inflight := st.inflight[f]
				_, dead := st.dead[f]
				if n < 2 && !pending {
					t.Errorf("orphan: shard %d: %s field %.40q, not pending there", i, []string{"tasks", "props"}[n], f)
				}
				if n >= 2 && !inflight && !dead {
					t.Errorf("orphan: shard %d: %s field %.40q, neither in flight nor dead there", i, []string{"", "", "claimed:body", "claimed:props"}[n], f)
				}
			}
		}
	}
	if fields == 0 {
		t.Errorf("no field to check in shards 0..%d", span-1)
	}
	return out
}
