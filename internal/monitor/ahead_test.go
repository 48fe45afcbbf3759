package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// readAheadNow is a refresh as if every queue's read and count of the
// minute ahead were due.
func readAheadNow(ctx context.Context, m *Monitor) {
	m.mu.Lock()
	for _, v := range m.queues {
		v.nextAhead = time.Time{}
	}
	m.mu.Unlock()
	readNow(ctx, m)
}

// TestHerdAhead: a herd of 5,000 tasks due in one second 40 s ahead, over
// 8 shards, on a queue that drains 100 a second: the gauges say what the
// next minute holds and its busiest second, the herd is warned of once
// however often it is counted again, and a queue whose tasks are all
// further ahead is not counted at all.
func TestHerdAhead(t *testing.T) {
	ctx := context.Background()
	// A private server: the count of script calls below is exact.
	rdb := testenv.StartRedis(t, testenv.RedisOptions{}).Client()
	prefix := testenv.Name(t)
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	herdAt := (tm.UnixMilli()/1000 + 40) * 1000
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	pipe := rdb.Pipeline()
	for j := range 5000 {
		m := fmt.Sprint("herd-", j)
		pipe.ZAdd(ctx, k.Pending(shard.Index([]byte(m), 8)), redis.Z{Score: float64(herdAt + int64(j%900)), Member: m})
	}
	for j := range 30 { // 30 more over the minute, one a second
		m := fmt.Sprint("even-", j)
		pipe.ZAdd(ctx, k.Pending(shard.Index([]byte(m), 8)), redis.Z{Score: float64(herdAt - 30_000 + int64(j)*1000 + 500), Member: m})
	}
	far := shard.Keys{Prefix: prefix, Queue: "far"}
	pipe.ZAdd(ctx, far.Pending(0), redis.Z{Score: float64(herdAt + 1_800_000), Member: "later"})
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	var log syncBuf
	m := New(rdb, Options{
		Queues: []queuestate.Target{{Name: "q", Shards: 8}, {Name: "far", Shards: 2}}, KeyPrefix: prefix,
		Interval: time.Second, StallAfter: time.Minute, Sweeping: func(string) bool { return true },
		DrainRate: func(q string) (float64, string) {
			if q == "q" {
				return 100, "MAX_RATE"
			}
			return 0, ""
		},
		Registerer: reg, Logger: slog.New(slog.NewTextHandler(&log, nil)),
	})
	readAheadNow(ctx, m)
	for name, want := range map[string]float64{
		"dispatcher_queue_due_next_minute_tasks": 5030,
		"dispatcher_queue_due_peak_second_tasks": 5000,
		"dispatcher_queue_herd_ahead":            1,
	} {
		if v, ok := gauge(t, reg, name, "q"); !ok || v != want {
			t.Errorf("%s{queue=q} = %v (exported %v), want %v", name, v, ok, want)
		}
		if v, ok := gauge(t, reg, name, "far"); !ok || v != 0 {
			t.Errorf("%s{queue=far} = %v (exported %v), want 0", name, v, ok)
		}
	}
	if a := m.queues[0].Ahead; a.Peak.FromMs != herdAt || !a.Peak.Exact {
		t.Errorf("busiest second %+v, want the herd's, at %d", a.Peak, herdAt)
	}
	// Again, the scripts loaded: the state read (one script call per
	// queue on one Redis), then one call per shard of q for the minute and
	// one for its seconds; none for far.
	before := scriptCalls(t, rdb)
	readAheadNow(ctx, m)
	if n := scriptCalls(t, rdb) - before; n != 2+8+8 {
		t.Errorf("%d script calls for a read and a count of the minute ahead, want 18", n)
	}
	readAheadNow(ctx, m)
	if n := strings.Count(log.String(), "thundering herd ahead"); n != 1 {
		t.Errorf("the herd was warned of %d times, want once:\n%s", n, log.String())
	}
	for _, want := range []string{"queue=q", "tasks=5000", "drain_rate=100", "drain_rate_from=MAX_RATE", "due_next_minute=5030",
		"due_at=" + time.UnixMilli(herdAt).UTC().Format("2006-01-02T15:04:05Z")} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the warning does not say %s:\n%s", want, log.String())
		}
	}
	// The herd gone (cancelled): no warning, gauge 0; another one warns.
	rdb.Del(ctx, k.Pending(0), k.Pending(1), k.Pending(2), k.Pending(3), k.Pending(4), k.Pending(5), k.Pending(6), k.Pending(7))
	readAheadNow(ctx, m)
	if v, _ := gauge(t, reg, "dispatcher_queue_herd_ahead", "q"); v != 0 {
		t.Errorf("herd_ahead %v after the herd was cancelled", v)
	}

	// The page's hour ahead.
	vs := m.Views(ctx)
	if f := vs[0].Forecast; f == nil || len(f.Buckets) != 60 || vs[1].Forecast.Total != 1 || vs[0].HerdLimit != 1000 || vs[1].HerdLimit != 10_000 {
		t.Errorf("page forecasts: %+v, %+v; herd limits %d, %d", vs[0].Forecast, vs[1].Forecast, vs[0].HerdLimit, vs[1].HerdLimit)
	}
}

// scriptCalls is how many EVALSHA and EVAL calls Redis has run.
func scriptCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, l := range strings.Split(info, "\r\n") {
		if strings.HasPrefix(l, "cmdstat_evalsha:calls=") || strings.HasPrefix(l, "cmdstat_eval:calls=") {
			var c int64
			fmt.Sscanf(l[strings.Index(l, "=")+1:], "%d", &c)
			n += c
		}
	}
	return n
}
