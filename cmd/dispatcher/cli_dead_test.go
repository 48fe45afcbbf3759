package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// TestLongBodiesCutInTables: a long body is cut in dead list's table and
// in what dead requeue prints, saying how long it is; --json keeps it
// whole; a short one shows as it is.
func TestLongBodiesCutInTables(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 2)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	ctx := context.Background()
	long := `{"order":"` + strings.Repeat("x", 500) + `"}`
	for _, body := range []string{long, "short"} {
		e := "1800000000000:" + body
		i := shard.Index([]byte(body), 2)
		rdb.ZAdd(ctx, k.Dead(i), redis.Z{Score: 1_800_000_000_000, Member: e})
		rdb.HSet(ctx, k.DeadReason(i), e, "nacked")
	}
	cut := shortBody(long, bodyWidth)
	if !strings.HasPrefix(cut, `"{\"order\":\"xxx`) || !strings.HasSuffix(cut, `"… (512 bytes)`) || len([]rune(cut)) > bodyWidth+len("… (512 bytes)") {
		t.Fatalf("shortBody = %q", cut)
	}
	out, _, code := runCLI(t, "dead", "list", "--queue", "q")
	if code != exitOK || !strings.Contains(out, cut) || strings.Contains(out, strings.Repeat("x", 100)) || !strings.Contains(out, `"short"`) || !strings.Contains(out, "\n2 dead letters\n") {
		t.Errorf("dead list: exit %d\n%s", code, out)
	}
	out, _, _ = runCLI(t, "dead", "list", "--queue", "q", "--json")
	if !strings.Contains(out, strings.Repeat("x", 500)) {
		t.Errorf("dead list --json does not give the body whole:\n%s", out)
	}
	out, _, code = runCLI(t, "dead", "requeue", "--queue", "q", long)
	if code != exitOK || !strings.HasPrefix(out, "requeued shard ") || !strings.Contains(out, cut+" message_id ") || strings.Contains(out, strings.Repeat("x", 100)) {
		t.Errorf("dead requeue: exit %d\n%s", code, out)
	}
	out, _, _ = runCLI(t, "dead", "requeue", "--queue", "q", "--json", "short")
	var r struct {
		Requeued []json.RawMessage `json:"requeued"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.Requeued) != 1 {
		t.Errorf("dead requeue --json: %v\n%s", err, out)
	}
	out, _, _ = runCLI(t, "dead", "list", "--queue", "q")
	if !strings.Contains(out, "\n0 dead letters\n") {
		t.Errorf("dead list when none are left:\n%s", out)
	}
}

func TestPluralAndShortBody(t *testing.T) {
	for n, want := range map[int]string{0: "0 recurring schedules", 1: "1 recurring schedule", 2: "2 recurring schedules"} {
		if got := plural(n, "recurring schedule", "recurring schedules"); got != want {
			t.Errorf("plural(%d) = %q, want %q", n, got, want)
		}
	}
	for body, want := range map[string]string{
		"hello":                    `"hello"`,
		"tab\there":                `"tab\there"`,
		strings.Repeat("é", 100):   `"` + strings.Repeat("é", 58) + `"… (200 bytes)`,
		strings.Repeat("\x00", 30): `"` + strings.Repeat(`\x00`, 14) + `"… (30 bytes)`,
	} {
		if got := shortBody(body, 60); got != want {
			t.Errorf("shortBody(%q) = %q, want %q", body, got, want)
		}
	}
}

// TestRecurringListCount: one schedule is "1 recurring schedule".
func TestRecurringListCount(t *testing.T) {
	prefix, rdb := cliEnv(t, map[string]string{"DISPATCHER_QUEUES": "q", "DISPATCHER_QUEUE_Q_SHARDS": "2", "DISPATCHER_QUEUE_Q_EXCHANGE": "x"})
	recordShards(t, rdb, prefix, "q", 2)
	if out, errOut, code := runCLI(t, "recurring", "add", "--queue", "q", "--name", "hourly", "--cron", "@hourly", "tick"); code != exitOK {
		t.Fatalf("recurring add: exit %d %q %q", code, out, errOut)
	}
	out, _, code := runCLI(t, "recurring", "list")
	if code != exitOK || !strings.HasSuffix(out, "\n1 recurring schedule\n") {
		t.Errorf("recurring list: exit %d\n%s", code, out)
	}
}
