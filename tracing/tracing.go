// Package tracing spans the publish of tasks that carry W3C trace context
// (headers traceparent and tracestate in their properties) with
// OpenTelemetry, so that a trace goes producer → dispatcher → consumer
// across the delay.
//
// Each such publish gets one PRODUCER span, a child of the producer's
// span named by the task's traceparent, sampled as the producer decided:
// a parent not sampled, or a traceparent that does not parse, gets no
// span and the headers go out as they came. The message's traceparent
// (and tracestate) become the dispatcher's span's, so the consumer's span
// hangs under it. Spans leave through a batch span processor and an OTLP
// exporter configured by the standard OpenTelemetry environment variables
// (FromEnv); without them there is no Tracer and nothing costs.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/publisher"
)

// Attributes of the dispatcher's own, beside the messaging conventions'.
const (
	// QueueKey is the dispatcher queue the task was scheduled on.
	QueueKey = attribute.Key("dispatcher.queue")
	// TaskIDKey is the task's id (header x-task-id), for tasks that have one.
	TaskIDKey = attribute.Key("dispatcher.task_id")
	// LatenessKey is how late the publish started after the task's due
	// time, in milliseconds (negative: before it, by the clocks' skew).
	LatenessKey = attribute.Key("dispatcher.lateness_ms")
)

// operationName is the messaging.operation.name of the span: AMQP's
// basic.publish. The span is named "publish <exchange>".
const operationName = "publish"

// defaultExchange names the default exchange ("") in span names, as
// RabbitMQ does; messaging.destination.name stays "".
const defaultExchange = "amq.default"

// Options configure FromEnv.
type Options struct {
	// ServiceVersion is the resource's service.version.
	ServiceVersion string
	// Logger receives the exporter's errors (a collector down, ...),
	// at most one a minute. Nil: slog.Default().
	Logger *slog.Logger
}

// Tracer spans publishes (it implements scanner.Tracer). Its methods may
// be called from many goroutines.
type Tracer struct {
	tp    *sdktrace.TracerProvider
	tr    trace.Tracer
	prop  propagation.TraceContext
	where string
}

// FromEnv builds the Tracer the standard OpenTelemetry environment
// variables ask for, or returns nil (and no error) when they ask for none:
// no OTEL_EXPORTER_OTLP_ENDPOINT nor OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
// OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true.
//
// The exporter is OTLP over http/protobuf, or gRPC with
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL=grpc; it reads the other
// OTEL_EXPORTER_OTLP_* variables itself (headers, TLS files, timeout,
// compression). The resource comes from OTEL_SERVICE_NAME (default
// "dispatcher") and OTEL_RESOURCE_ATTRIBUTES, the batch processor's
// settings from OTEL_BSP_*. The sampler is ParentBased: the producer
// decides (OTEL_TRACES_SAMPLER does not apply; the dispatcher starts no
// trace of its own).
//
// Nothing is sent before the first span; Shutdown flushes.
func FromEnv(ctx context.Context, opt Options) (*Tracer, error) {
	on, err := enabled(os.Getenv)
	if err != nil || !on {
		return nil, err
	}
	protocol, where, err := endpoint(os.Getenv)
	if err != nil {
		return nil, err
	}
	res, err := newResource(ctx, opt.ServiceVersion)
	if err != nil {
		return nil, err
	}
	log := opt.Logger
	if log == nil {
		log = slog.Default()
	}
	// The SDK's own logger (stderr by default) would print the raw value
	// of a variable it cannot parse, OTEL_EXPORTER_OTLP_HEADERS included;
	// set before the exporter reads them.
	otel.SetLogger(logr.New(sdkLog{log: log}))
	var exp sdktrace.SpanExporter
	switch protocol {
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter (%s to %s): %w", protocol, where, err)
	}
	// The SDK reports export failures through the global handler; without
	// this they would go to stderr unstructured, one per failed batch.
	otel.SetErrorHandler(&errorLog{log: log, every: time.Minute})
	t := New(exp, sdktrace.WithResource(res))
	t.where = protocol + " to " + where
	return t, nil
}

// New is a Tracer exporting through exp with a batch span processor;
// opts add to the tracer provider's options (e.g. a resource). FromEnv
// builds it from the environment; tests and benchmarks use it directly.
func New(exp sdktrace.SpanExporter, opts ...sdktrace.TracerProviderOption) *Tracer {
	return newTracer(exp, nil, opts...)
}

// newTracer is New with options for the batch span processor (a
// benchmark makes it block rather than drop spans, so that every span's
// export is counted).
func newTracer(exp sdktrace.SpanExporter, batch []sdktrace.BatchSpanProcessorOption, opts ...sdktrace.TracerProviderOption) *Tracer {
	opts = append([]sdktrace.TracerProviderOption{
		sdktrace.WithBatcher(exp, batch...),
		// The producer decides. Roots never happen: Start spans only
		// under a valid, sampled parent.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
	}, opts...)
	tp := sdktrace.NewTracerProvider(opts...)
	return &Tracer{
		tp: tp,
		tr: tp.Tracer("github.com/dispatcher/dispatcher/tracing",
			trace.WithSchemaURL(semconv.SchemaURL)),
	}
}

// Where says what the Tracer exports to: the protocol and the endpoint's
// host (never its path, user info or headers, which may hold secrets).
func (t *Tracer) Where() string { return t.where }

// Shutdown flushes the spans not yet exported and stops the exporter; ctx
// bounds how long that may take. Start must not be called after it.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if err := t.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: flushing spans: %w", err)
	}
	return nil
}

// Start opens the publish span of m when its traceparent names a valid,
// sampled parent, and replaces m.Headers with a copy whose traceparent
// (and tracestate) are the new span's; the map it had is not written to,
// so a caller that publishes m again (a retry) should pass the headers as
// they were, else the retry's span hangs under this one. end closes the
// span, with status error and error.type when err is not nil.
func (t *Tracer) Start(queue string, m *publisher.Message) (end func(err error)) {
	ctx := t.prop.Extract(context.Background(), headers(m.Headers))
	parent := trace.SpanContextFromContext(ctx)
	if !parent.IsValid() || !parent.IsSampled() {
		return noEnd
	}
	now := time.Now()
	name := m.Exchange
	if name == "" {
		name = defaultExchange
	}
	attrs := make([]attribute.KeyValue, 0, 11)
	attrs = append(attrs,
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName(operationName),
		semconv.MessagingDestinationName(m.Exchange),
		semconv.MessagingMessageBodySize(len(m.Body)),
		QueueKey.String(queue),
		LatenessKey.Int64(now.UnixMilli()-m.DueMs),
	)
	if m.RoutingKey != "" { // conditionally required: if not empty
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(m.RoutingKey))
	}
	if m.MessageID != "" {
		attrs = append(attrs, semconv.MessagingMessageID(m.MessageID))
	}
	if m.TaskID != "" {
		attrs = append(attrs, TaskIDKey.String(m.TaskID))
	}
	ctx, span := t.tr.Start(ctx, operationName+" "+name,
		trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(now), trace.WithAttributes(attrs...))
	h := maps.Clone(m.Headers)
	t.prop.Inject(ctx, headers(h))
	m.Headers = h
	return func(err error) {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
		}
		span.End()
	}
}

func noEnd(error) {}

// errorType is the span's error.type: a low-cardinality name of why the
// publish failed.
func errorType(err error) string {
	var returned *publisher.ReturnedError
	var lost *publisher.LostError
	switch {
	case errors.Is(err, publisher.ErrNacked):
		return "nacked"
	case errors.Is(err, publisher.ErrTimeout):
		return "confirm_timeout"
	case errors.Is(err, publisher.ErrNotConnected):
		return "not_connected"
	case errors.Is(err, publisher.ErrStopped):
		return "stopped"
	case errors.As(err, &returned):
		return "returned"
	case errors.As(err, &lost):
		return "connection_lost"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "_OTHER"
}

// headers carries trace context in a message's headers. Only string
// values are read: a traceparent of another type is no trace context.
type headers map[string]any

func (h headers) Get(key string) string {
	s, _ := h[key].(string)
	return s
}

func (h headers) Set(key, value string) { h[key] = value }

func (h headers) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// enabled says whether the environment asks for spans.
func enabled(getenv func(string) string) (bool, error) {
	if v := strings.TrimSpace(getenv("OTEL_SDK_DISABLED")); v != "" {
		disabled, err := strconv.ParseBool(v)
		if err != nil {
			return false, fmt.Errorf("OTEL_SDK_DISABLED: want true or false, got %q", v)
		}
		if disabled {
			return false, nil
		}
	}
	switch v := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); v {
	case "", "otlp":
	case "none":
		return false, nil
	default:
		return false, fmt.Errorf("OTEL_TRACES_EXPORTER: the dispatcher exports spans over OTLP only: want otlp or none, got %q", v)
	}
	return getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "", nil
}

// endpoint returns the protocol to export with and the endpoint's host,
// after checking what the exporter would otherwise ignore with no more
// than a line on stderr (and then send to localhost).
func endpoint(getenv func(string) string) (protocol, host string, err error) {
	protocol = "http/protobuf"
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			if v != "http/protobuf" && v != "grpc" {
				return "", "", fmt.Errorf("%s: want http/protobuf or grpc, got %q", name, v)
			}
			protocol = v
			break
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		v := getenv(name)
		if v == "" {
			continue
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return "", "", fmt.Errorf("%s: want an http:// or https:// URL, got %q", name, redact.URL(v))
		}
		return protocol, u.Host, nil
	}
	return "", "", errors.New("tracing: no OTLP endpoint set")
}

// newResource describes the process: service.name (OTEL_SERVICE_NAME,
// default "dispatcher"), service.version, the SDK's own attributes and
// OTEL_RESOURCE_ATTRIBUTES.
func newResource(ctx context.Context, version string) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{semconv.ServiceName("dispatcher")}
	if version != "" {
		attrs = append(attrs, semconv.ServiceVersion(version))
	}
	// Later detectors win: the environment's over the defaults.
	res, err := resource.New(ctx, resource.WithSchemaURL(semconv.SchemaURL),
		resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	return res, nil
}

// errorLog logs the SDK's errors, the first at once and then at most one
// per every, with how many it left out.
type errorLog struct {
	log   *slog.Logger
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	skipped int
}

func (e *errorLog) Handle(err error) {
	e.mu.Lock()
	now := time.Now()
	if !e.last.IsZero() && now.Sub(e.last) < e.every {
		e.skipped++
		e.mu.Unlock()
		return
	}
	skipped := e.skipped
	e.last, e.skipped = now, 0
	e.mu.Unlock()
	e.log.Warn("exporting spans failed; spans that do not fit the batch queue are dropped",
		"err", redact.String(err.Error()), "similar_errors_not_logged", skipped)
}

// sdkLog passes the SDK's errors to the log, with their message and error
// only: their key-value pairs can hold the raw value of a variable, such
// as a malformed OTEL_EXPORTER_OTLP_HEADERS with its credentials. Its
// info and debug lines (one prints the whole configuration) are dropped.
type sdkLog struct{ log *slog.Logger }

func (sdkLog) Init(logr.RuntimeInfo)            {}
func (sdkLog) Enabled(int) bool                 { return false }
func (sdkLog) Info(int, string, ...any)         {}
func (s sdkLog) WithValues(...any) logr.LogSink { return s }
func (s sdkLog) WithName(string) logr.LogSink   { return s }
func (s sdkLog) Error(err error, msg string, _ ...any) {
	s.log.Warn("OpenTelemetry: "+msg, "err", redact.String(fmt.Sprint(err)))
}
