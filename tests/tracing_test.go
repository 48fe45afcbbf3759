package tests

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/dispatcher/dispatcher/shard"
	"github.com/dispatcher/dispatcher/tracing/tracingtest"
)

// TestTracingStart: with an OTLP endpoint set the daemon says at start
// that it exports spans, and where (protocol and host, never the
// exporter's headers); a setting it cannot honour stops the start with
// exit code 2 and one line naming it.
func TestTracingStart(t *testing.T) {
	r := tracingtest.NewHTTP(t)
	h := newHarness(t, queueSpec{Name: "traced", Shards: 2})
	h.extra["OTEL_EXPORTER_OTLP_ENDPOINT"] = r.URL
	h.extra["OTEL_EXPORTER_OTLP_HEADERS"] = "authorization=Bearer%20otlp-s3cr3t"
	p := h.start()
	waitLogged(t, p, "dispatching", 15*time.Second)
	u, _ := url.Parse(r.URL)
	out := p.out.String()
	if want := `otlp="http/protobuf to ` + u.Host + `"`; !strings.Contains(out, "exporting a span for each published task that carries trace context") || !strings.Contains(out, want) {
		t.Errorf("no start line saying spans go to %s:\n%s", want, out)
	}
	if strings.Contains(out, "otlp-s3cr3t") {
		t.Errorf("the exporter's headers are logged:\n%s", out)
	}

	env := h.env()
	env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/json"
	bad := start(t, env)
	code := bad.wait(15 * time.Second)
	if out := strings.TrimSpace(bad.out.String()); code != 2 || strings.Count(out, "\n") != 0 || !strings.Contains(out, `OTEL_EXPORTER_OTLP_PROTOCOL: want http/protobuf or grpc, got "http/json"`) {
		t.Errorf("exit %d, output %q: want exit 2 and one line naming OTEL_EXPORTER_OTLP_PROTOCOL", code, out)
	}
}

// TestTraceContextAcrossTheDelay: a task scheduled with a sampled
// traceparent in its properties gets a PRODUCER span under the producer's
// span, and its message carries that span's traceparent (and the
// producer's tracestate), so the consumer's span hangs under both; a
// task whose producer did not sample its trace keeps its headers and gets
// no span. The batch processor waits a minute here: the span reaches the
// receiver only because the daemon flushes it at stop.
func TestTraceContextAcrossTheDelay(t *testing.T) {
	r := tracingtest.NewHTTP(t)
	const m = 2
	h := newHarness(t, queueSpec{Name: "traced", Shards: m})
	h.extra["OTEL_EXPORTER_OTLP_ENDPOINT"] = r.URL
	h.extra["OTEL_SERVICE_NAME"] = "dispatcher-e2e"
	h.extra["OTEL_BSP_SCHEDULE_DELAY"] = "60000"
	p := h.start()
	waitLogged(t, p, "dispatching", 15*time.Second)

	var b [24]byte
	_, _ = rand.Read(b[:])
	traceID, parentID := hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	sampled := "00-" + traceID + "-" + parentID + "-01"
	unsampled := "00-" + traceID + "-" + parentID + "-00"
	due := time.Now().Add(300 * time.Millisecond).UnixMilli()
	schedule := func(id, body, props string) {
		t.Helper()
		ctx := context.Background()
		k := shard.Keys{Prefix: h.prefix, Queue: "traced"}
		i := shard.Index([]byte(id), m)
		_, err := h.rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
			tx.HSet(ctx, k.Tasks(i), id, body)
			tx.HSet(ctx, k.Props(i), id, props)
			tx.ZAdd(ctx, k.Pending(i), redis.Z{Score: float64(due), Member: id})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	schedule("order-1", "body-1", fmt.Sprintf(`{"headers":{"traceparent":%q,"tracestate":"vendor=e2e","tenant":"t1"}}`, sampled))
	schedule("order-2", "body-2", fmt.Sprintf(`{"headers":{"traceparent":%q}}`, unsampled))

	got := map[string]amqp.Delivery{}
	for _, rc := range h.collect("traced", 2, 15*time.Second) {
		id, _ := rc.d.Headers["x-task-id"].(string)
		got[id] = rc.d
	}
	one, two := got["order-1"], got["order-2"]
	if string(one.Body) != "body-1" || string(two.Body) != "body-2" {
		t.Fatalf("deliveries by x-task-id: %v; want order-1 and order-2 with their bodies", got)
	}
	if two.Headers["traceparent"] != unsampled {
		t.Errorf("unsampled task's traceparent %v, want it unchanged: %s", two.Headers["traceparent"], unsampled)
	}
	tp, _ := one.Headers["traceparent"].(string)
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || parts[0] != "00" || parts[1] != traceID || parts[2] == parentID || len(parts[2]) != 16 || parts[3] != "01" {
		t.Fatalf("traced task's traceparent %q: want 00-%s-<the dispatcher's span>-01", tp, traceID)
	}
	if one.Headers["tracestate"] != "vendor=e2e" || one.Headers["tenant"] != "t1" {
		t.Errorf("traced task's headers %v: want tracestate and tenant as the producer gave them", one.Headers)
	}

	p.signal(syscall.SIGTERM)
	if code := p.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit code %d at stop", code)
	}
	spans := r.Spans() // the daemon has exited: flushed or lost
	if len(spans) != 1 {
		t.Fatalf("received %d spans by the daemon's exit, want 1 (the sampled task's): %+v", len(spans), spans)
	}
	s := spans[0]
	if s.TraceID != traceID || s.ParentSpanID != parentID || s.SpanID != parts[2] {
		t.Errorf("span trace %s id %s parent %s; want trace %s, id %s (the message's traceparent), parent %s (the producer's)",
			s.TraceID, s.SpanID, s.ParentSpanID, traceID, parts[2], parentID)
	}
	if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || s.Name != "publish "+h.queues[0].Exchange || s.StatusCode == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("span %q kind %v status %v: want \"publish %s\", PRODUCER, no error", s.Name, s.Kind, s.StatusCode, h.queues[0].Exchange)
	}
	want := map[string]any{
		"messaging.system": "rabbitmq", "messaging.destination.name": h.queues[0].Exchange,
		"messaging.rabbitmq.destination.routing_key": h.queues[0].RoutingKey,
		"messaging.message.id":                       one.MessageId, "messaging.message.body.size": int64(len("body-1")),
		"dispatcher.queue": "traced", "dispatcher.task_id": "order-1",
	}
	for k, v := range want {
		if s.Attrs[k] != v {
			t.Errorf("attribute %s = %#v, want %#v", k, s.Attrs[k], v)
		}
	}
	if late, ok := s.Attrs["dispatcher.lateness_ms"].(int64); !ok || late < -50 || late > 5000 {
		t.Errorf("dispatcher.lateness_ms = %#v, want about 0 (-50 to 5000)", s.Attrs["dispatcher.lateness_ms"])
	}
	if s.Resource["service.name"] != "dispatcher-e2e" {
		t.Errorf("resource %v: want service.name from OTEL_SERVICE_NAME", s.Resource)
	}
}
