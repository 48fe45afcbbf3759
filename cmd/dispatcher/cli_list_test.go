package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// listPage is list --json.
type listPage struct {
	Queue string `json:"queue"`
	State string `json:"state"`
	Tasks []struct {
		Shard     int     `json:"shard"`
		DueMs     int64   `json:"due_ms"`
		Due       string  `json:"due"`
		MessageID string  `json:"message_id"`
		Body      string  `json:"body"`
		LeaseMs   *int64  `json:"lease_ms"`
		Attempts  *int    `json:"attempts"`
		Reason    *string `json:"reason"`
	} `json:"tasks"`
	Scanned int    `json:"scanned"`
	Next    string `json:"next"`
}

// listAll runs list --json with args, page after page, and returns the
// bodies in the order listed.
func listAll(t *testing.T, args ...string) (bodies []string, pages int) {
	t.Helper()
	after := []string{}
	for {
		out, errOut, code := runCLI(t, append(append([]string{"list", "--json"}, args...), after...)...)
		var p listPage
		if err := json.Unmarshal([]byte(out), &p); code != 0 || err != nil {
			t.Fatalf("list %v: exit %d, %v, %q %q", args, code, err, out, errOut)
		}
		pages++
		for n, task := range p.Tasks {
			if n > 0 && task.DueMs < p.Tasks[n-1].DueMs {
				t.Fatalf("page %d out of due order at %d", pages, n)
			}
			if task.MessageID != shard.MessageID([]byte(task.Body), task.DueMs) {
				t.Fatalf("%q: message_id %s, due %d", task.Body, task.MessageID, task.DueMs)
			}
			bodies = append(bodies, task.Body)
		}
		if p.Next == "" {
			return bodies, pages
		}
		after = []string{"--after", p.Next}
	}
}

// scheduleTies writes n pending tasks over m shards, a third at one due
// time, and returns their bodies in due order (ties in any order).
func scheduleTies(t *testing.T, rdb redis.UniversalClient, k shard.Keys, m, n int) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	const t0 = int64(1_800_000_000_000)
	pipe := rdb.Pipeline()
	due := map[string]int64{}
	for j := range n {
		body := "job-" + strconv.Itoa(j)
		d := t0
		if j%3 != 0 {
			d = t0 + int64(j%97)*1000
		}
		due[body] = d
		pipe.ZAdd(ctx, k.Shard([]byte(body), m), redis.Z{Score: float64(d), Member: body})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	return due
}

// checkOnce fails unless bodies holds every key of due once, in due order.
func checkOnce(t *testing.T, bodies []string, due map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	for n, b := range bodies {
		if seen[b] {
			t.Fatalf("%s listed twice", b)
		}
		seen[b] = true
		if n > 0 && due[b] < due[bodies[n-1]] {
			t.Fatalf("%s (due %d) after %s (due %d)", b, due[b], bodies[n-1], due[bodies[n-1]])
		}
	}
	if len(seen) != len(due) {
		t.Fatalf("listed %d tasks, want %d", len(seen), len(due))
	}
}

// TestListCommand pages through 10^4 pending tasks (3334 due at one
// instant) with list --json --limit: each once, in due order; then the
// filters, the table, in-flight and dead tasks.
func TestListCommand(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 4)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	ctx := context.Background()
	due := scheduleTies(t, rdb, k, 4, 10_000)
	bodies, pages := listAll(t, "--queue", "q", "--limit", "1000")
	checkOnce(t, bodies, due)
	if pages != 10 {
		t.Errorf("%d pages of 1000 for 10^4 tasks, want 10", pages)
	}

	// --from/--to/--match: a tie-free window, matching job-1*.
	const t0 = int64(1_800_000_000_000)
	want := map[string]int64{}
	for b, d := range due {
		if d >= t0+10_000 && d <= t0+20_000 && strings.HasPrefix(b, "job-1") {
			want[b] = d
		}
	}
	bodies, _ = listAll(t, "--queue", "q", "--from", strconv.FormatInt(t0+10_000, 10), "--to", "2027-01-15T08:00:20Z", "--match", "job-1*", "--limit", "50", "--max-scan", "500")
	checkOnce(t, bodies, want)

	// The table: one row a task, the count, and how to go on.
	out, _, code := runCLI(t, "list", "--queue", "q", "--limit", "2")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 5 || !strings.HasPrefix(lines[0], "DUE (UTC)") || !strings.Contains(lines[1], "2027-01-15 08:00:00.000") ||
		lines[3] != "2 pending tasks (2 looked at)" || !strings.HasPrefix(lines[4], "more: --after pending:1800000000000:0:") {
		t.Errorf("list --limit 2: exit %d\n%s", code, out)
	}

	// In flight: by lease, with due time, lease and failed publishes;
	// dead: with the reason.
	e := fmt.Sprintf("%d:%s", t0, "flying")
	rdb.ZAdd(ctx, k.Inflight(1), redis.Z{Score: float64(t0 + 30_000), Member: e})
	rdb.HSet(ctx, k.Attempts(1), e, 2)
	rdb.ZAdd(ctx, k.Dead(2), redis.Z{Score: float64(t0), Member: t0s(t0) + ":poison"})
	rdb.HSet(ctx, k.DeadReason(2), t0s(t0)+":poison", "refused by the broker (after 5 attempts)")
	out, _, code = runCLI(t, "list", "--queue", "q", "--state", "inflight")
	if code != 0 || !strings.Contains(out, "LEASE (UTC)") || !strings.Contains(out, `"flying"`) || !strings.Contains(out, "2027-01-15 08:00:30.000  2") {
		t.Errorf("list --state inflight: exit %d\n%s", code, out)
	}
	out, _, code = runCLI(t, "list", "--queue", "q", "--state", "dead", "--json")
	var p listPage
	if err := json.Unmarshal([]byte(out), &p); code != 0 || err != nil || len(p.Tasks) != 1 || p.Tasks[0].Reason == nil ||
		*p.Tasks[0].Reason != "refused by the broker (after 5 attempts)" || p.Tasks[0].Body != "poison" || p.Next != "" {
		t.Errorf("list --state dead --json: exit %d %v\n%s", code, err, out)
	}
}

func t0s(ms int64) string { return strconv.FormatInt(ms, 10) }

// TestListBadInput: each mistake exits 2 with one line naming the flag
// and the value.
func TestListBadInput(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 4)
	bad := map[string][]string{
		`--state "queued": want pending, inflight or dead`: {"list", "--queue", "q", "--state", "queued"},
		`--from "yesterday": not a time`:                   {"list", "--queue", "q", "--from", "yesterday"},
		`--to: empty`:                                      {"list", "--queue", "q", "--to", ""},
		`--limit 0: want 1 to 100000`:                      {"list", "--queue", "q", "--limit", "0"},
		`--limit 0: want 1 to 100000 `:                     {"dead", "list", "--queue", "q", "--limit", "0"},
		`--max-scan -1: want 1 or more`:                    {"list", "--queue", "q", "--max-scan", "-1"},
		`--after "x": not a cursor printed by list`:        {"list", "--queue", "q", "--after", "x"},
		`a cursor of dead tasks, not pending`:              {"list", "--queue", "q", "--after", "dead:1:0:eA"},
		`--from "+1h" is after --to "now"`:                 {"list", "--queue", "q", "--from", "+1h", "--to", "now"},
		`--shard 4: queue q has shards 0 to 3`:             {"list", "--queue", "q", "--shard", "4"},
		`--queue is required`:                              {"list"},
	}
	for want, args := range bad {
		_, errOut, code := runCLI(t, args...)
		if code != 2 || !strings.Contains(errOut, strings.TrimSpace(want)) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("dispatcher %s: exit %d, %q; want 2 and one line saying %q", strings.Join(args, " "), code, errOut, want)
		}
	}
}

// TestDeadAllInBatches requeues and purges 1200 dead letters over 4
// shards (several batches each): dead list pages through them, requeue
// --all moves every one but the body pending already (exit 1, named),
// purge --all --yes forgets the rest.
func TestDeadAllInBatches(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 4)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	ctx := context.Background()
	const t0 = int64(1_800_000_000_000)
	pipe := rdb.Pipeline()
	due := map[string]int64{}
	for j := range 1200 {
		body := "dead-" + strconv.Itoa(j)
		d := t0 + int64(j%5) // many ties
		e := t0s(d) + ":" + body
		i := shard.Index([]byte(body), 4)
		pipe.ZAdd(ctx, k.Dead(i), redis.Z{Score: float64(d), Member: e})
		pipe.HSet(ctx, k.DeadReason(i), e, "too big")
		due[body] = d
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	var bodies []string
	after := []string{}
	for {
		out, _, code := runCLI(t, append([]string{"dead", "list", "--queue", "q", "--limit", "250", "--json"}, after...)...)
		var p struct {
			Dead []struct {
				Body   string `json:"body"`
				Reason string `json:"reason"`
			} `json:"dead"`
			Next string `json:"next"`
		}
		if err := json.Unmarshal([]byte(out), &p); code != 0 || err != nil || len(p.Dead) > 250 {
			t.Fatalf("dead list: exit %d %v %q", code, err, out)
		}
		for _, d := range p.Dead {
			bodies = append(bodies, d.Body)
		}
		if p.Next == "" {
			break
		}
		after = []string{"--after", p.Next}
	}
	checkOnce(t, bodies, due)

	// One body is pending again: requeue --all leaves it and says so.
	rdb.ZAdd(ctx, k.Shard([]byte("dead-7"), 4), redis.Z{Score: float64(t0 + 99), Member: "dead-7"})
	out, errOut, code := runCLI(t, "dead", "requeue", "--queue", "q", "--all", "--json")
	var r struct {
		Requeued []struct {
			Body      string `json:"body"`
			MessageID string `json:"message_id"`
		} `json:"requeued"`
	}
	if err := json.Unmarshal([]byte(out), &r); code != 1 || err != nil || len(r.Requeued) != 1199 || !strings.Contains(errOut, `"dead-7"`) || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("requeue --all: exit %d %v, %d requeued, stderr %q", code, err, len(r.Requeued), errOut)
	}
	for _, q := range r.Requeued {
		if s := rdb.ZScore(ctx, k.Shard([]byte(q.Body), 4), q.Body).Val(); int64(s) != due[q.Body] || q.MessageID != shard.MessageID([]byte(q.Body), due[q.Body]) {
			t.Fatalf("%s requeued at %v as %s, want its due time %d", q.Body, s, q.MessageID, due[q.Body])
		}
	}
	var left int64
	for i := range 4 {
		left += rdb.ZCard(ctx, k.Dead(i)).Val() + rdb.HLen(ctx, k.DeadReason(i)).Val()
	}
	if left != 2 {
		t.Errorf("%d dead entries and reasons left, want dead-7's 2", left)
	}
	out, _, code = runCLI(t, "dead", "purge", "--queue", "q", "--all", "--yes")
	if code != 0 || !strings.HasSuffix(out, "purged shard "+strconv.Itoa(shard.Index([]byte("dead-7"), 4))+` "dead-7" message_id `+shard.MessageID([]byte("dead-7"), due["dead-7"])+"\n1 purged\n") {
		t.Errorf("purge --all --yes: exit %d %q", code, out)
	}
}

// TestListOnCluster lists and purges across a Redis Cluster, the shards
// on three primaries: the walk's reads and scripts each touch one slot.
func TestListOnCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	crdb := c.Client()
	cliEnv(t, map[string]string{"DISPATCHER_REDIS_URL": c.URL(), "DISPATCHER_KEY_PREFIX": "dq"})
	k := shard.Keys{Prefix: "dq", Queue: "q"}
	ctx := context.Background()
	if err := crdb.Set(ctx, k.ShardCount(), 16, 0).Err(); err != nil {
		t.Fatal(err)
	}
	due := scheduleTies(t, crdb, k, 16, 2000)
	bodies, _ := listAll(t, "--queue", "q", "--limit", "300")
	checkOnce(t, bodies, due)
	for b, d := range due {
		e := t0s(d) + ":" + b
		crdb.ZAdd(ctx, k.Dead(shard.Index([]byte(b), 16)), redis.Z{Score: float64(d), Member: e})
	}
	out, _, code := runCLI(t, "dead", "purge", "--queue", "q", "--all", "--yes")
	if code != 0 || !strings.HasSuffix(out, "\n2000 purged\n") {
		t.Errorf("purge --all --yes on the cluster: exit %d, %q", code, out[max(0, len(out)-200):])
	}
}

// TestListOnSentinel lists and purges through Sentinel: the walk's
// read-only script runs on the primary Sentinel names.
func TestListOnSentinel(t *testing.T) {
	rs := testenv.StartRedisSentinel(t, testenv.SentinelOptions{})
	srdb := rs.Client()
	cliEnv(t, map[string]string{"DISPATCHER_REDIS_URL": rs.URL(), "DISPATCHER_KEY_PREFIX": "dq"})
	k := shard.Keys{Prefix: "dq", Queue: "q"}
	ctx := context.Background()
	if err := srdb.Set(ctx, k.ShardCount(), 4, 0).Err(); err != nil {
		t.Fatal(err)
	}
	due := scheduleTies(t, srdb, k, 4, 1000)
	bodies, _ := listAll(t, "--queue", "q", "--limit", "300")
	checkOnce(t, bodies, due)
}

// TestListAndStatsBeyondShardCount: tasks a producer hashing with a larger
// count wrote to shards 40 and 4095 of a queue of 4 show in list (marked,
// in due order with the others, and with --shard) and in stats (a row each
// and a note naming the keys); a shard beyond that holds nothing is
// refused as before.
func TestListAndStatsBeyondShardCount(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 4)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	ctx := context.Background()
	rdb.ZAdd(ctx, k.Pending(1), redis.Z{Score: 1_800_000_000_000, Member: "home"})
	rdb.ZAdd(ctx, k.Pending(40), redis.Z{Score: 1_800_000_000_001, Member: "stray-40"})
	rdb.ZAdd(ctx, k.Pending(4095), redis.Z{Score: 1_799_999_999_999, Member: "stray-4095"})

	bodies, _ := listAll(t, "--queue", "q")
	if strings.Join(bodies, " ") != "stray-4095 home stray-40" {
		t.Errorf("list: %v, want the strays with the others in due order", bodies)
	}
	out, _, code := runCLI(t, "list", "--queue", "q")
	if code != 0 || !strings.Contains(out, "4095*") || !strings.Contains(out, "* shards 40, 4095 are beyond the queue's 4") {
		t.Errorf("list (exit %d) does not mark the shards beyond the count:\n%s", code, out)
	}
	if bodies, _ := listAll(t, "--queue", "q", "--shard", "40"); strings.Join(bodies, " ") != "stray-40" {
		t.Errorf("list --shard 40: %v", bodies)
	}
	if _, errOut, code := runCLI(t, "list", "--queue", "q", "--shard", "41"); code != 2 || !strings.Contains(errOut, "queue q has shards 0 to 3") {
		t.Errorf("list --shard 41 (nothing there): exit %d, %q", code, errOut)
	}

	out, _, code = runCLI(t, "stats", "--queue", "q")
	if code != 0 || !strings.Contains(out, " 40*") || !strings.Contains(out, "4095*") ||
		!strings.Contains(out, "queue q has 2 pending tasks in shards beyond its 4 (*: "+k.Pending(40)+", "+k.Pending(4095)+")") {
		t.Errorf("stats (exit %d) does not show the shards beyond the count:\n%s", code, out)
	}
	out, _, _ = runCLI(t, "stats", "--queue", "q", "--json")
	var st struct {
		Queues []struct {
			Beyond int64 `json:"beyond_shard_count"`
			Shards []struct {
				Index  int  `json:"shard"`
				Beyond bool `json:"beyond_shard_count"`
			} `json:"shards"`
		} `json:"queues"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st.Queues) != 1 || st.Queues[0].Beyond != 2 ||
		len(st.Queues[0].Shards) != 6 || !st.Queues[0].Shards[4].Beyond || st.Queues[0].Shards[4].Index != 40 {
		t.Errorf("stats --json: %v\n%s", err, out)
	}
}

// TestListWithIDs: list shows a pending task's id, body and properties
// (table and --json, where a task without an id has no "id"), and those
// of in-flight tasks from the fields the claim set aside; --match is on
// the id.
func TestListWithIDs(t *testing.T) {
	prefix, rdb := cliEnv(t, nil)
	recordShards(t, rdb, prefix, "q", 2)
	k := shard.Keys{Prefix: prefix, Queue: "q"}
	ctx := context.Background()
	const t0 = int64(1_800_000_000_000)
	i := shard.Index([]byte("order-1"), 2)
	rdb.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(t0), Member: "order-1"})
	rdb.HSet(ctx, k.Tasks(i), "order-1", `{"customer":42}`)
	rdb.HSet(ctx, k.Props(i), "order-1", `{"content_type":"application/json"}`)
	j := shard.Index([]byte("plain"), 2)
	rdb.ZAdd(ctx, k.Pending(j), redis.Z{Score: float64(t0 + 1), Member: "plain"})
	e := t0s(t0-5) + ":order-0"
	f := shard.Index([]byte("order-0"), 2)
	rdb.ZAdd(ctx, k.Inflight(f), redis.Z{Score: float64(t0 + 30_000), Member: e})
	rdb.HSet(ctx, k.ClaimedBody(f), e, "claimed")

	out, _, code := runCLI(t, "list", "--queue", "q")
	if code != exitOK || !regexp.MustCompile(`"order-1"\s+"\{\\"customer\\":42\}"\s+\{"content_type":"application/json"\}`).MatchString(out) ||
		!regexp.MustCompile(`-\s+"plain"\s+-`).MatchString(out) {
		t.Errorf("list: exit %d\n%s", code, out)
	}
	out, _, code = runCLI(t, "list", "--queue", "q", "--json", "--match", "order-*")
	var p struct {
		Tasks []map[string]any `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(out), &p); code != exitOK || err != nil || len(p.Tasks) != 1 || p.Tasks[0]["id"] != "order-1" ||
		p.Tasks[0]["body"] != `{"customer":42}` || fmt.Sprint(p.Tasks[0]["properties"]) != "map[content_type:application/json]" {
		t.Errorf("list --json --match order-*: exit %d %v\n%s", code, err, out)
	}
	out, _, _ = runCLI(t, "list", "--queue", "q", "--json", "--match", "plain")
	p.Tasks = nil // Unmarshal would merge into the maps there
	if err := json.Unmarshal([]byte(out), &p); err != nil || len(p.Tasks) != 1 || p.Tasks[0]["body"] != "plain" || p.Tasks[0]["id"] != nil || p.Tasks[0]["properties"] != nil {
		t.Errorf("list --json of a task without an id: %v\n%s", err, out)
	}
	out, _, _ = runCLI(t, "list", "--queue", "q", "--json", "--state", "inflight")
	p.Tasks = nil
	if err := json.Unmarshal([]byte(out), &p); err != nil || len(p.Tasks) != 1 || p.Tasks[0]["id"] != "order-0" || p.Tasks[0]["body"] != "claimed" {
		t.Errorf("list --json --state inflight: %v\n%s", err, out)
	}
}
