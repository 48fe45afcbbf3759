package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/tracing"
)

// startTracing builds the process's one Tracer from the standard
// OpenTelemetry variables (see docs/tracing.md). Without them it returns
// a nil scanner.Tracer, so trace context passes through at no cost, and a
// flush that does nothing. flush exports the spans still queued; call it
// once no scanner publishes any more.
func startTracing(ctx context.Context, log *slog.Logger) (t scanner.Tracer, flush func(), err error) {
	tr, err := tracing.FromEnv(ctx, tracing.Options{ServiceVersion: version(), Logger: log.With("component", "tracing")})
	if err != nil || tr == nil {
		// A nil *tracing.Tracer in the interface would not be a nil Tracer.
		return nil, func() {}, err
	}
	// Where names the protocol and host only: the endpoint's path, user
	// info and OTEL_EXPORTER_OTLP_HEADERS may hold secrets.
	log.Info("exporting a span for each published task that carries trace context", "otlp", tr.Where())
	return tr, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(ctx); err != nil {
			log.Warn("spans not exported at stop", "err", err)
		}
	}, nil
}
