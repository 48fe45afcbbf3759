package tracing

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/tracing/tracingtest"
)

// TestMain fails the package's tests if any goroutine outlives them: a
// Tracer's batch processor and exporter must stop with Shutdown.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The exporter's HTTP client keeps idle connections to the test's
		// receiver until they time out; they are no Tracer's goroutines.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// otelEnv clears every OTEL_* variable for the test and sets env.
func otelEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			t.Setenv(k, "") // restored when the test ends
			os.Unsetenv(k)
		}
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
}

// producer is a producer's span context as a traceparent carries it.
type producer struct{ traceID, spanID string }

func newProducer() producer {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return producer{traceID: hex.EncodeToString(b[:16]), spanID: hex.EncodeToString(b[16:])}
}

func (p producer) traceparent(flags string) string {
	return "00-" + p.traceID + "-" + p.spanID + "-" + flags
}

func startFromEnv(t *testing.T, env map[string]string) *Tracer {
	t.Helper()
	otelEnv(t, env)
	tr, err := FromEnv(context.Background(), Options{ServiceVersion: "v1.2.3-test"})
	if err != nil {
		t.Fatal(err)
	}
	if tr == nil {
		t.Fatal("FromEnv returned no Tracer with an endpoint set")
	}
	return tr
}

func shutdown(t *testing.T, tr *Tracer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSpanUnderProducer: a task whose traceparent is sampled gets one
// PRODUCER span, a child of the producer's, with the messaging attributes;
// the message goes out with that span's traceparent and the producer's
// tracestate, and the caller's headers map is left as it was.
func TestSpanUnderProducer(t *testing.T) {
	for _, protocol := range []string{"http/protobuf", "grpc"} {
		t.Run(protocol, func(t *testing.T) {
			var r *tracingtest.Receiver
			if protocol == "grpc" {
				r = tracingtest.NewGRPC(t)
			} else {
				r = tracingtest.NewHTTP(t)
			}
			tr := startFromEnv(t, map[string]string{
				"OTEL_EXPORTER_OTLP_ENDPOINT": r.URL,
				"OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
				"OTEL_SERVICE_NAME":           "dispatcher-under-test",
			})
			u, _ := url.Parse(r.URL)
			if want := protocol + " to " + u.Host; tr.Where() != want {
				t.Errorf("Where() = %q, want %q", tr.Where(), want)
			}

			p := newProducer()
			due := time.Now().Add(-1500 * time.Millisecond).UnixMilli()
			in := map[string]any{"traceparent": p.traceparent("01"), "tracestate": "vendor=abc,other=1", "tenant": "t1", "n": int64(7)}
			orig := maps.Clone(in)
			m := &publisher.Message{Exchange: "orders.x", RoutingKey: "orders", Body: []byte("hello"),
				MessageID: "0123456789abcdef-1700000000000", DueMs: due, TaskID: "order-42", Headers: in}
			before := time.Now()
			end := tr.Start("orders", m)
			end(nil)
			shutdown(t, tr)

			spans := r.Spans()
			if len(spans) != 1 {
				t.Fatalf("got %d spans, want 1: %+v", len(spans), spans)
			}
			s := spans[0]
			if s.TraceID != p.traceID || s.ParentSpanID != p.spanID {
				t.Errorf("span trace %s parent %s, want the producer's: trace %s parent %s", s.TraceID, s.ParentSpanID, p.traceID, p.spanID)
			}
			if s.SpanID == p.spanID || len(s.SpanID) != 16 {
				t.Errorf("span id %q: want a new one", s.SpanID)
			}
			if s.Kind != tracepb.Span_SPAN_KIND_PRODUCER || s.Name != "publish orders.x" {
				t.Errorf("span %q kind %v, want \"publish orders.x\" PRODUCER", s.Name, s.Kind)
			}
			if s.TraceState != "vendor=abc,other=1" {
				t.Errorf("span tracestate %q, want the producer's", s.TraceState)
			}
			if s.StatusCode != tracepb.Status_STATUS_CODE_UNSET {
				t.Errorf("status %v %q, want unset", s.StatusCode, s.StatusMessage)
			}
			want := map[string]any{
				"messaging.system":                           "rabbitmq",
				"messaging.operation.type":                   "send",
				"messaging.operation.name":                   "publish",
				"messaging.destination.name":                 "orders.x",
				"messaging.rabbitmq.destination.routing_key": "orders",
				"messaging.message.id":                       "0123456789abcdef-1700000000000",
				"messaging.message.body.size":                int64(5),
				"dispatcher.queue":                           "orders",
				"dispatcher.task_id":                         "order-42",
			}
			for k, v := range want {
				if s.Attrs[k] != v {
					t.Errorf("attribute %s = %#v, want %#v", k, s.Attrs[k], v)
				}
			}
			late, _ := s.Attrs["dispatcher.lateness_ms"].(int64)
			if maxLate := time.Since(before).Milliseconds() + 1500; late < 1500 || late > maxLate {
				t.Errorf("dispatcher.lateness_ms = %v, want between 1500 and %d", s.Attrs["dispatcher.lateness_ms"], maxLate)
			}
			if s.Resource["service.name"] != "dispatcher-under-test" || s.Resource["service.version"] != "v1.2.3-test" {
				t.Errorf("resource %v: want OTEL_SERVICE_NAME and the version", s.Resource)
			}
			if s.Scope != "github.com/dispatcher/dispatcher/tracing" {
				t.Errorf("scope %q", s.Scope)
			}

			// The message names the new span; the rest passes unchanged.
			if got, want := m.Headers["traceparent"], "00-"+p.traceID+"-"+s.SpanID+"-01"; got != want {
				t.Errorf("message traceparent %v, want %s (the dispatcher's span)", got, want)
			}
			if m.Headers["tracestate"] != "vendor=abc,other=1" || m.Headers["tenant"] != "t1" || m.Headers["n"] != int64(7) || len(m.Headers) != 4 {
				t.Errorf("message headers %v: want the others unchanged", m.Headers)
			}
			if !maps.Equal(in, orig) {
				t.Errorf("the caller's headers map was written to: %v, was %v", in, orig)
			}
		})
	}
}

// TestNoSpan: a parent the producer did not sample, a traceparent that
// does not parse and one of another type get no span, and their headers
// pass unchanged; a sampled task beside them (on the default exchange,
// without routing key) proves the receiver would have seen one.
func TestNoSpan(t *testing.T) {
	r := tracingtest.NewHTTP(t)
	tr := startFromEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": r.URL + "/v1/traces"})
	p := newProducer()
	cases := map[string]map[string]any{
		"not sampled":        {"traceparent": p.traceparent("00"), "tracestate": "vendor=abc"},
		"malformed":          {"traceparent": "00-" + p.traceID + "-nothex0000000000-01"},
		"zero trace id":      {"traceparent": "00-00000000000000000000000000000000-" + p.spanID + "-01"},
		"unknown flags v00":  {"traceparent": p.traceparent("ff")},
		"truncated":          {"traceparent": "00-" + p.traceID},
		"not a string":       {"traceparent": int64(1)},
		"uppercase hex":      {"traceparent": strings.ToUpper(p.traceparent("01"))},
		"extra field in v00": {"traceparent": p.traceparent("01") + "-00"},
	}
	for name, h := range cases {
		orig := maps.Clone(h)
		m := &publisher.Message{Exchange: "x", Body: []byte("b"), MessageID: "id", Headers: h}
		tr.Start("q", m)(nil)
		if !maps.Equal(m.Headers, orig) {
			t.Errorf("%s: headers %v, want them unchanged: %v", name, m.Headers, orig)
		}
	}
	control := &publisher.Message{RoutingKey: "", Body: []byte("b"), Headers: map[string]any{"traceparent": p.traceparent("01")}}
	tr.Start("q", control)(nil)
	shutdown(t, tr)

	spans := r.Spans()
	if len(spans) != 1 {
		t.Fatalf("got %d spans, want only the control's: %+v", len(spans), spans)
	}
	s := spans[0]
	if s.ParentSpanID != p.spanID || s.Name != "publish amq.default" || s.Attrs["messaging.destination.name"] != "" {
		t.Errorf("control span %q parent %s destination %#v, want \"publish amq.default\" under %s with destination \"\"",
			s.Name, s.ParentSpanID, s.Attrs["messaging.destination.name"], p.spanID)
	}
	for _, k := range []string{"messaging.rabbitmq.destination.routing_key", "dispatcher.task_id", "messaging.message.id"} {
		if v, ok := s.Attrs[k]; ok {
			t.Errorf("attribute %s = %#v on a message without one", k, v)
		}
	}
}

// TestPublishFailed: a publish that fails ends its span with status
// error, the error's text and a low-cardinality error.type.
func TestPublishFailed(t *testing.T) {
	r := tracingtest.NewHTTP(t)
	tr := startFromEnv(t, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": r.URL})
	p := newProducer()
	errs := map[string]error{
		"nacked":          fmt.Errorf("publish: %w", publisher.ErrNacked),
		"returned":        &publisher.ReturnedError{Code: 312, Reason: "NO_ROUTE"},
		"confirm_timeout": publisher.ErrTimeout,
		"_OTHER":          errors.New("something else"),
	}
	for typ, err := range errs {
		m := &publisher.Message{Exchange: typ, Headers: map[string]any{"traceparent": p.traceparent("01")}}
		tr.Start("q", m)(err)
	}
	shutdown(t, tr)
	spans := r.Spans()
	if len(spans) != len(errs) {
		t.Fatalf("got %d spans, want %d", len(spans), len(errs))
	}
	for _, s := range spans {
		typ := strings.TrimPrefix(s.Name, "publish ")
		if s.StatusCode != tracepb.Status_STATUS_CODE_ERROR || s.StatusMessage != errs[typ].Error() || s.Attrs["error.type"] != typ {
			t.Errorf("span %q: status %v %q, error.type %v; want error %q, %s", s.Name, s.StatusCode, s.StatusMessage, s.Attrs["error.type"], errs[typ], typ)
		}
	}
}

// TestFromEnvOff: without an endpoint, or with the SDK or the traces
// exporter turned off, there is no Tracer.
func TestFromEnvOff(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"nothing set":          {"OTEL_SERVICE_NAME": "x"},
		"SDK disabled":         {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"},
		"traces exporter none": {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces", "OTEL_TRACES_EXPORTER": "none"},
	} {
		t.Run(name, func(t *testing.T) {
			otelEnv(t, env)
			tr, err := FromEnv(context.Background(), Options{})
			if err != nil || tr != nil {
				t.Fatalf("FromEnv = %v, %v; want no Tracer and no error", tr, err)
			}
		})
	}
}

// TestFromEnvBad: settings the dispatcher cannot honour stop it with an
// error naming the variable and the value, passwords hidden; the
// endpoint shown at start is its host alone.
func TestFromEnvBad(t *testing.T) {
	for name, c := range map[string]struct {
		env  map[string]string
		want string
	}{
		"protocol":        {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, `OTEL_EXPORTER_OTLP_PROTOCOL: want http/protobuf or grpc, got "http/json"`},
		"traces protocol": {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL: want http/protobuf or grpc, got "thrift"`},
		"exporter":        {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", "OTEL_TRACES_EXPORTER": "zipkin"}, `OTEL_TRACES_EXPORTER: the dispatcher exports spans over OTLP only: want otlp or none, got "zipkin"`},
		"sdk disabled":    {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", "OTEL_SDK_DISABLED": "maybe"}, `OTEL_SDK_DISABLED: want true or false, got "maybe"`},
		"no scheme":       {map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, `OTEL_EXPORTER_OTLP_ENDPOINT: want an http:// or https:// URL, got "collector:4318"`},
		"password":        {map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://user:s3cret@h/v1/traces"}, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: want an http:// or https:// URL, got "ftp://user:xxxxx@h/v1/traces"`},
	} {
		t.Run(name, func(t *testing.T) {
			otelEnv(t, c.env)
			tr, err := FromEnv(context.Background(), Options{})
			if err == nil || err.Error() != c.want || tr != nil {
				t.Fatalf("FromEnv = %v, %v; want error %q", tr, err, c.want)
			}
		})
	}

	t.Run("where shows the host only", func(t *testing.T) {
		tr := startFromEnv(t, map[string]string{
			"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://user:s3cret@collector.example:4318/secret-path/v1/traces",
			"OTEL_EXPORTER_OTLP_HEADERS":         "authorization=Bearer%20t0ken",
		})
		defer shutdown(t, tr) // nothing to send: no span
		if tr.Where() != "http/protobuf to collector.example:4318" {
			t.Errorf("Where() = %q", tr.Where())
		}
	})
}

// TestExportErrorsLogged: the SDK's export errors go to the log, at most
// one a period, with how many were left out, passwords hidden.
func TestExportErrorsLogged(t *testing.T) {
	var buf bytes.Buffer
	e := &errorLog{log: slog.New(slog.NewTextHandler(&buf, nil)), every: time.Hour}
	e.Handle(errors.New(`Post "http://u:s3cret@h/v1/traces": connection refused`))
	e.Handle(errors.New("again"))
	e.Handle(errors.New("and again"))
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, "connection refused") || strings.Contains(out, "s3cret") {
		t.Fatalf("log %q: want one line with the first error, password hidden", out)
	}
	e.last = time.Now().Add(-2 * time.Hour)
	e.Handle(errors.New("later"))
	if out := buf.String(); !strings.Contains(out, "later") || !strings.Contains(out, "similar_errors_not_logged=2") {
		t.Fatalf("log %q: want the later error with the 2 left out", out)
	}
}

// TestSDKLogsNoSecrets: what the SDK logs about variables it cannot parse
// reaches the log without the variable's value (a malformed
// OTEL_EXPORTER_OTLP_HEADERS holds credentials).
func TestSDKLogsNoSecrets(t *testing.T) {
	r := tracingtest.NewHTTP(t)
	otelEnv(t, map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": r.URL,
		"OTEL_EXPORTER_OTLP_HEADERS":  "authorization=Bearer%zzs3cret,x-api-key-s3cret",
	})
	var buf bytes.Buffer
	tr, err := FromEnv(context.Background(), Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	if err != nil || tr == nil {
		t.Fatalf("FromEnv = %v, %v", tr, err)
	}
	shutdown(t, tr)
	out := buf.String()
	if !strings.Contains(out, "OpenTelemetry: parse headers") || !strings.Contains(out, "OpenTelemetry: escape header value") {
		t.Errorf("log %q: want the SDK's two complaints about the headers", out)
	}
	if strings.Contains(out, "s3cret") {
		t.Errorf("log shows a header's value: %q", out)
	}
}
