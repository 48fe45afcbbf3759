// Package tracingtest is an OTLP trace receiver for tests: it decodes what
// an exporter sends, over OTLP/HTTP (protobuf) or gRPC, and keeps the
// spans.
package tracingtest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened for assertions.
type Span struct {
	TraceID, SpanID, ParentSpanID string // lowercase hex
	TraceState                    string
	Flags                         uint32
	Name                          string
	Kind                          tracepb.Span_SpanKind
	Start, End                    time.Time
	Attrs                         map[string]any // string, int64, bool, float64
	StatusCode                    tracepb.Status_StatusCode
	StatusMessage                 string
	Scope                         string
	Resource                      map[string]any
}

// Receiver collects the spans exported to URL.
type Receiver struct {
	// URL is the endpoint to give OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP/HTTP
	// exporter adds /v1/traces; the gRPC one dials its host.
	URL string

	mu      sync.Mutex
	spans   []Span
	headers []map[string][]string
}

// NewHTTP starts a receiver of OTLP/HTTP protobuf (POST /v1/traces,
// gzip or not), stopped when the test ends.
func NewHTTP(t testing.TB) *Receiver {
	r := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "want POST /v1/traces", http.StatusNotFound)
			return
		}
		body := io.Reader(req.Body)
		if req.Header.Get("Content-Encoding") == "gzip" {
			z, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = z
		}
		raw, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var m collectorpb.ExportTraceServiceRequest
		if err := proto.Unmarshal(raw, &m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&m, req.Header)
		out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// NewGRPC starts a receiver of OTLP over gRPC (plaintext), stopped when
// the test ends.
func NewGRPC(t testing.TB) *Receiver {
	r := &Receiver{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(srv, grpcService{r: r})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	r.URL = "http://" + lis.Addr().String()
	return r
}

type grpcService struct {
	collectorpb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s grpcService) Export(ctx context.Context, m *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.r.add(m, md)
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

func (r *Receiver) add(m *collectorpb.ExportTraceServiceRequest, headers map[string][]string) {
	var got []Span
	for _, rs := range m.ResourceSpans {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				got = append(got, Span{
					TraceID: hex.EncodeToString(s.TraceId), SpanID: hex.EncodeToString(s.SpanId),
					ParentSpanID: hex.EncodeToString(s.ParentSpanId), TraceState: s.TraceState, Flags: s.Flags,
					Name: s.Name, Kind: s.Kind,
					Start: time.Unix(0, int64(s.StartTimeUnixNano)), End: time.Unix(0, int64(s.EndTimeUnixNano)),
					Attrs: attrs(s.Attributes), StatusCode: s.GetStatus().GetCode(), StatusMessage: s.GetStatus().GetMessage(),
					Scope: ss.GetScope().GetName(), Resource: res,
				})
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spans = append(r.spans, got...)
	r.headers = append(r.headers, headers)
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	out := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.Key] = v.IntValue
		case *commonpb.AnyValue_BoolValue:
			out[kv.Key] = v.BoolValue
		case *commonpb.AnyValue_DoubleValue:
			out[kv.Key] = v.DoubleValue
		default:
			out[kv.Key] = kv.GetValue().String()
		}
	}
	return out
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Headers returns the HTTP headers (or gRPC metadata) of each export
// request received so far.
func (r *Receiver) Headers() []map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]map[string][]string(nil), r.headers...)
}

// Wait returns the spans once at least n were received, failing the test
// after timeout.
func (r *Receiver) Wait(t testing.TB, n int, timeout time.Duration) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if s := r.Spans(); len(s) >= n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("received %d spans within %s, want %d", len(r.Spans()), timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Discard is a span exporter that drops what it is given, for measuring
// what comes before the export.
type Discard struct{}

// ExportSpans drops spans.
func (Discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }

// Shutdown does nothing.
func (Discard) Shutdown(context.Context) error { return nil }

// NewSink starts an OTLP/HTTP endpoint that reads each request and
// answers success without decoding it, for measuring the exporter alone;
// it returns the URL to give the exporter (…/v1/traces accepted) and the
// bytes received so far.
func NewSink(t testing.TB) (url string, received func() int64) {
	var mu sync.Mutex
	var n int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		c, _ := io.Copy(io.Discard, req.Body)
		mu.Lock()
		n += c
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() int64 { mu.Lock(); defer mu.Unlock(); return n }
}
