package statuspage

import (
	"time"

	"github.com/dispatcher/dispatcher/internal/instances"
)

// Ingress is one queue's AMQP ingress as this instance runs it (package
// ingress, docs/migrating-from-delayed-plugin.md).
type Ingress struct {
	Queue, Exchange, IngressQueue string
	Consuming                     bool
	// Since is when it last started or stopped consuming; Err why it does
	// not consume.
	Since time.Time
	Err   string
	// Ready is the messages ready in the ingress queue at its last read
	// (ReadAt), -1 if not known; Consumers the queue's consumers then.
	Ready     int64
	Consumers int
	ReadAt    time.Time
	// Held deliveries are taken and not yet written to Redis.
	Held int
	// OldestAge is how long the oldest message not yet in Redis has
	// waited, as far as this instance knows.
	OldestAge time.Duration
	// NotReady and Behind are its /readyz lines, "" for none.
	NotReady, Behind string
}

// ingressRow is one ingress as the page shows it, with the queue's
// ingress as a whole from the instances' records.
type ingressRow struct {
	Ingress
	State, Class string // "consuming", "ok"; "behind", "warn"; ...
	ReadAgo      string
	Whole        *instances.IngressSum
	Errors       string // the whole's errors by cause
}

func ingressRows(d Data, whole map[string]instances.Queue) []ingressRow {
	var out []ingressRow
	for _, in := range d.Ingress {
		r := ingressRow{Ingress: in, State: "consuming", Class: "ok"}
		switch {
		case in.NotReady != "" && in.Consuming:
			r.State, r.Class = "stalled", "bad"
		case !in.Consuming:
			r.State, r.Class = "not consuming", "bad"
			if in.NotReady == "" {
				r.Class = "warn"
			}
		case in.Behind != "":
			r.State, r.Class = "behind", "warn"
		}
		if in.Ready >= 0 {
			r.ReadAgo = fmtAgo(d.Now, in.ReadAt)
		}
		if q, ok := whole[in.Queue]; ok {
			if r.Whole = instances.AddIngress(q.Records); r.Whole != nil {
				r.Errors = r.Whole.ErrorText()
			}
		}
		out = append(out, r)
	}
	return out
}
