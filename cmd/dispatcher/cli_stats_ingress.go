package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/statuspage"
)

// ingressStats is a queue's AMQP ingress as `dispatcher stats` shows it,
// from the records of the live instances that run it.
type ingressStats struct {
	Queue        string `json:"queue"`
	Exchange     string `json:"exchange"`
	IngressQueue string `json:"ingress_queue"`
	// Instances run it; Consuming of them consume the ingress queue.
	Instances int `json:"instances"`
	Consuming int `json:"consuming"`
	// Ready is the most messages ready any of them read, null if none
	// read it.
	Ready            *int64  `json:"ready"`
	OldestAgeSeconds float64 `json:"oldest_message_age_seconds"`
	// Over the last SpanSeconds (the records' window): tasks written per
	// second, and errors by cause, all instances together.
	IngestedPerSecond float64                  `json:"ingested_per_second"`
	Errors            map[string]int64         `json:"errors"`
	SpanSeconds       float64                  `json:"span_seconds"`
	NotConsuming      []instances.NotConsuming `json:"not_consuming,omitempty"`
	// errText is the errors by cause, for the table.
	errText string
}

// readIngressStats reads the queues' records and sums their ingresses;
// the queues whose records cannot be read are named in skipped.
func readIngressStats(ctx context.Context, se *session, names []string) (out []ingressStats, skipped []string) {
	for _, q := range instances.Read(ctx, se.rdb, se.cfg.KeyPrefix, names, instances.TTL) {
		if q.Err != nil {
			skipped = append(skipped, fmt.Sprintf("queue %s: its instances' records cannot be read, so its AMQP ingress is not shown: %v", q.Name, q.Err))
			continue
		}
		s := instances.AddIngress(q.Records)
		if s == nil {
			continue
		}
		st := ingressStats{Queue: q.Name, Exchange: s.Exchange, IngressQueue: ingress.QueueName(q.Name), Instances: s.Instances, Consuming: s.Consuming,
			OldestAgeSeconds: float64(s.OldestMs) / 1000, IngestedPerSecond: s.Rate, Errors: s.Errors, SpanSeconds: float64(s.SpanMs) / 1000,
			NotConsuming: s.NotConsuming, errText: s.ErrorText()}
		if s.Ready >= 0 {
			st.Ready = &s.Ready
		}
		out = append(out, st)
	}
	return out, skipped
}

// writeIngressStats prints a row per ingress, then why instances do not
// consume and what was refused.
func writeIngressStats(w io.Writer, rows []ingressStats, skipped []string) {
	if len(rows) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "INGRESS\tEXCHANGE\tINGRESS QUEUE\tREADY\tOLDEST MESSAGE AGE\tINGESTED/S\tERRORS\tCONSUMING\t")
		for _, r := range rows {
			ready := "-"
			if r.Ready != nil {
				ready = fmt.Sprint(*r.Ready)
			}
			var errs int64
			for _, n := range r.Errors {
				errs += n
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d of %d\t\n", r.Queue, r.Exchange, r.IngressQueue, ready,
				age(time.Duration(r.OldestAgeSeconds*float64(time.Second))), statuspage.FmtRate(r.IngestedPerSecond), errs, r.Consuming, r.Instances)
		}
		tw.Flush()
		fmt.Fprintln(w)
	}
	for _, r := range rows {
		span := (time.Duration(r.SpanSeconds * float64(time.Second))).Round(time.Second)
		if r.errText != "" {
			fmt.Fprintf(w, "queue %s: the ingress refused or failed to write messages over the last %s: %s (the instances' logs give each reason)\n", r.Queue, span, r.errText)
		}
		for _, nc := range r.NotConsuming {
			fmt.Fprintf(w, "queue %s: instance %s does not consume %s: %s\n", r.Queue, nc.ID, r.IngressQueue, nc.Err)
		}
	}
	for _, s := range skipped {
		fmt.Fprintln(w, s)
	}
}
