package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// TestScheduleByIDCommands: schedule --id with properties, reschedule
// --id, cancel --id, and show of a pending task, by the CLI, on what
// Redis then holds.
func TestScheduleByIDCommands(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "jobs", 8)
	ctx := context.Background()
	k := shard.Keys{Prefix: prefix, Queue: "jobs"}
	id := "order-42:timeout"
	i := shard.Index([]byte(id), 8)

	out, errOut, code := runCLI(t, "schedule", "--queue", "jobs", "--id", id, "--at", "1893456000000",
		"--header", "tenant=acme", "--header", "attempt=2", "--header", "urgent=true", "--header", "code=007x",
		"--routing-key", "orders.timeout", "--priority", "9", "--content-type", "application/json",
		"--correlation-id", "c-1", "--expiration", "90s", "--deadline", "1893456060000", "--json", `{"order":42}`)
	if code != exitOK {
		t.Fatalf("schedule --id: exit %d, %q %q", code, out, errOut)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(out), &res); err != nil || res["id"] != id || res["shard"] != float64(i) ||
		res["message_id"] != shard.MessageID([]byte(id), 1893456000000) {
		t.Fatalf("schedule --id --json: %v\n%s", err, out)
	}
	if s := rdb.ZScore(ctx, k.Pending(i), id).Val(); s != 1893456000000 {
		t.Fatalf("score %v", s)
	}
	if b := rdb.HGet(ctx, k.Tasks(i), id).Val(); b != `{"order":42}` {
		t.Fatalf("body %q", b)
	}
	props, err := shard.ParseProperties([]byte(rdb.HGet(ctx, k.Props(i), id).Val()))
	if err != nil {
		t.Fatal(err)
	}
	if props.Headers["tenant"] != "acme" || props.Headers["attempt"] != int64(2) || props.Headers["urgent"] != true ||
		props.Headers["code"] != "007x" || props.RoutingKey != "orders.timeout" || *props.Priority != 9 ||
		props.ContentType != "application/json" || props.CorrelationID != "c-1" || *props.ExpirationMs != 90000 ||
		*props.DeadlineMs != 1893456060000 {
		t.Fatalf("properties written: %+v", props)
	}

	out, errOut, code = runCLI(t, "show", "--queue", "jobs", id)
	if code != exitOK || !strings.HasPrefix(out, "pending in shard ") || !strings.Contains(out, "due 2030-01-01 00:00:00.000Z") ||
		!strings.Contains(out, `body (12 bytes): {"order":42}`) || !strings.Contains(out, `"tenant":"acme"`) {
		t.Fatalf("show of a pending task: exit %d, %q\n%s", code, errOut, out)
	}

	out, errOut, code = runCLI(t, "reschedule", "--queue", "jobs", "--id", id, "--at", "1893459600000")
	if code != exitOK || !strings.HasPrefix(out, "rescheduled on jobs") {
		t.Fatalf("reschedule --id: exit %d, %q %q", code, out, errOut)
	}
	out, _, code = runCLI(t, "reschedule", "--queue", "jobs", "--id", id, "--at", "1893459600000", "--json")
	if code != exitOK || !strings.Contains(out, `"rescheduled": false`) || !strings.Contains(out, `"pending": true`) {
		t.Fatalf("reschedule --id to its own time: exit %d\n%s", code, out)
	}
	if b := rdb.HGet(ctx, k.Tasks(i), id).Val(); b != `{"order":42}` || rdb.ZScore(ctx, k.Pending(i), id).Val() != 1893459600000 {
		t.Fatal("reschedule --id changed the body or did not move it")
	}

	if out, errOut, code = runCLI(t, "cancel", "--queue", "jobs", "--id", id); code != exitOK || out != "cancelled\n" {
		t.Fatalf("cancel --id: exit %d, %q %q", code, out, errOut)
	}
	if n := rdb.Exists(ctx, k.Pending(i), k.Tasks(i), k.Props(i)).Val(); n != 0 {
		t.Fatalf("cancel --id left %d of the shard's keys", n)
	}
	for _, args := range [][]string{
		{"cancel", "--queue", "jobs", "--id", id},
		{"reschedule", "--queue", "jobs", "--id", id, "--in", "1h"},
		{"show", "--queue", "jobs", id},
	} {
		if _, errOut, code := runCLI(t, args...); code != exitFailure || !strings.Contains(errOut, "not pending") {
			t.Errorf("%s of a cancelled id: exit %d, %q", strings.Join(args, " "), code, errOut)
		}
	}

	// Bad arguments: exit 2, naming the thing.
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--header", "a=b", "body"}, "--header is a property of a task with an id: add --id"},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "", "body"}, "--id: task id of 0 bytes"},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", strings.Repeat("x", 1025), "body"}, "task id of 1025 bytes"},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "a", "--priority", "300", "body"}, "--priority 300: want 0 to 255"},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "a", "--header", "x-task-id=b", "body"}, `"x-task-id" is reserved`},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "a", "--header", "novalue", "body"}, `--header "novalue": want NAME=VALUE`},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "a", "--header", "n=1", "--header", "n=2", "body"}, `header "n" given twice`},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "a", "--deadline", "soon", "body"}, `--deadline "soon": not a time`},
		{[]string{"schedule", "--queue", "jobs", "--in", "1h", "--id", "a", "--expiration", "-1s", "body"}, `--expiration "-1s"`},
		{[]string{"cancel", "--queue", "jobs", "--id", "a", "body"}, "do not go together"},
		{[]string{"cancel", "--queue", "jobs", "--id", "a", "--all"}, "do not go together"},
		{[]string{"reschedule", "--queue", "jobs", "--id", "a", "--in", "1h", "body"}, "do not go together"},
		{[]string{"show", "--queue", "jobs"}, "want one ID"},
	} {
		if _, errOut, code := runCLI(t, tc.args...); code != exitSettings || !strings.Contains(errOut, tc.err) {
			t.Errorf("%s: exit %d, %q; want 2 and %q", strings.Join(tc.args, " "), code, errOut, tc.err)
		}
	}
	if n := rdb.Exists(ctx, k.Pending(shard.Index([]byte("a"), 8))).Val(); n != 0 {
		t.Error("a refused schedule wrote a task")
	}
}

// TestShowFindsEveryState: show finds a task in flight and a dead
// letter (written as the dispatcher keeps them: entries "<due_ms>:<id>",
// bodies and properties in claimed:body/props by entry), tells an id
// from one that only ends like it or has glob characters, shows a body
// that is not text in hex, and looks in both counts' shards during a
// change.
func TestShowFindsEveryState(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	ctx := context.Background()
	k := shard.Keys{Prefix: prefix, Queue: "jobs"}
	recordShards(t, rdb, prefix, "jobs", 8)
	rdb.HSet(ctx, k.Reshard(), "from", 4, "to", 8)

	// An id in flight in its shard by the old count 4, and scheduled again
	// (pending) in its shard by 8.
	var id string
	for n := 0; ; n++ {
		id = "job[" + string(rune('a'+n%26)) + "]*?\\" + strings.Repeat("x", n/26)
		if shard.Index([]byte(id), 4) != shard.Index([]byte(id), 8) {
			break
		}
	}
	oi, ni := shard.Index([]byte(id), 4), shard.Index([]byte(id), 8)
	entry := "1893456000000:" + id
	rdb.ZAdd(ctx, k.Inflight(oi), redis.Z{Score: 1893456030000, Member: entry})
	rdb.HSet(ctx, k.ClaimedBody(oi), entry, "first body")
	rdb.HSet(ctx, k.ClaimedProps(oi), entry, `{"type":"first"}`)
	// Entries of other ids that a careless match would take. (Unescaped,
	// the id's '[' would keep its own entry from matching.)
	rdb.ZAdd(ctx, k.Inflight(oi), redis.Z{Score: 1, Member: "1:other:" + id}, redis.Z{Score: 1, Member: "1:" + id + "y"})
	rdb.HSet(ctx, k.Tasks(ni), id, []byte{0xff, 0x00, 0x01})
	rdb.ZAdd(ctx, k.Pending(ni), redis.Z{Score: 1893459600000, Member: id})

	out, errOut, code := runCLI(t, "show", "--queue", "jobs", "--json", id)
	if code != exitOK {
		t.Fatalf("show: exit %d, %q\n%s", code, errOut, out)
	}
	var res struct {
		State string
		Found []foundTask
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if res.State != "pending" || len(res.Found) != 2 {
		t.Fatalf("show --json: want pending and in flight:\n%s", out)
	}
	p, f := res.Found[0], res.Found[1]
	if p.Shard != ni || p.DueMs != 1893459600000 || p.BodyHex != "ff0001" || p.Body != nil || p.BodyBytes != 3 || !p.HasID || p.Props != nil {
		t.Errorf("pending: %+v", p)
	}
	if f.State != "in flight" || f.Shard != oi || f.Entry != entry || f.DueMs != 1893456000000 || f.LeaseMs != 1893456030000 ||
		f.Body == nil || *f.Body != "first body" || compact(f.Props) != `{"type":"first"}` ||
		f.MessageID != shard.MessageID([]byte(id), 1893456000000) {
		t.Errorf("in flight: %+v", f)
	}
	out, _, _ = runCLI(t, "show", "--queue", "jobs", id)
	if !strings.Contains(out, "body (3 bytes, not text), hex: ff0001") || !strings.Contains(out, "in flight in shard") ||
		!strings.Contains(out, "held until 2030-01-01 00:00:30.000Z") {
		t.Errorf("show:\n%s", out)
	}

	// A dead letter with its reason; properties the dispatcher refuses are
	// said to be. A plain member (no id) shows as its own body.
	dead := "plain-member"
	di := shard.Index([]byte(dead), 8)
	de := "1893456000000:" + dead
	rdb.ZAdd(ctx, k.Dead(di), redis.Z{Score: 1893456000000, Member: de})
	rdb.HSet(ctx, k.DeadReason(di), de, "properties: priority 300 is not 0 to 255")
	rdb.HSet(ctx, k.ClaimedProps(di), de, `{"priority":300}`)
	out, errOut, code = runCLI(t, "show", "--queue", "jobs", dead)
	if code != exitOK || !strings.HasPrefix(out, "dead letter in shard") || !strings.Contains(out, "reason: properties: priority 300") ||
		!strings.Contains(out, "body: the member itself (no id)") || !strings.Contains(out, "properties refused: properties: priority 300") {
		t.Errorf("show of a dead letter: exit %d, %q\n%s", code, errOut, out)
	}
	out, _, _ = runCLI(t, "show", "--queue", "jobs", "--json", dead)
	if !strings.Contains(out, `"state": "dead letter"`) || !strings.Contains(out, `"reason": "properties: priority 300 is not 0 to 255"`) {
		t.Errorf("show --json of a dead letter:\n%s", out)
	}

	out, _, code = runCLI(t, "show", "--queue", "jobs", "--json", "job")
	if code != exitFailure || !strings.Contains(out, `"state": "not found"`) {
		t.Errorf("show of an id only others end with: exit %d\n%s", code, out)
	}
}

func compact(b []byte) string {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return string(b)
	}
	return out.String()
}

func TestGlobEscape(t *testing.T) {
	if got, want := redisconn.GlobEscape(`a*b?c[d]e\f`), `a\*b\?c\[d\]e\\f`; got != want {
		t.Errorf("globEscape = %q, want %q", got, want)
	}
	if got := redisconn.GlobEscape("задача:1"); got != "задача:1" {
		t.Errorf("redisconn.GlobEscape(задача:1) = %q", got)
	}
	// Bytes that are not UTF-8 (a key prefix or id may hold any) stay as
	// they are: a pattern of U+FFFD in their place matches nothing.
	if got := redisconn.GlobEscape("dq\xe9:{*"); got != "dq\xe9:{\\*" {
		t.Errorf("redisconn.GlobEscape of a prefix not UTF-8 = %q", got)
	}
}
