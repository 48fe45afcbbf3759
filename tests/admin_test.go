package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestPauseUnderTraffic pauses a queue while tasks fall due, with two
// instances: nothing is claimed while paused (pending only grows, nothing
// arrives, stats and the metric say paused), and after resume every task
// arrives, none lost.
func TestPauseUnderTraffic(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "hold", Shards: 8})
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	p1 := h.start()
	// The first instance sweeps the queue: it exports the queue's gauges.
	eventually(t, 15*time.Second, "the first instance to sweep the queue", func() bool {
		v, _ := queueMetric(addr, "dispatcher_sweeper", "hold")
		return v == 1
	})
	delete(h.extra, "DISPATCHER_HTTP_ADDR")
	p2 := h.start()
	waitLogged(t, p1, "broker connected", 15*time.Second)
	waitLogged(t, p2, "broker connected", 15*time.Second)
	env := h.env()

	want := scheduleSpread(t, h.producer("hold"), "p", 600, time.Now().Add(500*time.Millisecond), 6*time.Second)
	var pausedAt, resumedAt time.Time
	o := verifyWhile(h, "hold", want, 60*time.Second, 0, func() {
		time.Sleep(2 * time.Second)
		out, errOut, code := runCLI(t, env, "pause", "--queue", "hold")
		pausedAt = time.Now()
		if code != 0 || !strings.Contains(out, "paused") {
			t.Fatalf("pause: exit %d %q %q", code, out, errOut)
		}
		// A claim that passed the flag just before the pause may still be
		// publishing: look from a moment after.
		time.Sleep(300 * time.Millisecond)
		k := shard.Keys{Prefix: h.prefix, Queue: "hold"}
		before := pendingAndInflight(h, k, 8)
		time.Sleep(3 * time.Second)
		after := pendingAndInflight(h, k, 8)
		if after[0] < before[0] || after[1] != 0 {
			t.Errorf("while paused: pending %d -> %d, in flight %d: something was claimed", before[0], after[0], after[1])
		}
		out, _, _ = runCLI(t, env, "stats", "--queue", "hold")
		if !strings.Contains(out, "queue hold is PAUSED (8 of 8 shards)") {
			t.Errorf("stats does not say the queue is paused:\n%s", out)
		}
		eventually(t, 5*time.Second, "dispatcher_queue_paused to be 1", func() bool {
			v, _ := queueMetric(addr, "dispatcher_queue_paused", "hold")
			return v == 1
		})
		if _, _, code := runCLI(t, env, "resume", "--queue", "hold"); code != 0 {
			t.Fatalf("resume: exit %d", code)
		}
		resumedAt = time.Now()
	})
	if o.Missing > 0 {
		t.Fatalf("%d tasks missing after resume", o.Missing)
	}
	t.Logf("PAUSE: paused for %s; %d of %d delivered after resume, worst lateness %s",
		resumedAt.Sub(pausedAt).Round(time.Millisecond), o.Delivered, len(want), o.WorstLate)
}

// pendingAndInflight sums a queue's pending and in-flight tasks.
func pendingAndInflight(h *harness, k shard.Keys, shards int) [2]int64 {
	ctx := context.Background()
	var out [2]int64
	for i := 0; i < shards; i++ {
		out[0] += h.rdb.ZCard(ctx, k.Pending(i)).Val()
		out[1] += h.rdb.ZCard(ctx, k.Inflight(i)).Val()
	}
	return out
}

// TestScheduleCancelAndDeadLetters drives the other commands as an
// operator would: schedule (and the task arrives with the message_id the
// command printed), cancel, and dead letters listed, requeued with their
// original message_id, purged only with --yes; and their bad input.
func TestScheduleCancelAndDeadLetters(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t, queueSpec{Name: "ops", Shards: 4})
	h.extra["DISPATCHER_MAX_MESSAGE_BYTES"] = "1000"
	p := h.start()
	waitLogged(t, p, "broker connected", 15*time.Second)
	env := h.env()
	k := shard.Keys{Prefix: h.prefix, Queue: "ops"}

	// schedule, with --json, arrives with the printed message_id.
	out, errOut, code := runCLI(t, env, "schedule", "--queue", "ops", "--in", "1s", "--json", "hello")
	var sch struct {
		MessageID string `json:"message_id"`
		Shard     int    `json:"shard"`
	}
	if err := json.Unmarshal([]byte(out), &sch); code != 0 || err != nil {
		t.Fatalf("schedule: exit %d %v %q %q", code, err, out, errOut)
	}
	got := h.collect("ops", 1, 10*time.Second)
	if len(got) != 1 || got[0].d.MessageId != sch.MessageID || string(got[0].d.Body) != "hello" {
		t.Fatalf("scheduled task arrived as %+v, want message_id %s", got, sch.MessageID)
	}

	// cancel: a pending task goes; one not pending says so.
	if _, _, code := runCLI(t, env, "schedule", "--queue", "ops", "--at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "later"); code != 0 {
		t.Fatal("schedule --at failed")
	}
	if out, _, code := runCLI(t, env, "cancel", "--queue", "ops", "later"); code != 0 || !strings.Contains(out, "cancelled") {
		t.Errorf("cancel: exit %d %q", code, out)
	}
	if _, errOut, code := runCLI(t, env, "cancel", "--queue", "ops", "later"); code != 1 || !strings.Contains(errOut, "not pending") {
		t.Errorf("second cancel: exit %d %q, want 1 saying not pending", code, errOut)
	}

	// Dead letters, as the daemon writes them: "<due_ms>:<member>" with a reason.
	due := time.Now().Add(-time.Hour).UnixMilli()
	for _, m := range []string{"poison-a", "poison-b"} {
		i := shard.Index([]byte(m), 4)
		e := fmt.Sprintf("%d:%s", due, m)
		h.rdb.ZAdd(ctx, k.Dead(i), redis.Z{Score: float64(due), Member: e})
		h.rdb.HSet(ctx, k.DeadReason(i), e, "refused by the broker (after 5 attempts)")
	}
	out, _, code = runCLI(t, env, "dead", "list", "--queue", "ops")
	if code != 0 || !strings.Contains(out, "poison-a") || !strings.Contains(out, "refused by the broker") || !strings.Contains(out, "2 dead letters") {
		t.Errorf("dead list: exit %d\n%s", code, out)
	}
	if _, errOut, code := runCLI(t, env, "dead", "purge", "--queue", "ops", "poison-b"); code != 2 || !strings.Contains(errOut, "--yes") {
		t.Errorf("purge without --yes: exit %d %q, want 2", code, errOut)
	}
	if _, errOut, code := runCLI(t, env, "dead", "requeue", "--queue", "ops", "never-dead"); code != 1 || !strings.Contains(errOut, "not dead") {
		t.Errorf("requeue of a member not dead: exit %d %q, want 1 saying so", code, errOut)
	}
	out, _, code = runCLI(t, env, "dead", "requeue", "--queue", "ops", "poison-a")
	wantID := shard.MessageID([]byte("poison-a"), due)
	if code != 0 || !strings.Contains(out, wantID) {
		t.Errorf("requeue: exit %d %q", code, out)
	}
	got = h.collect("ops", 1, 10*time.Second)
	if len(got) != 1 || got[0].d.MessageId != wantID {
		t.Errorf("requeued task arrived as %v, want its original message_id %s", got, wantID)
	}
	// A dead body that is pending again (rescheduled since) is left alone:
	// requeueing it would move that scheduling.
	if err := h.producer("ops").Schedule(ctx, []byte("poison-b"), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runCLI(t, env, "dead", "requeue", "--queue", "ops", "poison-b"); code != 1 || !strings.Contains(errOut, "pending already") {
		t.Errorf("requeue of a dead body pending again: exit %d %q, want 1 saying so", code, errOut)
	}
	if s := h.rdb.ZScore(ctx, k.Pending(shard.Index([]byte("poison-b"), 4)), "poison-b").Val(); s < float64(time.Now().Add(59*time.Minute).UnixMilli()) {
		t.Errorf("the rescheduled task's due time was moved to %v", s)
	}
	if out, _, code := runCLI(t, env, "dead", "purge", "--queue", "ops", "--all", "--yes"); code != 0 || !strings.Contains(out, "1 purged") {
		t.Errorf("purge --all --yes: exit %d %q", code, out)
	}
	if out, _, _ := runCLI(t, env, "dead", "list", "--queue", "ops", "--json"); !strings.Contains(out, `"dead": []`) {
		t.Errorf("dead letters left after purge: %s", out)
	}

	bad := map[string][]string{
		"--in \"soon\": not a duration":     {"schedule", "--queue", "ops", "--in", "soon", "x"},
		"--at \"tomorrow\": not a time":     {"schedule", "--queue", "ops", "--at", "tomorrow", "x"},
		"give one of --in":                  {"schedule", "--queue", "ops", "x"},
		"over DISPATCHER_MAX_MESSAGE_BYTES": {"schedule", "--queue", "ops", "--in", "1m", strings.Repeat("x", 1001)},
		"not one of DISPATCHER_QUEUES":      {"pause", "--queue", "nope"},
		"--queue is required":               {"resume"},
		"unknown command \"show\"":          {"dead", "show", "--queue", "ops"},
		"flag provided but not defined":     {"cancel", "--queue", "ops", "--force", "x"},
		"--shard 9: queue ops has shards 0": {"dead", "list", "--queue", "ops", "--shard", "9"},
	}
	for want, args := range bad {
		_, errOut, code := runCLI(t, env, args...)
		if code != 2 || !strings.Contains(errOut, want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("dispatcher %s: exit %d, %q; want 2 and one line saying %q", strings.Join(args[:min(len(args), 4)], " "), code, errOut, want)
		}
	}
	// A shard count configured otherwise than recorded: the recorded one
	// is used (Redis is the truth), with a one-line warning naming both.
	e := maps.Clone(env)
	e[config.QueuePrefix("ops")+"_SHARDS"] = "5"
	if _, errOut, code := runCLI(t, e, "pause", "--queue", "ops"); code != 0 ||
		!strings.Contains(errOut, "DISPATCHER_QUEUE_OPS_SHARDS=5, but queue ops has 4 shards recorded") {
		t.Errorf("pause with SHARDS=5, 4 recorded: exit %d, %q", code, errOut)
	}
	for i := 0; i < 5; i++ {
		if paused := h.rdb.Exists(ctx, k.Paused(i)).Val() == 1; paused != (i < 4) {
			t.Errorf("shard %d paused: %v; want the 4 recorded shards paused", i, paused)
		}
	}
	if _, errOut, code := runCLI(t, env, "resume", "--queue", "ops"); code != 0 {
		t.Errorf("resume: exit %d, %q", code, errOut)
	}
	big := strings.Repeat("x", 1001)
	if err := h.rdb.ZScore(ctx, k.Pending(shard.Index([]byte(big), 4)), big).Err(); err != redis.Nil {
		t.Errorf("a rejected schedule left its task pending (%v)", err)
	}
}
