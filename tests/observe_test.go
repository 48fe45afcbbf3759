package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// runCLI runs the dispatcher binary with args and env (on a clean
// environment, as start does) and returns its output and exit code.
func runCLI(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = childEnv(env)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("dispatcher %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

// queueMetric reads one queue's sample from /metrics; ok is false while it
// is not exported.
func queueMetric(addr, name, queue string) (float64, bool) {
	return tryMetric(addr, fmt.Sprintf("%s{queue=%q}", name, queue))
}

// TestStallWatchdog blocks the broker under traffic and watches the queue
// stall and recover as an operator would: the oldest due age grows, the
// watchdog logs at error level what the queue waits on, /readyz and
// dispatcher_queue_stalled report it; after the block every task arrives,
// the metrics fall back and the recovery is logged.
func TestStallWatchdog(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	addr := testenv.FreeAddr(t)
	h, p := dispatchOnNode(t, node, "stall", map[string]string{
		"DISPATCHER_HTTP_ADDR":      addr,
		"DISPATCHER_STALL_AFTER":    "2s",
		"DISPATCHER_STATS_INTERVAL": "1s",
	})
	eventually(t, 10*time.Second, "the sweeping instance to export the queue's state", func() bool {
		v, ok := queueMetric(addr, "dispatcher_queue_stalled", "stall")
		return ok && v == 0
	})
	want := scheduleSpread(t, h.producer("stall"), "s", 300, time.Now().Add(3*time.Second), 8*time.Second)

	var ages []float64
	var body string
	o := verifyWhile(h, "stall", want, 60*time.Second, 300, func() {
		time.Sleep(4 * time.Second) // some go out before the block
		if err := node.SetAlarm("memory"); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := node.ClearAlarm("memory"); err != nil {
				t.Error(err)
			}
		}()
		eventually(t, 20*time.Second, "the watchdog to report the stall on /readyz", func() bool {
			age, _ := queueMetric(addr, "dispatcher_queue_oldest_due_age_seconds", "stall")
			ages = append(ages, age)
			var code int
			code, body = readyz(addr)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "queue stall: stalled")
		})
		// Once more, still blocked: the read that reported the stall may
		// have come between the last sample and /readyz (reads are a
		// second apart, the stall is at 2 s: the sample before it may be
		// under 1 s).
		age, _ := queueMetric(addr, "dispatcher_queue_oldest_due_age_seconds", "stall")
		ages = append(ages, age)
		if !strings.Contains(body, "waiting on: the broker blocks publishes") {
			t.Errorf("/readyz does not say what the queue waits on:\n%s", body)
		}
		if v, _ := queueMetric(addr, "dispatcher_queue_stalled", "stall"); v != 1 {
			t.Errorf("dispatcher_queue_stalled = %v while /readyz reports the stall, want 1", v)
		}
		if v, _ := queueMetric(addr, "dispatcher_queue_due_tasks", "stall"); v < 1 {
			t.Errorf("dispatcher_queue_due_tasks = %v while stalled", v)
		}
		stall := grep(p.out.String(), "queue stalled")
		if !strings.Contains(stall, "level=ERROR") || !strings.Contains(stall, "queue=stall") ||
			!strings.Contains(stall, "the broker blocks publishes") || !strings.Contains(stall, "late_shards=") {
			t.Errorf("stall log line: %q", stall)
		}
	})
	if o.Missing > 0 {
		t.Fatalf("%d tasks never arrived after the stall", o.Missing)
	}
	grew := false
	for n := 1; n < len(ages); n++ {
		grew = grew || ages[n] > ages[0]+1
	}
	if !grew {
		t.Errorf("oldest due age did not grow while the broker blocked: %v", ages)
	}
	eventually(t, 10*time.Second, "the stall to clear from /readyz and the metric", func() bool {
		v, _ := queueMetric(addr, "dispatcher_queue_stalled", "stall")
		return readyStatus(addr) == http.StatusOK && v == 0
	})
	if age, _ := queueMetric(addr, "dispatcher_queue_oldest_due_age_seconds", "stall"); age != 0 {
		t.Errorf("oldest due age %v s after everything was delivered, want 0", age)
	}
	waitLogged(t, p, "queue no longer stalled", 5*time.Second)
	t.Logf("stall: ages seen %v s; /readyz said:\n%s", ages, body)
}

// TestStatsCommand runs `dispatcher stats` as an operator would, on a queue
// with pending, due-later, dead and broken shards, beside a running
// instance: the human table, the JSON, and bad input.
func TestStatsCommand(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, queueSpec{Name: "st", Shards: 4}, queueSpec{Name: "other", Shards: 2})
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	k := shard.Keys{Prefix: h.prefix, Queue: "st"}
	prod := h.producer("st")
	for i, n := 0, 0; n < 10; i++ {
		m := []byte(fmt.Sprint("later-", i))
		if shard.Index(m, 4) == 3 {
			continue // shard 3 is to be broken
		}
		if err := prod.Schedule(ctx, m, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	h.rdb.ZAdd(ctx, k.Dead(0), redis.Z{Score: 1, Member: "1:gone"})
	h.rdb.Set(ctx, k.Pending(3), "oops", 0) // shard 3 broken
	env := h.env()

	eventually(t, 10*time.Second, "stats to name the sweeping instance", func() bool {
		out, _, code := runCLI(t, env, "stats", "--json")
		return code == 0 && !strings.Contains(out, `"sweeper": ""`)
	})
	out, errOut, code := runCLI(t, env, "stats")
	if code != 0 {
		t.Fatalf("stats exited %d: %s", code, errOut)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			rows[f[0]+"/"+f[1]] = f
		}
	}
	if r := rows["st/all"]; len(r) < 7 || r[2] != "10" || r[3] != "0" || r[6] != "1" {
		t.Errorf("st sums row %q, want 10 pending, 0 due, 1 dead\n%s", r, out)
	}
	if r := rows["st/3"]; len(r) < 3 || r[2] != "BROKEN" {
		t.Errorf("st shard 3 row %q, want BROKEN\n%s", r, out)
	}
	for _, s := range []string{"st/0", "st/1", "st/2", "other/all", "other/0", "other/1"} {
		if rows[s] == nil {
			t.Errorf("no row %s: a broken shard hid the others\n%s", s, out)
		}
	}
	if !strings.Contains(out, "queue st shard 3 is broken: WRONGTYPE key "+k.Pending(3)+" holds a string") ||
		!strings.Contains(out, "queue st is swept by ") {
		t.Errorf("stats notes:\n%s", out)
	}

	out, _, code = runCLI(t, env, "stats", "--queue", "st", "--json")
	var doc struct {
		Queues []struct {
			Queue   string `json:"queue"`
			Pending int64  `json:"pending"`
			Dead    int64  `json:"dead"`
			Broken  int    `json:"broken_shards"`
			Sweeper string `json:"sweeper"`
			Shards  []struct {
				Shard     int    `json:"shard"`
				Pending   int64  `json:"pending"`
				NextDueMs int64  `json:"next_due_ms"`
				Err       string `json:"error"`
			} `json:"shards"`
		} `json:"queues"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("stats --json: exit %d, %v\n%s", code, err, out)
	}
	if len(doc.Queues) != 1 {
		t.Fatalf("--queue st gave %d queues", len(doc.Queues))
	}
	q := doc.Queues[0]
	if q.Queue != "st" || q.Pending != 10 || q.Dead != 1 || q.Broken != 1 || len(q.Shards) != 4 || q.Shards[3].Err == "" || q.Sweeper == "" {
		t.Errorf("stats --json: %+v", q)
	}
	for _, s := range q.Shards[:3] {
		if s.Pending > 0 && s.NextDueMs < time.Now().Add(59*time.Minute).UnixMilli() {
			t.Errorf("shard %d next due %d, want about an hour ahead", s.Shard, s.NextDueMs)
		}
	}

	bad := map[string][]string{
		"not one of DISPATCHER_QUEUES":  {"stats", "--queue", "nope"},
		"flag provided but not defined": {"stats", "--bogus"},
		`unexpected argument "extra"`:   {"stats", "extra"},
		`unknown argument "statz"`:      {"statz"},
	}
	for want, args := range bad {
		_, errOut, code := runCLI(t, env, args...)
		if code != 2 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("dispatcher %s: exit %d, %q; want 2 and one line saying %q", strings.Join(args, " "), code, errOut, want)
		}
	}
	// Redis that cannot be reached: exit 1, and the password stays hidden.
	env["DISPATCHER_REDIS_URL"] = "redis://:s3cretPW@" + testenv.FreeAddr(t) + "/0"
	_, errOut, code = runCLI(t, env, "stats")
	if code != 1 || strings.Contains(errOut, "s3cretPW") || !strings.Contains(errOut, "xxxxx") {
		t.Errorf("stats on an unreachable Redis: exit %d, %q; want 1 with the password hidden", code, errOut)
	}
}
