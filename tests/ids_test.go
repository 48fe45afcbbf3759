package tests

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// Tasks with an id, written as the contract says a producer in any
// language writes them: MULTI, HSET :tasks, HSET :props, ZADD, EXEC.

func (h *harness) keys(q queueSpec) shard.Keys { return shard.Keys{Prefix: h.prefix, Queue: q.Name} }

// scheduleID schedules id with body and properties (JSON, "" for none).
func (h *harness) scheduleID(q queueSpec, id, body, props string, dueMs int64) {
	h.t.Helper()
	k, i := h.keys(q), shard.Index([]byte(id), q.Shards)
	_, err := h.rdb.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
		p.HSet(context.Background(), k.Tasks(i), id, body)
		if props != "" {
			p.HSet(context.Background(), k.Props(i), id, props)
		} else {
			p.HDel(context.Background(), k.Props(i), id)
		}
		p.ZAdd(context.Background(), k.Pending(i), redis.Z{Score: float64(dueMs), Member: id})
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
}

// cancelID cancels id; true if it was pending.
func (h *harness) cancelID(q queueSpec, id string) bool {
	h.t.Helper()
	k, i := h.keys(q), shard.Index([]byte(id), q.Shards)
	var rem *redis.IntCmd
	_, err := h.rdb.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
		rem = p.ZRem(context.Background(), k.Pending(i), id)
		p.HDel(context.Background(), k.Tasks(i), id)
		p.HDel(context.Background(), k.Props(i), id)
		return nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return rem.Val() == 1
}

// rescheduleID moves a pending id to dueMs; true if it was pending.
func (h *harness) rescheduleID(q queueSpec, id string, dueMs int64) bool {
	h.t.Helper()
	k, i := h.keys(q), shard.Index([]byte(id), q.Shards)
	n, err := h.rdb.ZAddArgs(context.Background(), k.Pending(i), redis.ZAddArgs{XX: true, Ch: true,
		Members: []redis.Z{{Score: float64(dueMs), Member: id}}}).Result()
	if err != nil {
		h.t.Fatal(err)
	}
	return n == 1
}

// idLeftovers counts the fields of the id hashes of a queue: bodies and
// properties of pending tasks, and of claimed (in-flight or dead) ones.
func (h *harness) idLeftovers(q queueSpec) (tasks, props, claimedBody, claimedProps int64) {
	ctx, k := context.Background(), h.keys(q)
	for i := 0; i < q.Shards; i++ {
		tasks += h.rdb.HLen(ctx, k.Tasks(i)).Val()
		props += h.rdb.HLen(ctx, k.Props(i)).Val()
		claimedBody += h.rdb.HLen(ctx, k.ClaimedBody(i)).Val()
		claimedProps += h.rdb.HLen(ctx, k.ClaimedProps(i)).Val()
	}
	return
}

// deadReasons maps the dead-lettered members of a queue to their reasons.
func (h *harness) deadReasons(q queueSpec) map[string]string {
	ctx, k := context.Background(), h.keys(q)
	out := map[string]string{}
	for i := 0; i < q.Shards; i++ {
		for e, why := range h.rdb.HGetAll(ctx, k.DeadReason(i)).Val() {
			_, member, _ := strings.Cut(e, ":")
			out[member] = why
		}
	}
	return out
}

// TestIDsAndProperties: ids and plain members in one queue, properties
// of every kind reaching the consumer, a routing key per task reaching
// another bound queue, and bad properties dead-lettering their task only,
// with the field named and body and properties kept.
func TestIDsAndProperties(t *testing.T) {
	t.Parallel()
	q := queueSpec{Name: "ids", Shards: 4}
	h := newHarness(t, q)
	q = h.queues[0]
	other := "ids-other"
	otherGot := testenv.Consumer(t, h.conn, q.Exchange, other)
	now := time.Now().UnixMilli()

	h.scheduleID(q, "order-42:timeout", `{"order":42}`, `{"headers":{"tenant":"acme","attempt":3,"vip":true,`+
		`"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},"content_type":"application/json",`+
		`"content_encoding":"identity","correlation_id":"c-1","reply_to":"replies","type":"order.timeout","priority":7,"expiration_ms":60000}`, now+300)
	h.scheduleID(q, "no-props", "plain body of an id", "", now+300)
	h.scheduleID(q, "empty-body", "", "", now+300)
	h.scheduleID(q, "routed", "to the other queue", `{"routing_key":"`+other+`"}`, now+300)
	h.zadd(q, []byte("plain-member"), float64(now+300))
	// A plain member with properties: its own body, properties applied.
	k := h.keys(q)
	pm := "plain-with-props"
	h.rdb.HSet(context.Background(), k.Props(shard.Index([]byte(pm), q.Shards)), pm, `{"type":"plain"}`)
	h.zadd(q, []byte(pm), float64(now+300))
	bad := map[string]string{
		"bad-json":     "{not json",
		"bad-field":    `{"priority":1,"colour":"red"}`,
		"bad-priority": `{"priority":300}`,
		"bad-header":   `{"headers":{"x-task-id":"forged"}}`,
	}
	for id, p := range bad {
		h.scheduleID(q, id, "body of "+id, p, now+300)
	}

	p := h.start()
	defer p.signal(syscall.SIGTERM)
	byID := map[string]amqp.Delivery{}
	deadline := time.After(20 * time.Second)
	for len(byID) < 5 {
		select {
		case d := <-h.got[q.Name]:
			id, _ := d.Headers["x-task-id"].(string)
			if id == "" {
				id = "member:" + string(d.Body)
			}
			byID[id] = d
		case <-deadline:
			t.Fatalf("received %d of 5 on the queue's routing key: %v", len(byID), keysOf(byID))
		}
	}
	var routed amqp.Delivery
	select {
	case routed = <-otherGot:
	case <-time.After(10 * time.Second):
		t.Fatal("nothing arrived with the task's own routing key")
	}

	o := byID["order-42:timeout"]
	if string(o.Body) != `{"order":42}` || o.MessageId != shard.MessageID([]byte("order-42:timeout"), now+300) {
		t.Errorf("order-42: body %q message_id %s", o.Body, o.MessageId)
	}
	want := map[string]any{"tenant": "acme", "attempt": int64(3), "vip": true,
		"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x-task-id": "order-42:timeout", "x-due-ms": now + 300}
	for name, v := range want {
		if got := o.Headers[name]; fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("order-42: header %s = %v (%T), want %v", name, got, got, v)
		}
	}
	if o.ContentType != "application/json" || o.ContentEncoding != "identity" || o.CorrelationId != "c-1" ||
		o.ReplyTo != "replies" || o.Type != "order.timeout" || o.Priority != 7 || o.Expiration != "60000" || o.RoutingKey != q.RoutingKey {
		t.Errorf("order-42: properties %+v", o)
	}
	if d := byID["no-props"]; string(d.Body) != "plain body of an id" || d.ContentType != "" || d.Type != "" {
		t.Errorf("no-props: body %q properties %q %q", d.Body, d.ContentType, d.Type)
	}
	if d, ok := byID["empty-body"]; !ok || len(d.Body) != 0 {
		t.Errorf("empty-body: %v body %q", ok, d.Body)
	}
	if d := byID["member:plain-member"]; d.Headers["x-task-id"] != nil || d.MessageId != shard.MessageID([]byte("plain-member"), now+300) {
		t.Errorf("plain member: headers %v message_id %s", d.Headers, d.MessageId)
	}
	if d := byID["member:"+pm]; d.Type != "plain" {
		t.Errorf("plain member with properties: type %q", d.Type)
	}
	if string(routed.Body) != "to the other queue" || routed.RoutingKey != other || routed.Headers["x-task-id"] != "routed" {
		t.Errorf("routed: body %q key %s headers %v", routed.Body, routed.RoutingKey, routed.Headers)
	}

	// Bad properties: their tasks only, dead-lettered with the field named.
	eventually(t, 10*time.Second, "the bad ones dead-lettered", func() bool { return len(h.deadReasons(q)) == len(bad) })
	reasons := h.deadReasons(q)
	for id, word := range map[string]string{"bad-json": "JSON", "bad-field": `"colour"`, "bad-priority": "priority 300", "bad-header": `"x-task-id"`} {
		if !strings.Contains(reasons[id], word) {
			t.Errorf("%s dead-lettered as %q, want it to name %s", id, reasons[id], word)
		}
	}
	// Dead letters keep body and properties; nothing else is left.
	eventually(t, 10*time.Second, "the delivered ones forgotten", func() bool {
		tasks, props, cb, cp := h.idLeftovers(q)
		pending, inflight, _ := h.leftovers(q)
		return tasks == 0 && props == 0 && cb == int64(len(bad)) && cp == int64(len(bad)) && pending == 0 && inflight == 0
	})
	for i := 0; i < q.Shards; i++ {
		for e, b := range h.rdb.HGetAll(context.Background(), k.ClaimedBody(i)).Val() {
			_, id, _ := strings.Cut(e, ":")
			if b != "body of "+id {
				t.Errorf("dead letter %s kept body %q", e, b)
			}
		}
	}
}

func keysOf[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestIDDeadline: a task whose deadline_ms passes while no instance runs
// (an outage) is dead-lettered with "deadline passed", not published
// late; one whose deadline is still ahead is published.
func TestIDDeadline(t *testing.T) {
	t.Parallel()
	q := queueSpec{Name: "deadline", Shards: 2}
	h := newHarness(t, q)
	q = h.queues[0]
	now := time.Now().UnixMilli()
	h.scheduleID(q, "too-late", "late body", fmt.Sprintf(`{"deadline_ms":%d}`, now+200), now+100)
	h.scheduleID(q, "in-time", "in-time body", fmt.Sprintf(`{"deadline_ms":%d}`, now+600_000), now+100)
	time.Sleep(500 * time.Millisecond) // the outage: the deadline passes
	p := h.start()
	got := h.drain(q.Name, 2*time.Second, 15*time.Second)
	if len(got) != 1 || got[0].body != "in-time body" {
		t.Fatalf("delivered %+v, want only the one in time", got)
	}
	eventually(t, 5*time.Second, "dead-lettered", func() bool { return h.deadReasons(q)["too-late"] != "" })
	if why := h.deadReasons(q)["too-late"]; !strings.Contains(why, "deadline passed") {
		t.Fatalf("reason %q", why)
	}
	k, i := h.keys(q), shard.Index([]byte("too-late"), q.Shards)
	e := fmt.Sprintf("%d:too-late", now+100)
	if b := h.rdb.HGet(context.Background(), k.ClaimedBody(i), e).Val(); b != "late body" {
		t.Fatalf("dead letter's body %q", b)
	}
	// Requeued (with the dispatcher stopped, to look at it pending), it is
	// pending again with its body and properties under its id.
	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if out, errOut, code := runCLI(t, h.env(), "dead", "requeue", "--queue", q.Name, "too-late"); code != 0 {
		t.Fatalf("dead requeue: %d %s %s", code, out, errOut)
	}
	ctx := context.Background()
	if sc, err := h.rdb.ZScore(ctx, k.Pending(i), "too-late").Result(); err != nil || int64(sc) != now+100 {
		t.Fatalf("requeued: pending at %v (%v), want %d", sc, err, now+100)
	}
	if b, pr := h.rdb.HGet(ctx, k.Tasks(i), "too-late").Val(), h.rdb.HGet(ctx, k.Props(i), "too-late").Val(); b != "late body" || !strings.Contains(pr, "deadline_ms") {
		t.Fatalf("requeued with body %q properties %q", b, pr)
	}
	if _, _, cb, cp := h.idLeftovers(q); cb != 0 || cp != 0 {
		t.Fatalf("claimed fields left after the requeue: %d %d", cb, cp)
	}
}

// TestIDHeldAndStopped: a task with an id claimed ahead and held by an
// instance that stops goes back into pending with its body and
// properties under its id, and the next instance publishes them.
func TestIDHeldAndStopped(t *testing.T) {
	t.Parallel()
	q := queueSpec{Name: "held", Shards: 2}
	h := newHarness(t, q)
	q = h.queues[0]
	h.extra["DISPATCHER_LOOKAHEAD"] = "10s"
	due := time.Now().Add(6 * time.Second).UnixMilli()
	h.scheduleID(q, "held-id", "held body", `{"type":"held"}`, due)
	k, i := h.keys(q), shard.Index([]byte("held-id"), q.Shards)
	p := h.start()
	eventually(t, 5*time.Second, "claimed ahead", func() bool {
		return h.rdb.HLen(context.Background(), k.ClaimedBody(i)).Val() == 1
	})
	if n := h.rdb.HLen(context.Background(), k.Tasks(i)).Val(); n != 0 {
		t.Fatalf("claimed, and still %d in :tasks", n)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(15 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if b, pr := h.rdb.HGet(context.Background(), k.Tasks(i), "held-id").Val(), h.rdb.HGet(context.Background(), k.Props(i), "held-id").Val(); b != "held body" || pr != `{"type":"held"}` {
		t.Fatalf("back in pending with body %q props %q", b, pr)
	}
	if _, _, cb, cp := h.idLeftovers(q); cb != 0 || cp != 0 {
		t.Fatalf("claimed fields left: %d %d", cb, cp)
	}
	p2 := h.start()
	defer p2.signal(syscall.SIGTERM)
	got := h.drain(q.Name, 2*time.Second, 20*time.Second)
	if len(got) != 1 || got[0].body != "held body" {
		t.Fatalf("delivered %+v", got)
	}
}

// TestIDRaces: schedules with new bodies, reschedules and cancels by id
// race the claims of two instances. No delivery carries a stale body (a
// body written for another due time), no cancelled scheduling is
// delivered, every scheduling left pending is delivered, and nothing is
// left in any hash at the end.
func TestIDRaces(t *testing.T) {
	t.Parallel()
	q := queueSpec{Name: "races", Shards: 4}
	h := newHarness(t, q)
	q = h.queues[0]
	h.extra["DISPATCHER_LOOKAHEAD"] = "200ms"
	p1, p2 := h.start(), h.start()
	defer p1.signal(syscall.SIGTERM)
	defer p2.signal(syscall.SIGTERM)

	var mu sync.Mutex
	must := map[string]string{}      // message_id -> id: schedulings pending at the end
	may := map[string]string{}       // message_id -> its body: every scheduling made
	cancelled := map[string]string{} // message_id -> id, never to arrive
	var wg sync.WaitGroup
	const workers, ids, rounds = 4, 20, 60
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(w)))
			// Each worker owns its ids, so what is pending is known.
			pending := map[string]int64{}
			for n := 0; n < rounds; n++ {
				id := fmt.Sprintf("w%d-id%d", w, r.Intn(ids))
				due := time.Now().UnixMilli() + int64(r.Intn(400))
				mid := func(d int64) string { return shard.MessageID([]byte(id), d) }
				switch op := r.Intn(4); {
				case op <= 1: // schedule (anew, or replacing the pending one)
					body := fmt.Sprintf("%s@%d", id, due)
					h.scheduleID(q, id, body, "", due)
					mu.Lock()
					if old, ok := pending[id]; ok && old != due {
						// Replaced if still pending; delivered if claimed first.
						delete(must, mid(old))
					}
					must[mid(due)], may[mid(due)] = id, body
					mu.Unlock()
					pending[id] = due
				case op == 2: // cancel
					old, ok := pending[id]
					if h.cancelID(q, id) && ok {
						mu.Lock()
						delete(must, mid(old))
						cancelled[mid(old)] = id
						mu.Unlock()
					}
					delete(pending, id)
				default: // reschedule: body unchanged, so it names the old due
					old, ok := pending[id]
					if ok && h.rescheduleID(q, id, due) {
						mu.Lock()
						delete(must, mid(old))
						must[mid(due)], may[mid(due)] = id, may[mid(old)]
						mu.Unlock()
						pending[id] = due
					}
				}
				time.Sleep(time.Duration(r.Intn(15)) * time.Millisecond)
			}
		}(w)
	}
	wg.Wait()
	got := h.drain(q.Name, 3*time.Second, 60*time.Second)
	seen := map[string]bool{}
	for _, o := range got {
		seen[o.id] = true
		if id, ok := cancelled[o.id]; ok {
			t.Errorf("cancelled scheduling %s of %s delivered", o.id, id)
		}
		// Delivered with the body of its own scheduling (one replaced after
		// its claim is delivered too, with its own).
		if body, ok := may[o.id]; !ok || o.body != body {
			t.Errorf("delivered %s with body %q, want %q", o.id, o.body, body)
		}
	}
	for mid, id := range must {
		if !seen[mid] {
			t.Errorf("scheduling %s of %s never delivered", mid, id)
		}
	}
	tasks, props, cb, cp := h.idLeftovers(q)
	pending, inflight, dead := h.leftovers(q)
	if tasks+props+cb+cp+pending+inflight+dead != 0 {
		t.Errorf("left: tasks %d props %d claimed %d/%d pending %d in flight %d dead %d", tasks, props, cb, cp, pending, inflight, dead)
	}
	t.Logf("%d deliveries, %d schedulings pending at the end, %d made, %d cancelled", len(got), len(must), len(may), len(cancelled))
}

// TestIDLongShortStringPropertyIsItsOwnFault (review: expected to FAIL
// until fixed). AMQP 0-9-1 carries correlation_id, reply_to, type,
// content_type, content_encoding, the routing key and header names as
// short strings of at most 255 bytes. shard.ParseProperties accepts
// longer ones; amqp091-go then fails the frame write and shuts the whole
// connection down ("lost"), so the task is released (lease 0), claimed
// again at once and kills the connection again, forever, taking every
// other publish in flight on that connection with it. Such a task must be
// dead-lettered alone, with the field named, and the others delivered.
func TestIDLongShortStringPropertyIsItsOwnFault(t *testing.T) {
	t.Parallel()
	q := queueSpec{Name: "shortstr", Shards: 1}
	h := newHarness(t, q)
	q = h.queues[0]
	now := time.Now().UnixMilli()
	long := strings.Repeat("c", 300)
	h.scheduleID(q, "too-long", "body of too-long", `{"correlation_id":"`+long+`"}`, now)
	// Properties whose AMQP header frame outgrows the negotiated frame_max
	// (128 KiB): the broker closes the connection (frame_too_large).
	h.scheduleID(q, "too-big", "body of too-big", `{"headers":{"big":"`+strings.Repeat("h", 200<<10)+`"}}`, now)
	for n := 0; n < 5; n++ {
		h.scheduleID(q, fmt.Sprintf("good-%d", n), fmt.Sprintf("good body %d", n), `{"type":"good"}`, now)
	}
	p := h.start()
	defer p.signal(syscall.SIGTERM)
	bodies := map[string]bool{}
	for _, o := range h.drain(q.Name, 3*time.Second, 10*time.Second) {
		bodies[o.body] = true
	}
	if len(bodies) != 5 {
		t.Errorf("delivered %d of the 5 good tasks alongside bad ones: %v", len(bodies), keysOf(bodies))
	}
	// Dead-lettered at their first claim, once fixed; the drain above
	// already waited seconds.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && (h.deadReasons(q)["too-long"] == "" || h.deadReasons(q)["too-big"] == "") {
		time.Sleep(50 * time.Millisecond)
	}
	why := h.deadReasons(q)["too-long"]
	if !strings.Contains(why, "correlation_id") {
		t.Errorf("task with a 300-byte correlation_id: dead-letter reason %q, want one naming correlation_id", why)
	}
	if why := h.deadReasons(q)["too-big"]; why == "" {
		t.Errorf("task with 200 KiB of headers: not dead-lettered")
	}
}

// TestIDOwnRoutingKeyUnroutable: a task whose own routing key nothing is
// bound to is its producer's mistake: dead-lettered after MAX_ATTEMPTS,
// naming the key, while a task on the queue's key goes out.
func TestIDOwnRoutingKeyUnroutable(t *testing.T) {
	t.Parallel()
	q := queueSpec{Name: "unrouted", Shards: 1}
	h := newHarness(t, q)
	q = h.queues[0]
	h.extra["DISPATCHER_MAX_ATTEMPTS"] = "2"
	h.extra["DISPATCHER_RETRY_MIN"] = "100ms"
	now := time.Now().UnixMilli()
	h.scheduleID(q, "typo", "typo body", `{"routing_key":"no-such-key"}`, now)
	h.scheduleID(q, "fine", "fine body", "", now)
	p := h.start()
	defer p.signal(syscall.SIGTERM)
	got := h.drain(q.Name, 2*time.Second, 15*time.Second)
	if len(got) != 1 || got[0].body != "fine body" {
		t.Fatalf("delivered %+v", got)
	}
	eventually(t, 10*time.Second, "the unroutable one dead-lettered", func() bool { return h.deadReasons(q)["typo"] != "" })
	if why := h.deadReasons(q)["typo"]; !strings.Contains(why, `"no-such-key"`) {
		t.Fatalf("reason %q", why)
	}
}
