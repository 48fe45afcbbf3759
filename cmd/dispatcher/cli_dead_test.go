package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strconv"
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

// TestDeadCommandsWithIDs: dead list shows a dead task's id, body and
// properties (table and --json); dead requeue ID puts body and properties
// back under the id; one whose id is pending again is left dead (exit 1),
// the pending one keeping its body; dead purge leaves no field.
func TestDeadCommandsWithIDs(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 2)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	ctx := context.Background()
	kill := func(id string, due int64, body, props string) int {
		i := shard.Index([]byte(id), 2)
		e := strconv.FormatInt(due, 10) + ":" + id
		rdb.ZAdd(ctx, k.Dead(i), redis.Z{Score: float64(due), Member: e})
		rdb.HSet(ctx, k.DeadReason(i), e, "nacked")
		rdb.HSet(ctx, k.ClaimedBody(i), e, body)
		if props != "" {
			rdb.HSet(ctx, k.ClaimedProps(i), e, props)
		}
		return i
	}
	ia := kill("order-1", 1_800_000_000_000, "body one", `{"headers":{"tenant":"acme"}}`)
	ib := kill("order-2", 1_800_000_000_001, "body two", "")
	kill("order-3", 1_800_000_000_002, "body three", `{"type":"t"}`)

	out, _, code := runCLI(t, "dead", "list", "--queue", "q")
	if code != exitOK || !strings.Contains(out, "ID") || !strings.Contains(out, "PROPERTIES") ||
		!regexp.MustCompile(`"order-1"\s+"body one"\s+\{"headers":\{"tenant":"acme"\}\}\s+nacked`).MatchString(out) ||
		!regexp.MustCompile(`"order-2"\s+"body two"\s+-\s+nacked`).MatchString(out) {
		t.Errorf("dead list: exit %d\n%s", code, out)
	}
	out, _, _ = runCLI(t, "dead", "list", "--queue", "q", "--json")
	var page struct {
		Dead []struct {
			ID         string          `json:"id"`
			Body       string          `json:"body"`
			Properties json.RawMessage `json:"properties"`
		} `json:"dead"`
	}
	var compact bytes.Buffer
	if err := json.Unmarshal([]byte(out), &page); err != nil || len(page.Dead) != 3 || page.Dead[0].ID != "order-1" || page.Dead[0].Body != "body one" ||
		json.Compact(&compact, page.Dead[0].Properties) != nil || compact.String() != `{"headers":{"tenant":"acme"}}` || page.Dead[1].Properties != nil {
		t.Errorf("dead list --json: %v\n%s", err, out)
	}

	out, _, code = runCLI(t, "dead", "requeue", "--queue", "q", "order-1")
	if code != exitOK || !strings.Contains(out, `requeued shard `+strconv.Itoa(ia)+` id "order-1" message_id`) {
		t.Errorf("dead requeue order-1: exit %d\n%s", code, out)
	}
	if rdb.HGet(ctx, k.Tasks(ia), "order-1").Val() != "body one" || rdb.HGet(ctx, k.Props(ia), "order-1").Val() != `{"headers":{"tenant":"acme"}}` {
		t.Errorf("after the requeue: tasks %v, props %v", rdb.HGetAll(ctx, k.Tasks(ia)).Val(), rdb.HGetAll(ctx, k.Props(ia)).Val())
	}
	if rdb.HExists(ctx, k.ClaimedBody(ia), "1800000000000:order-1").Val() || rdb.HExists(ctx, k.ClaimedProps(ia), "1800000000000:order-1").Val() {
		t.Error("the requeued entry's claimed fields are left")
	}

	// order-2 scheduled again by its producer: the requeue leaves it.
	rdb.ZAdd(ctx, k.Pending(ib), redis.Z{Score: 1_900_000_000_000, Member: "order-2"})
	rdb.HSet(ctx, k.Tasks(ib), "order-2", "newer body")
	_, errOut, code := runCLI(t, "dead", "requeue", "--queue", "q", "order-2")
	if code != exitFailure || !strings.Contains(errOut, "pending already") {
		t.Errorf("dead requeue of a pending-again id: exit %d, %q", code, errOut)
	}
	if rdb.HGet(ctx, k.Tasks(ib), "order-2").Val() != "newer body" || rdb.ZScore(ctx, k.Pending(ib), "order-2").Val() != 1_900_000_000_000 {
		t.Error("the newer scheduling of order-2 changed")
	}

	out, _, code = runCLI(t, "dead", "purge", "--queue", "q", "--yes", "--all")
	if code != exitOK || !strings.Contains(out, "2 purged") {
		t.Errorf("dead purge --all: exit %d\n%s", code, out)
	}
	for i := range 2 {
		if n := rdb.Exists(ctx, k.Dead(i), k.DeadReason(i), k.ClaimedBody(i), k.ClaimedProps(i)).Val(); n != 0 {
			t.Errorf("shard %d: %d dead-letter keys left after the purge", i, n)
		}
	}
	if rdb.HGet(ctx, k.Tasks(ib), "order-2").Val() != "newer body" {
		t.Error("the purge took the pending order-2's body")
	}
}
