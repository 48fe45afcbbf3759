package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// ingressWorld is a queue with its AMQP ingress on, a consumer on the
// queue's exchange bound with the producers' keys, and a channel to E.
type ingressWorld struct {
	h        *harness
	queue, e string
	got      <-chan amqp.Delivery
	pub      *amqp.Channel
	proc     *proc
}

func newIngressWorld(t *testing.T, keys []string, extra func(queuePrefix string) map[string]string) *ingressWorld {
	t.Helper()
	// The ingress queue is named after the queue, not the key prefix: a
	// name of this test's own.
	queue := fmt.Sprintf("ing-%d", time.Now().UnixNano()%1_000_000_000)
	return newIngressWorldOn(t, newHarness(t, queueSpec{Name: queue, Shards: 4}), keys, extra)
}

// newIngressWorldOn is newIngressWorld on a harness of one queue.
func newIngressWorldOn(t *testing.T, h *harness, keys []string, extra func(queuePrefix string) map[string]string) *ingressWorld {
	t.Helper()
	queue := h.queues[0].Name
	w := &ingressWorld{h: h, queue: queue, e: h.prefix + ".ingress"}
	h.extra[config.QueuePrefix(queue)+"_INGRESS_EXCHANGE"] = w.e
	if extra != nil {
		for k, v := range extra(config.QueuePrefix(queue)) {
			h.extra[k] = v
		}
	}
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := ch.QueueBind(q.Name, k, h.queues[0].Exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if w.got, err = ch.Consume(q.Name, "", true, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := h.conn.Channel(); err == nil {
			_, _ = c.QueueDelete(ingress.QueueName(queue), false, false, false)
			_ = c.ExchangeDelete(w.e, false, false)
			c.Close()
		}
	})
	w.proc = h.start()
	waitStarted(t, w.proc)
	if w.pub, err = h.conn.Channel(); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *ingressWorld) publish(t *testing.T, key string, m amqp.Publishing) {
	t.Helper()
	if err := w.pub.PublishWithContext(context.Background(), w.e, key, false, false, m); err != nil {
		t.Fatal(err)
	}
}

// receive waits for n distinct message ids and returns every delivery,
// duplicates included (a Redis outage may make the dispatcher publish a
// task again: at least once).
func (w *ingressWorld) receive(t *testing.T, n int, timeout time.Duration) []received {
	t.Helper()
	var out []received
	ids := map[string]bool{}
	end := time.After(timeout)
	for len(ids) < n {
		select {
		case d, ok := <-w.got:
			if !ok {
				t.Fatalf("the consumer's channel closed after %d of %d messages", len(out), n)
			}
			out = append(out, received{at: time.Now(), d: d})
			ids[d.MessageId] = true
		case <-end:
			t.Fatalf("received %d of %d messages within %v; dispatcher log:\n%s", len(ids), n, timeout, tail(w.proc.out.String(), 3000))
		}
	}
	return out
}

// TestIngressGoProducer: a Go producer publishes to E as to the plugin
// (x-delay of several integer types), and the consumer on the queue's
// exchange gets each message with its routing key, body, properties and
// headers, x-task-id = its message_id, x-due-ms = base + delay, never early.
func TestIngressGoProducer(t *testing.T) {
	w := newIngressWorld(t, []string{"orders.created", "billing"}, nil)
	type sent struct {
		key   string
		delay int64
		at    int64 // ms, before the publish
		m     amqp.Publishing
	}
	delays := []any{int32(1500), int64(800), int16(300), int8(0), int32(-5), uint16(1200)}
	var all []sent
	for n, dl := range delays {
		key := "orders.created"
		if n%2 == 1 {
			key = "billing"
		}
		m := amqp.Publishing{
			MessageId: fmt.Sprintf("go-%d", n), Body: []byte(fmt.Sprintf(`{"n":%d}`, n)),
			ContentType: "application/json", ContentEncoding: "identity", CorrelationId: fmt.Sprintf("corr-%d", n),
			ReplyTo: "replies", Type: "order", Priority: 3, Expiration: "600000", DeliveryMode: amqp.Persistent,
			Headers: amqp.Table{"x-delay": dl, "tenant": "acme", "i8": int8(-7), "i16": int16(1234), "i32": int32(-99999),
				"i64": int64(1) << 40, "flag": true, "u8": uint8(200), "f32": float32(1.25), "f64": 2.5, "dec": amqp.Decimal{Scale: 2, Value: 12345},
				"ts": time.Unix(1767225600, 0), "bytes": []byte{0, 1, 254}, "arr": []any{"a", int32(2), []any{true}},
				"nested": amqp.Table{"inner": amqp.Table{"deep": int16(9)}, "s": "x"}, "void": nil},
			Timestamp: time.Unix(1767225600, 0), AppId: "orders-svc",
		}
		di, _ := dl.(int8)
		var d64 int64
		switch v := dl.(type) {
		case int32:
			d64 = int64(v)
		case int64:
			d64 = v
		case int16:
			d64 = int64(v)
		case int8:
			d64 = int64(di)
		case uint16:
			d64 = int64(v)
		}
		all = append(all, sent{key: key, delay: max(d64, 0), at: w.h.redisNow().UnixMilli(), m: m})
		w.publish(t, key, m)
	}
	got := w.receive(t, len(all), 20*time.Second)
	byID := map[string]received{}
	for _, r := range got {
		byID[r.d.MessageId] = r
		if id, _ := r.d.Headers["x-task-id"].(string); id != "" {
			byID[id] = r
		}
	}
	for _, s := range all {
		r, ok := byID[s.m.MessageId]
		if !ok {
			t.Errorf("%s: not delivered with x-task-id = its message_id (got %v)", s.m.MessageId, got)
			continue
		}
		d := r.d
		if string(d.Body) != string(s.m.Body) || d.RoutingKey != s.key {
			t.Errorf("%s: body %q key %q, want %q %q", s.m.MessageId, d.Body, d.RoutingKey, s.m.Body, s.key)
		}
		if d.ContentType != s.m.ContentType || d.ContentEncoding != s.m.ContentEncoding || d.CorrelationId != s.m.CorrelationId ||
			d.ReplyTo != s.m.ReplyTo || d.Type != s.m.Type || d.Priority != s.m.Priority || d.Expiration != s.m.Expiration {
			t.Errorf("%s: properties %+v, want those of %+v", s.m.MessageId, d, s.m)
		}
		if d.MessageId != s.m.MessageId {
			t.Errorf("%s: message_id %q", s.m.MessageId, d.MessageId)
		}
		for k, v := range s.m.Headers {
			// Each value with its own AMQP type (reflect.DeepEqual tells
			// int16 from int32); timestamps by instant.
			if tv, ok := v.(time.Time); ok {
				if g, ok := d.Headers[k].(time.Time); !ok || !g.Equal(tv) {
					t.Errorf("%s: header %s = %v (%T), want %v", s.m.MessageId, k, d.Headers[k], d.Headers[k], v)
				}
				continue
			}
			if g, ok := d.Headers[k]; !ok || !reflect.DeepEqual(g, v) {
				t.Errorf("%s: header %s = %#v (%T), want %#v (%T)", s.m.MessageId, k, d.Headers[k], d.Headers[k], v, v)
			}
		}
		due, ok := d.Headers["x-due-ms"].(int64)
		if !ok {
			t.Errorf("%s: no x-due-ms: %v", s.m.MessageId, d.Headers)
			continue
		}
		if due < s.at+s.delay {
			t.Errorf("%s: due at %d, before its publish (%d) + delay %d", s.m.MessageId, due, s.at, s.delay)
		}
		if r.at.UnixMilli() < due-2 { // the clocks are one machine's; 2 ms for rounding
			t.Errorf("%s: received at %d, before its due time %d", s.m.MessageId, r.at.UnixMilli(), due)
		}
	}
}

func toInt64(v any) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	}
	return 0, false
}

// TestIngressBadInput: each bad task becomes a dead letter of the queue
// with a reason naming the header and the value, its body and properties
// kept, that `dispatcher dead list` shows and `dead requeue` and `dead
// purge` act on; a malformed cancel (no task) is rejected to the ingress
// queue's dead-letter exchange with the reason logged. Nothing is
// redelivered, and the good message after them still gets through:
// nothing blocks the queue.
func TestIngressBadInput(t *testing.T) {
	addr := testenv.FreeAddr(t)
	w := newIngressWorld(t, []string{"k"}, func(qp string) map[string]string {
		return map[string]string{"DISPATCHER_MAX_MESSAGE_BYTES": "1000", qp + "_INGRESS_MAX_DELAY": "1h", "DISPATCHER_HTTP_ADDR": addr}
	})
	msg := func(id string, body []byte, h amqp.Table) amqp.Publishing {
		h["tenant"] = "acme"
		return amqp.Publishing{MessageId: id, Body: body, ContentType: "text/plain", Headers: h}
	}
	bad := []struct {
		name   string
		m      amqp.Publishing
		reason string // in the dead letter's reason and the log line
	}{
		{"string delay", msg("bad-1", []byte("one"), amqp.Table{"x-delay": "5000"}), `header x-delay is 5000 (string): not an integer`},
		{"float delay", msg("bad-2", []byte("two"), amqp.Table{"x-delay": 1.5}), `header x-delay is 1.5 (float64): not an integer`},
		{"beyond max delay", msg("bad-3", []byte("three"), amqp.Table{"x-delay": int64(2 * 3600 * 1000)}),
			`header x-delay is 7200000: due time`},
		{"due beyond max delay", msg("bad-4", []byte("four"), amqp.Table{"x-due-ms": int64(4102444800000)}),
			`header x-due-ms is 4102444800000: due time`},
		{"due not an integer", msg("bad-5", []byte("five"), amqp.Table{"x-due-ms": "tomorrow"}), `header x-due-ms is tomorrow (string): not an integer`},
		{"body too large", msg("bad-6", []byte(strings.Repeat("b", 1001)), amqp.Table{}), `body is 1001 bytes, over DISPATCHER_MAX_MESSAGE_BYTES=1000`},
		// RabbitMQ itself refuses a NaN float header (it closes the
		// connection), so the header that cannot be stored is one too big.
		{"headers too large", msg("bad-7", []byte("seven"), amqp.Table{"big": strings.Repeat("x", 40000)}), `over 32768: header "big" is the largest`},
	}
	for _, b := range bad {
		w.publish(t, "k", b.m)
	}
	badCancel := `header x-dispatcher-cancel is yes (string): want the boolean true`
	w.publish(t, "k", amqp.Publishing{MessageId: "bad-cancel", Headers: amqp.Table{"x-dispatcher-cancel": "yes"}})
	w.publish(t, "k", amqp.Publishing{MessageId: "good", Body: []byte("good"), Headers: amqp.Table{"x-delay": int32(100)}})
	got := w.receive(t, 1, 15*time.Second)
	if id, _ := got[0].d.Headers["x-task-id"].(string); id != "good" {
		t.Fatalf("first delivery is %q, want the good message", id)
	}
	logged := w.proc.out.String()
	for _, b := range bad {
		// slog quotes the value: a quote in it is escaped.
		if !strings.Contains(logged, strings.ReplaceAll(b.reason, `"`, `\"`)) {
			t.Errorf("%s: no log line with %q; log:\n%s", b.name, b.reason, tail(logged, 3000))
		}
	}
	if !strings.Contains(logged, "rejected to the ingress queue's dead-letter exchange") || !strings.Contains(logged, badCancel) {
		t.Errorf("the malformed cancel: no log line rejecting it with %q; log:\n%s", badCancel, tail(logged, 3000))
	}

	// dispatcher dead list shows each one, with its body and properties.
	type deadLetter struct {
		ID, Body, Reason string
		Properties       map[string]any
	}
	list := func() map[string]deadLetter {
		t.Helper()
		code, out := w.h.runCLI(30*time.Second, "dead", "list", "--queue", w.queue, "--json")
		if code != 0 {
			t.Fatalf("dead list: exit %d: %s", code, out)
		}
		var page struct{ Dead []deadLetter }
		if err := json.Unmarshal([]byte(out), &page); err != nil {
			t.Fatalf("dead list --json: %v: %s", err, out)
		}
		m := map[string]deadLetter{}
		for _, d := range page.Dead {
			m[d.ID] = d
		}
		return m
	}
	dead := list()
	for _, b := range bad {
		d, ok := dead[b.m.MessageId]
		if !ok {
			t.Errorf("%s: %s is not a dead letter: %v", b.name, b.m.MessageId, dead)
			continue
		}
		if !strings.Contains(d.Reason, b.reason) || d.Body != string(b.m.Body) {
			t.Errorf("%s: dead letter reason %q body %.40q, want a reason with %q and body %.40q", b.name, d.Reason, d.Body, b.reason, b.m.Body)
		}
		if d.Properties["routing_key"] != "k" || d.Properties["content_type"] != "text/plain" || d.Properties["message_id"] != b.m.MessageId ||
			!strings.Contains(fmt.Sprint(d.Properties["amqp_headers"]), "acme") {
			t.Errorf("%s: dead letter properties %v, want the message's", b.name, d.Properties)
		}
	}
	if len(dead) != len(bad) {
		t.Errorf("%d dead letters, want %d (the malformed cancel is none): %v", len(dead), len(bad), dead)
	}
	// Counted as the queue's dead letters (DispatcherDeadLettersGrowing).
	if v, ok := queueMetric(addr, "dispatcher_tasks_dead_lettered_total", w.queue); v != float64(len(bad)) {
		t.Errorf("dispatcher_tasks_dead_lettered_total = %v (exported %v), want %d", v, ok, len(bad))
	}
	// Acked or rejected, not requeued: the ingress queue is empty, and no
	// refused message was delivered.
	ch, err := w.h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(ingress.QueueName(w.queue), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("ingress queue holds %d messages after the bad ones were refused", q.Messages)
	}
	select {
	case d := <-w.got:
		t.Errorf("a refused message was delivered: %v", d.Headers)
	case <-time.After(time.Second):
	}

	// Requeued, a dead letter is delivered with its body and headers;
	// purged, it is gone.
	if code, out := w.h.runCLI(30*time.Second, "dead", "requeue", "--queue", w.queue, "bad-1"); code != 0 {
		t.Fatalf("dead requeue bad-1: exit %d: %s", code, out)
	}
	r := w.receive(t, 1, 15*time.Second)[0].d
	if id, _ := r.Headers["x-task-id"].(string); id != "bad-1" || string(r.Body) != "one" || r.RoutingKey != "k" || r.Headers["tenant"] != "acme" || r.MessageId != "bad-1" {
		t.Errorf("requeued bad-1 delivered as id %q body %q key %q message_id %q headers %v", id, r.Body, r.RoutingKey, r.MessageId, r.Headers)
	}
	if code, out := w.h.runCLI(30*time.Second, "dead", "purge", "--queue", w.queue, "--yes", "bad-2"); code != 0 {
		t.Fatalf("dead purge bad-2: exit %d: %s", code, out)
	}
	dead = list()
	if _, ok := dead["bad-1"]; ok {
		t.Errorf("bad-1 still dead after its requeue")
	}
	if _, ok := dead["bad-2"]; ok {
		t.Errorf("bad-2 still dead after its purge")
	}
	if len(dead) != len(bad)-2 {
		t.Errorf("%d dead letters left, want %d", len(dead), len(bad)-2)
	}
}

// TestIngressBadInputNotStored: a bad message whose dead letter Redis
// refuses (here its shard's dead-letter key holds a string) is rejected to
// the ingress queue's dead-letter exchange, with the reason and why it was
// not stored logged; not redelivered, and the queue goes on.
func TestIngressBadInputNotStored(t *testing.T) {
	w := newIngressWorld(t, []string{"k"}, nil)
	const id = "bad-unstored"
	deadKey := shard.Keys{Prefix: w.h.prefix, Queue: w.queue}.Dead(shard.Index([]byte(id), 4))
	if err := w.h.rdb.Set(context.Background(), deadKey, "not a zset", 0).Err(); err != nil {
		t.Fatal(err)
	}
	w.publish(t, "k", amqp.Publishing{MessageId: id, Body: []byte("x"), Headers: amqp.Table{"x-delay": "soon"}})
	w.publish(t, "k", amqp.Publishing{MessageId: "good", Body: []byte("good"), Headers: amqp.Table{"x-delay": int32(100)}})
	got := w.receive(t, 1, 15*time.Second)
	if id, _ := got[0].d.Headers["x-task-id"].(string); id != "good" {
		t.Fatalf("first delivery is %q, want the good message", id)
	}
	eventually(t, 5*time.Second, "the rejection logged", func() bool {
		out := w.proc.out.String()
		return strings.Contains(out, "rejected to the ingress queue's dead-letter exchange") &&
			strings.Contains(out, `header x-delay is soon (string): not an integer`) && strings.Contains(out, "WRONGTYPE")
	})
	ch, err := w.h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(ingress.QueueName(w.queue), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != 0 {
		t.Errorf("ingress queue holds %d messages after the bad one was rejected", q.Messages)
	}
	if v, _ := w.h.rdb.Get(context.Background(), deadKey).Result(); v != "not a zset" {
		t.Errorf("the dead-letter key changed: %q", v)
	}
}

// TestIngressCancel: a message with x-dispatcher-cancel = true and the
// task's message_id cancels the task it names.
func TestIngressCancel(t *testing.T) {
	w := newIngressWorld(t, []string{"k"}, nil)
	w.publish(t, "k", amqp.Publishing{MessageId: "c-1", Body: []byte("cancelled"), Headers: amqp.Table{"x-delay": int32(2000)}})
	w.publish(t, "k", amqp.Publishing{MessageId: "c-2", Body: []byte("kept"), Headers: amqp.Table{"x-delay": int32(2000)}})
	w.publish(t, "k", amqp.Publishing{MessageId: "c-1", Headers: amqp.Table{"x-dispatcher-cancel": true}})
	got := w.receive(t, 1, 15*time.Second)
	if id, _ := got[0].d.Headers["x-task-id"].(string); id != "c-2" {
		t.Fatalf("delivered %q, want c-2 only", id)
	}
	select {
	case d := <-w.got:
		t.Errorf("the cancelled task was delivered: %v", d.Headers)
	case <-time.After(2 * time.Second):
	}
}

// TestIngressKillMidIngest: an instance killed (SIGKILL) while it ingests
// 2,000 messages leaves its unacked deliveries to the next one; every
// message arrives, and a message_id makes one task however often its
// message was delivered to the ingress.
func TestIngressKillMidIngest(t *testing.T) {
	w := newIngressWorld(t, []string{"k"}, func(qp string) map[string]string {
		return map[string]string{qp + "_INGRESS_PREFETCH": "100"}
	})
	if err := w.pub.Confirm(false); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	confirms := w.pub.NotifyPublish(make(chan amqp.Confirmation, n))
	killed := false
	for i := range n {
		w.publish(t, "k", amqp.Publishing{MessageId: fmt.Sprintf("kill-%d", i), Body: []byte(fmt.Sprint(i)),
			Headers: amqp.Table{"x-delay": int32(6000)}})
		if i == n/3 {
			w.proc.signal(syscall.SIGKILL) // mid-ingest: it holds deliveries unacked
			killed = true
		}
		if i%200 == 0 {
			time.Sleep(20 * time.Millisecond) // about 2,000 a second... at most
		}
	}
	for range n {
		if c := <-confirms; !c.Ack {
			t.Fatalf("publish %d nacked by the broker", c.DeliveryTag)
		}
	}
	if !killed || w.proc.wait(5*time.Second) == 0 {
		t.Fatal("the first instance was not killed")
	}
	// How many were in Redis when the next instance started, and how many
	// the broker holds again (ready): what it re-ingests.
	var inRedis int64
	for i := range 4 {
		inRedis += w.h.rdb.ZCard(context.Background(), fmt.Sprintf("%s:{%s:%d}", w.h.prefix, w.queue, i)).Val()
	}
	if c, err := w.h.conn.Channel(); err == nil {
		if q, err := c.QueueDeclarePassive(ingress.QueueName(w.queue), true, false, false, false, amqp.Table{"x-queue-type": "quorum"}); err == nil {
			t.Logf("after the kill: %d tasks in Redis, %d messages in the ingress queue (%d re-ingested)", inRedis, q.Messages, int64(q.Messages)+inRedis-n)
		}
		c.Close()
	}
	b := w.h.start()
	waitStarted(t, b)
	got := w.receive(t, n, 30*time.Second)
	// A quiet second to catch late duplicates.
	extra := 0
	for end := time.After(time.Second); ; {
		select {
		case <-w.got:
			extra++
			continue
		case <-end:
		}
		break
	}
	ids := map[string]int{}
	for _, r := range got {
		ids[r.d.MessageId]++
	}
	var missing []string
	for i := range n {
		if ids[fmt.Sprintf("kill-%d", i)] == 0 {
			missing = append(missing, fmt.Sprintf("kill-%d", i))
		}
	}
	if len(missing) > 0 || len(got)+extra != n {
		t.Fatalf("%d missing (%.5v), %d deliveries for %d messages", len(missing), missing, len(got)+extra, n)
	}
}

// TestIngressExchangeOfAnotherType: an ingress exchange that exists as
// another type (here direct, as for the plugin's x-delayed-message) stops
// the start with an error naming it.
func TestIngressExchangeOfAnotherType(t *testing.T) {
	queue := fmt.Sprintf("ingt-%d", time.Now().UnixNano()%1_000_000_000)
	h := newHarness(t, queueSpec{Name: queue, Shards: 1})
	e := h.prefix + ".direct"
	ch, err := h.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare(e, "direct", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := h.conn.Channel(); err == nil {
			_ = c.ExchangeDelete(e, false, false)
			_, _ = c.QueueDelete(ingress.QueueName(queue), false, false, false)
			c.Close()
		}
	})
	h.extra[config.QueuePrefix(queue)+"_INGRESS_EXCHANGE"] = e
	p := h.start()
	if code := p.wait(20 * time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1; output:\n%s", code, tail(p.out.String(), 2000))
	}
	if want := fmt.Sprintf("declaring ingress exchange %q as a durable topic exchange", e); !strings.Contains(p.out.String(), strings.ReplaceAll(want, `"`, `\"`)) {
		t.Fatalf("no error naming the exchange (%s); output:\n%s", want, tail(p.out.String(), 2000))
	}
}

// TestIngressRedisDown: while Redis is down nothing is acked and the
// messages wait in RabbitMQ; once it is back every one arrives.
func TestIngressRedisDown(t *testing.T) {
	srv := testenv.StartRedis(t, testenv.RedisOptions{AOF: true, AppendFsync: "always"})
	queue := fmt.Sprintf("ingr-%d", time.Now().UnixNano()%1_000_000_000)
	h := newHarnessOn(t, srv.Client(), queueSpec{Name: queue, Shards: 4})
	h.extra["DISPATCHER_REDIS_URL"] = srv.URL()
	w := newIngressWorldOn(t, h, []string{"k"}, nil)
	const n = 300
	for i := range n {
		if i == 100 {
			srv.Kill()
		}
		w.publish(t, "k", amqp.Publishing{MessageId: fmt.Sprintf("rd-%d", i), Headers: amqp.Table{"x-delay": int32(1000)}})
		if i%10 == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	time.Sleep(3 * time.Second)
	if !strings.Contains(w.proc.out.String(), "nothing acked") {
		t.Errorf("no log line saying nothing is acked while Redis is down")
	}
	srv.Restart()
	srv.WaitLoaded(10 * time.Second)
	got := w.receive(t, n, 30*time.Second)
	t.Logf("%d deliveries for %d messages", len(got), n)
	ids := map[string]bool{}
	for _, r := range got {
		ids[r.d.MessageId] = true
	}
	for i := range n {
		if !ids[fmt.Sprintf("rd-%d", i)] {
			t.Errorf("rd-%d missing", i)
		}
	}
}

// TestIngressCancelBeforeTask: a cancel ingested before its task (here
// published first) still cancels it.
func TestIngressCancelBeforeTask(t *testing.T) {
	w := newIngressWorld(t, []string{"k"}, nil)
	w.publish(t, "k", amqp.Publishing{MessageId: "early-cancel", Headers: amqp.Table{"x-dispatcher-cancel": true}})
	time.Sleep(300 * time.Millisecond) // ingested in a batch of its own
	w.publish(t, "k", amqp.Publishing{MessageId: "early-cancel", Body: []byte("cancelled"), Headers: amqp.Table{"x-delay": int32(1000)}})
	w.publish(t, "k", amqp.Publishing{MessageId: "kept", Body: []byte("kept"), Headers: amqp.Table{"x-delay": int32(1000)}})
	got := w.receive(t, 1, 15*time.Second)
	if id := got[0].d.MessageId; id != "kept" {
		t.Fatalf("delivered %q, want kept only", id)
	}
	select {
	case d := <-w.got:
		t.Errorf("the task cancelled ahead was delivered: %s", d.MessageId)
	case <-time.After(2 * time.Second):
	}
}
