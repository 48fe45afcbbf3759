package tests

import (
	"context"
	"encoding/json"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestUndatedScores: tasks scored 0, -5, -inf or with seconds before 1973
// carry no real due time. While one waits in pending (sweeps an hour
// apart here, and no wake-up), the oldest due age and the stall watchdog
// count from when the sweeping instance first saw it, not from 1970: no
// alarm of 56 years, yet a task that really waits longer than
// DISPATCHER_STALL_AFTER is still a stall. Woken, they go out at once
// (-inf with due time 0), each warned of with its key, member and score.
func TestUndatedScores(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	q := queueSpec{Name: "undated", Shards: 1}
	h := newHarness(t, q)
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.extra["DISPATCHER_POLL_INTERVAL"] = "1h"
	h.extra["DISPATCHER_IDLE_POLL_INTERVAL"] = "1h"
	h.extra["DISPATCHER_STALL_AFTER"] = "4s"
	p := h.start()
	eventually(t, 20*time.Second, "the instance sweeping", func() bool {
		v, _ := queueMetric(addr, "dispatcher_sweeper", q.Name)
		return v == 1
	})
	// Its first sweeps done (the last some 2 s after the start): the next
	// is an hour away.
	time.Sleep(4 * time.Second)

	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	ctx := context.Background()
	odd := []struct {
		member string
		score  float64
		dueMs  int64 // what the message_id carries
	}{
		{"minus-five", -5, -5},
		{"zero", 0, 0},
		{"minus-infinity", math.Inf(-1), 0},
		{"seconds-1971", 5e7, 5e7},
	}
	want := map[string]int64{}
	for _, o := range odd {
		if err := h.rdb.ZAdd(ctx, k.Pending(0), redis.Z{Score: o.score, Member: o.member}).Err(); err != nil {
			t.Fatal(err)
		}
		want[shard.MessageID([]byte(o.member), o.dueMs)] = time.Now().UnixMilli()
	}
	eventually(t, 20*time.Second, "the state read with the tasks due", func() bool {
		v, _ := queueMetric(addr, "dispatcher_queue_due_tasks", q.Name)
		return v == float64(len(odd))
	})
	age, _ := queueMetric(addr, "dispatcher_queue_oldest_due_age_seconds", q.Name)
	if age > 60 {
		t.Errorf("oldest due age %.0f s just after the tasks were written: counted from 1970", age)
	}
	// Held longer than the 4 s threshold: a stall, from when first seen.
	eventually(t, 20*time.Second, "the stall reported", func() bool {
		v, _ := queueMetric(addr, "dispatcher_queue_stalled", q.Name)
		return v == 1
	})
	age, _ = queueMetric(addr, "dispatcher_queue_oldest_due_age_seconds", q.Name)
	if age < 4 || age > 60 {
		t.Errorf("oldest due age %.1f s once stalled, want the seconds since first seen", age)
	}
	for _, line := range strings.Split(p.out.String(), "\n") {
		if m := regexp.MustCompile(`oldest_due_age=(\S+)`).FindStringSubmatch(line); m != nil && strings.Contains(line, "stalled") {
			if d, err := time.ParseDuration(m[1]); err != nil || d > time.Minute {
				t.Errorf("stall logged with oldest_due_age %s: %s", m[1], line)
			}
		}
	}

	if err := h.rdb.Publish(ctx, k.Wake(), shard.WakeDue(0, time.Now().UnixMilli())).Err(); err != nil {
		t.Fatal(err)
	}
	h.verify(q.Name, want, 20*time.Second, 0)
	// Rate-limited: the first of the batch is named, with the due time
	// its in-flight entry carries (-inf's is 0).
	named := 0
	for _, line := range strings.Split(p.out.String(), "\n") {
		for _, o := range odd[:3] {
			if strings.Contains(line, "member="+o.member+" ") && strings.Contains(line, "score="+strconv.FormatInt(o.dueMs, 10)) &&
				strings.Contains(line, k.Pending(0)) && strings.Contains(line, "no real due time") {
				named++
			}
		}
	}
	if named != 1 {
		t.Errorf("%d warnings name an undated task with its key and score, want 1 (rate-limited):\n%s", named, tail(p.out.String(), 3000))
	}
}

// TestFarFutureScores: scores in microseconds (year 57970), nanoseconds
// and +inf wait in pending, never dispatched before their time (+inf
// never), and the sweeping instance warns of them with the key, member
// and score (the last of each shard's). `dispatcher list` shows +inf as
// never due, without a message_id, and stats counts them.
func TestFarFutureScores(t *testing.T) {
	t.Parallel() // mostly waiting: see the package comment
	q := queueSpec{Name: "far", Shards: 3}
	h := newHarness(t, q)
	p := h.start()
	k := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	ctx := context.Background()
	odd := []struct {
		member string
		score  float64
		shown  string // the score as the warning shows it
	}{
		{"micros", 1767225600000000, "1767225600000000"},
		{"nanos", 1767225600000000000, "1767225600000000000"},
		{"plus-infinity", math.Inf(1), "+inf"},
	}
	for n, o := range odd { // one a shard: each the last of its shard
		if err := h.rdb.ZAdd(ctx, k.Pending(n), redis.Z{Score: o.score, Member: o.member}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// A task due now goes out meanwhile: the queue works.
	now := time.Now()
	h.zadd(q, []byte("now"), float64(now.UnixMilli()))
	h.verify(q.Name, map[string]int64{shard.MessageID([]byte("now"), now.UnixMilli()): now.UnixMilli()}, 20*time.Second, 0)

	eventually(t, 30*time.Second, "a warning naming each far score's key, member and score", func() bool {
		out := p.out.String()
		for n, o := range odd {
			found := false
			for _, line := range strings.Split(out, "\n") {
				found = found || (strings.Contains(line, "member="+o.member) && strings.Contains(line, "score="+o.shown) &&
					strings.Contains(line, k.Pending(n)))
			}
			if !found {
				return false
			}
		}
		return true
	})
	if n := h.rdb.ZCard(ctx, k.Pending(0)).Val() + h.rdb.ZCard(ctx, k.Pending(1)).Val() + h.rdb.ZCard(ctx, k.Pending(2)).Val(); n != int64(len(odd)) {
		t.Errorf("%d tasks pending, want the %d far ones", n, len(odd))
	}

	out, _, code := runCLI(t, h.env(), "list", "--queue", q.Name, "--json")
	if code != 0 {
		t.Fatalf("list: exit %d\n%s", code, out)
	}
	var page struct {
		Tasks []struct {
			DueMs     *int64 `json:"due_ms"`
			Due       string `json:"due"`
			MessageID string `json:"message_id"`
			Body      string `json:"body"`
			Score     string `json:"score"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(out), &page); err != nil {
		t.Fatalf("list --json: %v\n%s", err, out)
	}
	if len(page.Tasks) != len(odd) {
		t.Fatalf("list shows %d tasks, want %d:\n%s", len(page.Tasks), len(odd), out)
	}
	for _, task := range page.Tasks {
		switch task.Body {
		case "plus-infinity":
			if task.DueMs != nil || task.Due != "never" || task.MessageID != "" || task.Score != "+inf" {
				t.Errorf("list shows +inf as due_ms %v, due %q, message_id %q, score %q; want null, never, none, +inf",
					task.DueMs, task.Due, task.MessageID, task.Score)
			}
		case "micros":
			year := strconv.Itoa(time.UnixMilli(1767225600000000).UTC().Year())
			if task.DueMs == nil || *task.DueMs != 1767225600000000 || !strings.HasPrefix(task.Due, year+"-") ||
				task.MessageID != shard.MessageID([]byte("micros"), 1767225600000000) {
				t.Errorf("list shows the µs score as %+v", task)
			}
		}
		if strings.Contains(task.MessageID, "--") {
			t.Errorf("list shows message_id %q for %s", task.MessageID, task.Body)
		}
	}
	stats, _, code := runCLI(t, h.env(), "stats", "--queue", q.Name)
	if code != 0 || !strings.Contains(stats, "after year 5138") {
		t.Errorf("stats (exit %d) does not tell of the far scores:\n%s", code, stats)
	}
}
