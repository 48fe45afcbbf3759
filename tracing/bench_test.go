package tracing

import (
	"context"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/tracing/tracingtest"
)

// BenchmarkStartEnd is the cost of tracing one published task on the
// publishing goroutine: Start and end on a message with a sampled
// traceparent, the span handed to the batch processor (whose exporter
// here drops it: BenchmarkExport adds the export).
func BenchmarkStartEnd(b *testing.B) {
	tr := New(tracingtest.Discard{})
	defer tr.Shutdown(context.Background())
	headers := map[string]any{"traceparent": newProducer().traceparent("01"), "tracestate": "vendor=abc"}
	body := make([]byte, 200)
	due := time.Now().UnixMilli()
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		m := publisher.Message{Exchange: "orders.x", RoutingKey: "orders", Body: body,
			MessageID: "0123456789abcdef-1700000000000", DueMs: due, TaskID: "order-42", Headers: headers}
		tr.Start("orders", &m)(nil)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkExport is the whole cost of tracing one published task: Start
// and end, and the span's batching and export over OTLP/HTTP (protobuf)
// to an endpoint in this process that reads and drops it. The batch
// processor blocks rather than drops here, so that every span's export
// is paid for. cpu-ns/op is the process's CPU time per task, all
// goroutines (reading the requests too); B/op and allocs/op count every
// goroutine's allocations; ns/op is wall time, the export's waits
// included.
func BenchmarkExport(b *testing.B) {
	url, received := tracingtest.NewSink(b)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(url+"/v1/traces"))
	if err != nil {
		b.Fatal(err)
	}
	tr := newTracer(exp, []sdktrace.BatchSpanProcessorOption{sdktrace.WithBlocking()})
	headers := map[string]any{"traceparent": newProducer().traceparent("01"), "tracestate": "vendor=abc"}
	body := make([]byte, 200)
	due := time.Now().UnixMilli()
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		m := publisher.Message{Exchange: "orders.x", RoutingKey: "orders", Body: body,
			MessageID: "0123456789abcdef-1700000000000", DueMs: due, TaskID: "order-42", Headers: headers}
		tr.Start("orders", &m)(nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil { // the last batch's export counts too
		b.Fatal(err)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(received())/float64(b.N), "wire-B/op")
}

// BenchmarkNotSampled is the cost for a task whose producer did not
// sample its trace: the traceparent is parsed, nothing else.
func BenchmarkNotSampled(b *testing.B) {
	tr := New(tracingtest.Discard{})
	defer tr.Shutdown(context.Background())
	m := publisher.Message{Exchange: "x", Headers: map[string]any{"traceparent": newProducer().traceparent("00")}}
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		tr.Start("orders", &m)(nil)
	}
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
}

// cpuTime is the process's CPU time so far, user and system, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
