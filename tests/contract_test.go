package tests

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// TestContractEndToEnd schedules through the Go producer API and through
// raw ZADDs as any other language would, on two queues at once, and checks
// what a plain AMQP consumer sees.
func TestContractEndToEnd(t *testing.T) {
	h := newHarness(t,
		queueSpec{Name: "orders", Shards: 16},
		queueSpec{Name: "mail.out-2", Shards: 3, RoutingKey: "mail-key"})
	h.start()
	ctx := context.Background()
	orders, mail := h.producer("orders"), h.producer("mail.out-2")

	due := time.Now().Add(700 * time.Millisecond).Truncate(time.Millisecond)
	binary := []byte{0, 1, 2, 0xff, '\n', ':', '{', '}'}
	if err := orders.Schedule(ctx, binary, due); err != nil {
		t.Fatal(err)
	}
	// A producer in another language: XXH64 mod M and a ZADD, nothing else.
	raw := []byte(`{"id":1}`)
	rawKey := fmt.Sprintf("%s:{orders:%d}", h.prefix, xxhash.Sum64(raw)%16)
	if err := h.rdb.ZAdd(ctx, rawKey, redis.Z{Score: float64(due.UnixMilli()), Member: raw}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := mail.Schedule(ctx, []byte("mail-1"), due); err != nil {
		t.Fatal(err)
	}
	// Cancelled before due: never delivered. Rescheduled: delivered at its new time only.
	if err := orders.Schedule(ctx, []byte("cancel-me"), due); err != nil {
		t.Fatal(err)
	}
	if ok, err := orders.Cancel(ctx, []byte("cancel-me")); !ok || err != nil {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if err := orders.Schedule(ctx, []byte("move-me"), due); err != nil {
		t.Fatal(err)
	}
	later := due.Add(800 * time.Millisecond)
	if err := orders.Reschedule(ctx, []byte("move-me"), later); err != nil {
		t.Fatal(err)
	}

	got := h.collect("orders", 3, 10*time.Second)
	byBody := map[string]received{}
	for _, r := range got {
		byBody[string(r.d.Body)] = r
	}
	if len(got) != 3 {
		t.Fatalf("orders got %d deliveries, want 3: %v", len(got), keys(byBody))
	}
	for _, tc := range []struct {
		body []byte
		due  time.Time
	}{{binary, due}, {raw, due}, {[]byte("move-me"), later}} {
		r, ok := byBody[string(tc.body)]
		if !ok {
			t.Fatalf("%q not delivered (got %v)", tc.body, keys(byBody))
		}
		wantID := fmt.Sprintf("%016x-%d", xxhash.Sum64(tc.body), tc.due.UnixMilli())
		if r.d.MessageId != wantID {
			t.Errorf("%q: message_id %q, want %q", tc.body, r.d.MessageId, wantID)
		}
		if r.d.DeliveryMode != 2 {
			t.Errorf("%q: delivery mode %d, want 2 (persistent)", tc.body, r.d.DeliveryMode)
		}
		if r.d.Exchange != h.queues[0].Exchange || r.d.RoutingKey != "orders" {
			t.Errorf("%q: exchange %q key %q", tc.body, r.d.Exchange, r.d.RoutingKey)
		}
		if r.at.Before(tc.due) {
			t.Errorf("%q received %s before its due time", tc.body, tc.due.Sub(r.at))
		}
	}
	if _, ok := byBody["cancel-me"]; ok {
		t.Error("a cancelled task was delivered")
	}
	m := h.collect("mail.out-2", 1, 5*time.Second)
	if len(m) != 1 || string(m[0].d.Body) != "mail-1" || m[0].d.RoutingKey != "mail-key" {
		t.Fatalf("mail queue got %v", m)
	}
	for _, q := range h.queues {
		if p, f, d := h.leftovers(q); p+f+d != 0 {
			t.Errorf("queue %s: %d pending, %d in flight, %d dead left", q.Name, p, f, d)
		}
	}
}

func keys(m map[string]received) []string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprintf("%q", k))
	}
	sort.Strings(out)
	return out
}

// TestNeverEarlyAndLoneTaskOnTime schedules tasks ahead of time and checks
// that none reaches a consumer before its due time, and how soon after it
// a lone task arrives. Redis, broker and consumer share this machine's
// clock. The lateness bound is loose on purpose (race detector, shared
// machine); the measured figures are logged.
func TestNeverEarlyAndLoneTaskOnTime(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "timing", Shards: 8})
	h.start()
	p := h.producer("timing")
	time.Sleep(500 * time.Millisecond) // let it connect

	// Many tasks due at scattered times: none may be early.
	want := scheduleSpread(t, p, "spread", 200, time.Now().Add(400*time.Millisecond), 1500*time.Millisecond)
	got := h.collect("timing", len(want), 15*time.Second)
	ids, dups := countIDs(got)
	if miss := missing(want, ids); len(miss) > 0 || dups > 0 {
		t.Fatalf("missing %d, duplicates %d", len(miss), dups)
	}
	var worst time.Duration
	for _, r := range got {
		due := time.UnixMilli(want[r.d.MessageId])
		if r.at.Before(due) {
			t.Errorf("%s received %s early", r.d.MessageId, due.Sub(r.at))
		}
		worst = max(worst, r.at.Sub(due))
	}
	t.Logf("200 scattered tasks: worst lateness at the consumer %s", worst)

	// Lone tasks, one at a time, each scheduled well ahead of its due time.
	var late []time.Duration
	for i := 0; i < 7; i++ {
		due := time.Now().Add(300 * time.Millisecond).Truncate(time.Millisecond)
		if err := p.Schedule(context.Background(), []byte(fmt.Sprint("lone-", i)), due); err != nil {
			t.Fatal(err)
		}
		r := h.collect("timing", 1, 5*time.Second)
		if len(r) != 1 {
			t.Fatalf("lone task %d: %d deliveries", i, len(r))
		}
		if r[0].at.Before(due) {
			t.Fatalf("lone task %d received %s early", i, due.Sub(r[0].at))
		}
		late = append(late, r[0].at.Sub(due))
	}
	sort.Slice(late, func(a, b int) bool { return late[a] < late[b] })
	t.Logf("lone task lateness at the consumer (sorted): %v; median %s", late, late[len(late)/2])
	if late[len(late)/2] > 50*time.Millisecond {
		t.Errorf("median lone-task lateness %s; expected a few ms", late[len(late)/2])
	}
}

// TestContractIDVectors checks CONTRACT.md's section on tasks with an id
// against the code, so that its test vectors and its full example cannot
// drift: each id's XXH64, shard of 16 and message_id; the example's
// properties (valid), its shard in the MULTI, and the message it gives.
func TestContractIDVectors(t *testing.T) {
	b, err := os.ReadFile("../CONTRACT.md")
	if err != nil {
		t.Fatal(err)
	}
	const title = "## Tasks with an id and properties (extension)"
	_, sec, ok := strings.Cut(string(b), "\n"+title+"\n")
	if !ok {
		t.Fatalf("CONTRACT.md has no %q section", title)
	}
	if end := strings.Index(sec, "\n## "); end >= 0 {
		sec = sec[:end]
	}

	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\| `([0-9a-f]{16})` \\| (\\d+) \\| `([0-9a-f]{16}-(\\d+))` \\|$")
	rows := row.FindAllStringSubmatch(sec, -1)
	if len(rows) < 3 {
		t.Fatalf("found %d test vector rows (id, XXH64, mod 16, message_id); want 3 or more", len(rows))
	}
	for _, r := range rows {
		id := []byte(r[1])
		if got := fmt.Sprintf("%016x", shard.Hash(id)); got != r[2] {
			t.Errorf("CONTRACT.md: XXH64(%q) = %s; the code says %s", id, r[2], got)
		}
		if got := strconv.Itoa(shard.Index(id, 16)); got != r[3] {
			t.Errorf("CONTRACT.md: %q mod 16 = %s; the code says %s", id, r[3], got)
		}
		due, _ := strconv.ParseInt(r[5], 10, 64)
		if got := shard.MessageID(id, due); got != r[4] {
			t.Errorf("CONTRACT.md: message_id of %q = %s; the code says %s", id, r[4], got)
		}
	}

	// The full example.
	const id, dueMs = "order-42:timeout", int64(1767225600000)
	_, js, ok := strings.Cut(sec, "```json\n")
	if !ok {
		t.Fatal("CONTRACT.md: the example's properties (a ```json block) are missing")
	}
	js, _, _ = strings.Cut(js, "\n```")
	props, err := shard.ParseProperties([]byte(js))
	if err != nil {
		t.Fatalf("CONTRACT.md: the example's properties: %v", err)
	}
	i := shard.Index([]byte(id), 16)
	for _, line := range []string{
		fmt.Sprintf("HSET dq:{orders:%d}:tasks %s '{\"order\":42}'", i, id),
		fmt.Sprintf("HSET dq:{orders:%d}:props %s ", i, id),
		fmt.Sprintf("ZADD dq:{orders:%d} %d %s", i, dueMs, id),
	} {
		if !strings.Contains(sec, "\n"+line) {
			t.Errorf("CONTRACT.md: the example's MULTI lacks %q", line)
		}
	}
	_, given, ok := strings.Cut(sec, "gives this message")
	if !ok {
		t.Fatal("CONTRACT.md: the example's message (\"gives this message\") is missing")
	}
	msg := func(what string) string {
		m := regexp.MustCompile("(?m)^\\| " + regexp.QuoteMeta(what) + " \\| (.*) \\|$").FindStringSubmatch(given)
		if m == nil {
			t.Fatalf("CONTRACT.md: the example's message has no %q row", what)
		}
		return m[1]
	}
	if got, want := msg("`message_id`"), "`"+shard.MessageID([]byte(id), dueMs)+"`"; got != want {
		t.Errorf("CONTRACT.md: the example's message_id %s; the code says %s", got, want)
	}
	if got, want := msg("routing key"), "`"+props.RoutingKey+"`"; got != want {
		t.Errorf("CONTRACT.md: the example's routing key %s; its properties say %s", got, want)
	}
	if got, want := msg("`priority`"), strconv.Itoa(*props.Priority); got != want {
		t.Errorf("CONTRACT.md: the example's priority %s; its properties say %s", got, want)
	}
	if got, want := msg("`expiration`"), fmt.Sprintf("`%d`", *props.ExpirationMs); !strings.HasPrefix(got, want) {
		t.Errorf("CONTRACT.md: the example's expiration %s; its properties say %s", got, want)
	}
	headers := msg("headers")
	want := []string{fmt.Sprintf("`x-task-id` = `%s`", id), fmt.Sprintf("`x-due-ms` = %d", dueMs)}
	for k, v := range props.Headers {
		if s, ok := v.(string); ok {
			want = append(want, fmt.Sprintf("`%s` = `%s`", k, s))
		} else {
			want = append(want, fmt.Sprintf("`%s` = %v", k, v))
		}
	}
	for _, w := range want {
		if !strings.Contains(headers, w) {
			t.Errorf("CONTRACT.md: the example's headers (%s) lack %s", headers, w)
		}
	}
	if got, want := msg("`content_type`, `correlation_id`, `reply_to`, `type`"),
		fmt.Sprintf("`%s`, `%s`, `%s`, `%s`", props.ContentType, props.CorrelationID, props.ReplyTo, props.Type); got != want {
		t.Errorf("CONTRACT.md: the example's basic properties %s; its properties say %s", got, want)
	}
	if !strings.Contains(sec, fmt.Sprintf("published by `%d`", *props.DeadlineMs)) {
		t.Errorf("CONTRACT.md: the example does not say it is published by its deadline_ms %d", *props.DeadlineMs)
	}
}
