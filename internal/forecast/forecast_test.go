package forecast_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/forecast"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// spread is a known set of tasks relative to from: minute k of the hour
// holds k%5 tasks at its 30th second, minute 17 also a herd of herd
// tasks within one second (12.345 s in), minute 40 six tasks at six
// seconds, minute 41 five more; 7 overdue (two of them scored in
// seconds, as a producer writing seconds does) and 3 after the hour.
type spread struct {
	from  int64
	herd  int
	tasks map[string]float64 // member -> score
	want  []int64            // per minute
}

func newSpread(from int64, herd int) spread {
	s := spread{from: from, herd: herd, tasks: map[string]float64{}, want: make([]int64, 60)}
	add := func(name string, at int64, minute int) {
		s.tasks[name] = float64(at)
		if minute >= 0 {
			s.want[minute]++
		}
	}
	for k := range 60 {
		for j := range k % 5 {
			add(fmt.Sprintf("m%d-%d", k, j), from+int64(k)*60_000+30_000, k)
		}
	}
	for j := range herd {
		add(fmt.Sprintf("herd-%d", j), from+17*60_000+12_345+int64(j%600), 17)
	}
	for j := range 6 {
		add(fmt.Sprintf("even40-%d", j), from+40*60_000+int64(j)*1000, 40)
	}
	for j := range 5 {
		add(fmt.Sprintf("even41-%d", j), from+41*60_000+int64(j)*1000, 41)
	}
	for j := range 5 {
		add(fmt.Sprintf("late-%d", j), from-1-int64(j)*10_000, -1)
	}
	s.tasks["secs-0"], s.tasks["secs-1"] = float64(from/1000-5), 0
	for j := range 3 {
		add(fmt.Sprintf("after-%d", j), from+3_600_000+int64(j), -1)
	}
	return s
}

// write ZADDs the tasks to their shards as a producer does.
func (s spread) write(t *testing.T, rdb redis.UniversalClient, k shard.Keys, m int) {
	t.Helper()
	ctx := context.Background()
	pipe := rdb.Pipeline()
	for member, score := range s.tasks {
		pipe.ZAdd(ctx, k.Pending(shard.Index([]byte(member), m)), redis.Z{Score: score, Member: member})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s spread) check(t *testing.T, f forecast.Forecast) {
	t.Helper()
	if len(f.Buckets) != 60 || f.FromMs != s.from || f.StepMs != 60_000 {
		t.Fatalf("forecast from %d by %d ms, %d buckets; want from %d by 60000, 60", f.FromMs, f.StepMs, len(f.Buckets), s.from)
	}
	var total int64
	for k, b := range f.Buckets {
		if b.Tasks != s.want[k] || b.FromMs != s.from+int64(k)*60_000 {
			t.Errorf("bucket %d: %d tasks from %d, want %d from %d", k, b.Tasks, b.FromMs, s.want[k], s.from+int64(k)*60_000)
		}
		total += s.want[k]
	}
	if f.Total != total || f.Overdue != 7 {
		t.Errorf("total %d, overdue %d; want %d and 7", f.Total, f.Overdue, total)
	}
	want := forecast.Peak{FromMs: s.from + 17*60_000 + 12_000, Tasks: int64(s.herd), Exact: true}
	if f.Peak != want {
		t.Errorf("busiest second %+v, want %+v", f.Peak, want)
	}
}

func all(m int) []int {
	out := make([]int, m)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestForecast counts a known spread over 8 shards, a herd of 5,000 tasks
// in one second and overdue tasks included, exactly per minute; finds the
// herd's second with one split; says when its budget ran out before the
// busiest second was certain; and names a broken shard while counting
// the others.
func TestForecast(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	k := shard.Keys{Prefix: prefix, Queue: "orders"}
	from := (time.Now().UnixMilli()/60_000 + 1) * 60_000
	s := newSpread(from, 5000)
	s.write(t, rdb, k, 8)

	opt := forecast.Options{Prefix: prefix, Queue: "orders", Shards: all(8), Refine: 1}
	f, err := forecast.Read(ctx, rdb, opt, forecast.Window{FromMs: from, Span: time.Hour, Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s.check(t, f)

	// After the herd: minutes 40 and 41 spread over seconds; one split
	// finds a second of 1 but cannot rule out minute 41's 6.
	w := forecast.Window{FromMs: from + 40*60_000, Span: 10 * time.Minute, Step: time.Minute}
	f, err = forecast.Read(ctx, rdb, opt, w)
	if err != nil {
		t.Fatal(err)
	}
	if want := (forecast.Peak{FromMs: from + 40*60_000, Tasks: 1, Bound: 6}); f.Peak != want {
		t.Errorf("busiest second with a budget of 1: %+v, want %+v", f.Peak, want)
	}
	opt.Refine = 3
	if f, err = forecast.Read(ctx, rdb, opt, w); err != nil {
		t.Fatal(err)
	}
	if want := (forecast.Peak{FromMs: from + 44*60_000 + 30_000, Tasks: 4, Exact: true}); f.Peak != want {
		t.Errorf("busiest second with a budget of 3: %+v, want %+v", f.Peak, want)
	}

	// From now by the Redis clock, and a step of an hour split twice.
	f, err = forecast.Read(ctx, rdb, forecast.Options{Prefix: prefix, Queue: "orders", Shards: all(8), Refine: 2},
		forecast.Window{Span: 2 * time.Hour, Step: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if now := time.Now().UnixMilli(); f.FromMs < now-5000 || f.FromMs > now+5000 || f.Peak.Tasks != 5000 || !f.Peak.Exact {
		t.Errorf("from now by an hour: from %d (now %d), busiest second %+v", f.FromMs, now, f.Peak)
	}

	// A broken shard is named; the others are counted.
	b := shard.Keys{Prefix: prefix, Queue: "broken"}
	rdb.Set(ctx, b.Pending(1), "not a sorted set", 0)
	rdb.ZAdd(ctx, b.Pending(0), redis.Z{Score: float64(from + 1000), Member: "x"})
	f, err = forecast.Read(ctx, rdb, forecast.Options{Prefix: prefix, Queue: "broken", Shards: all(2), Refine: 1},
		forecast.Window{FromMs: from, Span: time.Minute, Step: time.Minute})
	if err != nil || f.Total != 1 || len(f.Broken) != 1 || f.Broken[0].Shard != 1 ||
		f.Broken[0].Err != "shard 1: WRONGTYPE key "+b.Pending(1)+" is not a sorted set" {
		t.Errorf("with a broken shard: %+v, %v", f, err)
	}

	for _, w := range []forecast.Window{{Span: time.Hour, Step: 1500 * time.Millisecond}, {Span: 90 * time.Second, Step: time.Minute},
		{Span: 25 * time.Hour, Step: time.Minute}, {Span: 61 * time.Minute, Step: 61 * time.Second}} {
		if _, err := forecast.Read(ctx, rdb, opt, w); err == nil {
			t.Errorf("window %s by %s: no error", w.Span, w.Step)
		}
	}
}

// TestForecastCluster counts the same spread on a Redis Cluster, whose
// shards live on three primaries.
func TestForecastCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	rdb := c.Client()
	prefix := testenv.Name(t)
	k := shard.Keys{Prefix: prefix, Queue: "orders"}
	from := (time.Now().UnixMilli()/60_000 + 1) * 60_000
	s := newSpread(from, 500)
	s.write(t, rdb, k, 16)
	f, err := forecast.Read(context.Background(), rdb, forecast.Options{Prefix: prefix, Queue: "orders", Shards: all(16), Refine: 1},
		forecast.Window{FromMs: from, Span: time.Hour, Step: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s.check(t, f)
}

// TestForecastSparseDense counts the same tasks, scored on and next to
// bucket edges (fractional scores too), once in a shard sparse enough for
// its scores to be read and bucketed in the script and once among filler
// that makes it count bucket by bucket: both give the counts reckoned
// here.
func TestForecastSparseDense(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, rdb, prefix)
	from := (time.Now().UnixMilli()/1000 + 100) * 1000
	const n, width = 10, 1000
	scores := []float64{float64(from) - 0.5, float64(from), float64(from) + 0.25, float64(from + 999), float64(from) + 999.75,
		float64(from + 1000), float64(from + 4500), float64(from + 9999), float64(from) + 9999.5, float64(from + 10_000)}
	want := make([]int64, n)
	for _, sc := range scores {
		if k := int((sc - float64(from)) / width); sc >= float64(from) && k < n {
			want[k]++
		}
	}
	for _, c := range []struct {
		name   string
		filler int // tasks in the window besides scores, all in the last bucket
	}{{"sparse", 0}, {"dense", 200}} {
		k := shard.Keys{Prefix: prefix, Queue: c.name}
		for j, sc := range scores {
			rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: sc, Member: fmt.Sprintf("t%d", j)})
		}
		for j := range c.filler {
			rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: float64(from + 9000 + int64(j)), Member: fmt.Sprintf("f%d", j)})
		}
		f, err := forecast.Read(ctx, rdb, forecast.Options{Prefix: prefix, Queue: c.name, Shards: []int{0}},
			forecast.Window{FromMs: from, Span: n * time.Second, Step: time.Second})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for b := range n {
			w := want[b]
			if b == n-1 {
				w += int64(c.filler)
			}
			if got := f.Buckets[b].Tasks; got != w {
				t.Errorf("%s: bucket %d holds %d, want %d", c.name, b, got, w)
			}
		}
		if f.Overdue != 1 {
			t.Errorf("%s: %d overdue, want 1", c.name, f.Overdue)
		}
	}
}
