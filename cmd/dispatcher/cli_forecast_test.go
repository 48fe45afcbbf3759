package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// TestStatsForecast: `stats --forecast` over 4 shards with a herd of
// 5,000 tasks in one second 10 minutes ahead, 3 overdue tasks and one
// task a minute: the table with its bars, the busiest second named a
// herd for a queue draining 100/s, the same in JSON, and bad windows.
func TestStatsForecast(t *testing.T) {
	prefix, rdb := cliEnv(t, map[string]string{"DISPATCHER_QUEUES": "fc", "DISPATCHER_QUEUE_FC_DRAIN_RATE": "100"})
	recordShards(t, rdb, prefix, "fc", 4)
	ctx := context.Background()
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	now := tm.UnixMilli() / 1000 * 1000
	herd := now + 10*60_000 + 30_000
	k := shard.Keys{Prefix: prefix, Queue: "fc"}
	pipe := rdb.Pipeline()
	add := func(m string, at int64) {
		pipe.ZAdd(ctx, k.Pending(shard.Index([]byte(m), 4)), redis.Z{Score: float64(at), Member: m})
	}
	for j := range 5000 {
		add(fmt.Sprint("herd-", j), herd+int64(j%500))
	}
	for j := range 60 {
		add(fmt.Sprint("min-", j), now+int64(j)*60_000+45_000)
	}
	for j := range 3 {
		add(fmt.Sprint("late-", j), now-60_000)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := runCLI(t, "stats", "--forecast")
	t.Logf("%s", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(out, "\n")
	if len(lines) < 66 || !strings.HasPrefix(lines[0], "queue fc: tasks falling due per 1m over the next 1h, from ") ||
		lines[1] != "overdue (due before it, not yet claimed): 3" {
		t.Errorf("head of the table:\n%s", out)
	}
	// A row is "[date] time count bar": the date is shown when the
	// window crosses midnight, so read the row from its end.
	row := func(i int) (count, bar string) {
		f := strings.Fields(lines[i])
		if len(f) < 3 {
			return "", ""
		}
		return f[len(f)-2], f[len(f)-1]
	}
	if n, bar := row(3 + 10); n != "5001" || len(bar) != 40*len("█") {
		t.Errorf("the herd's minute: %q", lines[3+10])
	}
	if n, bar := row(3); n != "1" || bar != "█" {
		t.Errorf("the first minute: %q", lines[3])
	}
	for _, want := range []string{"total: 5060\n", "busiest second: 5000 tasks at ",
		"THUNDERING HERD: more than queue fc drains in 10 s at 100/s (DRAIN_RATE): 1000"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// 10m30s after the second the test read; the command reads the clock
	// again, a second later on a loaded machine.
	if !strings.Contains(out, "(10m30s ahead)") && !strings.Contains(out, "(10m29s ahead)") {
		t.Errorf("the herd not 10m30s (or 10m29s) ahead in:\n%s", out)
	}

	out, errOut, code = runCLI(t, "stats", "--forecast", "--window", "20m", "--step", "10m", "--json")
	var doc struct {
		Forecasts []struct {
			Queue   string
			FromMs  int64 `json:"from_ms"`
			StepMs  int64 `json:"step_ms"`
			Overdue int64
			Total   int64
			Buckets []struct{ FromMs, Tasks int64 }
			Peak    struct {
				FromMs int64 `json:"from_ms"`
				Tasks  int64
				Exact  bool
			} `json:"peak_second"`
			HerdLimit int64 `json:"herd_limit"`
			Herd      bool
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s%s", code, err, out, errOut)
	}
	if len(doc.Forecasts) != 1 {
		t.Fatalf("JSON: %s", out)
	}
	f := doc.Forecasts[0]
	if f.Queue != "fc" || f.StepMs != 600_000 || len(f.Buckets) != 2 || f.Buckets[0].Tasks != 10 || f.Buckets[1].Tasks != 5010 ||
		f.Overdue != 3 || f.Peak.Tasks != 5000 || f.Peak.FromMs != herd || !f.Peak.Exact || !f.Herd || f.HerdLimit != 1000 {
		t.Errorf("JSON: %+v\n%s", f, out)
	}

	for _, args := range [][]string{{"--forecast", "--step", "1500ms"}, {"--forecast", "--window", "90s"}, {"--window", "10m"}} {
		if _, errOut, code := runCLI(t, append([]string{"stats"}, args...)...); code != 2 {
			t.Errorf("stats %v: exit %d, want 2: %s", args, code, errOut)
		}
	}
}
