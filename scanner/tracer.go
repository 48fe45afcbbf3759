package scanner

import "github.com/dispatcher/dispatcher/publisher"

// Tracer spans the publish of tasks that carry trace context across the
// delay (package tracing implements it with OpenTelemetry).
type Tracer interface {
	// Start is called just before m is published, only when
	// m.Headers["traceparent"] is a string. It may replace the
	// traceparent and tracestate headers with its own span's, so that the
	// consumer's span hangs under it. end is called exactly once with the
	// publish's outcome: nil once confirmed, else why it was not.
	Start(queue string, m *publisher.Message) (end func(err error))
}
