package tests

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
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
