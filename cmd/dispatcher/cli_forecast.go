package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dispatcher/dispatcher/internal/forecast"
	"github.com/dispatcher/dispatcher/internal/monitor"
)

// forecastRefine is how many buckets `stats --forecast` may split to find
// the busiest second (each a round trip of one call per shard with tasks
// in it).
const forecastRefine = 8

// queueForecast is one queue's forecast as `stats --forecast` prints it:
// the counts and the herd verdict with the drain rate it rests on.
type queueForecast struct {
	forecast.Forecast
	DrainRate     float64 `json:"drain_rate"`
	DrainRateFrom string  `json:"drain_rate_from"`
	HerdLimit     int64   `json:"herd_limit"`
	Herd          bool    `json:"herd"`
}

// readForecasts reads the hour (or window) ahead of the named queues.
func (se *session) readForecasts(ctx context.Context, names []string, w forecast.Window) ([]queueForecast, error) {
	var out []queueForecast
	for _, name := range names {
		q, err := se.queue(ctx, name, false)
		if err != nil {
			return nil, err
		}
		opt := forecast.Options{Prefix: se.cfg.KeyPrefix, Queue: q.Name, Refine: forecastRefine}
		for i := range se.layouts[q.Name].Span() {
			opt.Shards = append(opt.Shards, i)
		}
		f, err := forecast.Read(ctx, se.rdb, opt, w)
		if err != nil {
			return nil, se.redisFailure(err)
		}
		qf := queueForecast{Forecast: f}
		qf.DrainRate, qf.DrainRateFrom = q.HerdDrain()
		qf.HerdLimit = int64(monitor.HerdSeconds * qf.DrainRate)
		qf.Herd = f.Peak.Tasks > qf.HerdLimit
		out = append(out, qf)
	}
	return out, nil
}

// barWidth is the longest text bar of `stats --forecast`.
const barWidth = 40

// writeForecasts prints per queue a line per bucket with a text bar,
// the overdue tasks and the busiest second.
func writeForecasts(w io.Writer, fs []queueForecast) {
	for n, f := range fs {
		if n > 0 {
			fmt.Fprintln(w)
		}
		step := time.Duration(f.StepMs) * time.Millisecond
		from := time.UnixMilli(f.FromMs).UTC()
		fmt.Fprintf(w, "queue %s: tasks falling due per %s over the next %s, from %s UTC (Redis clock)\n", f.Queue, shortDur(step),
			shortDur(step*time.Duration(len(f.Buckets))), from.Format("2006-01-02 15:04:05"))
		fmt.Fprintf(w, "overdue (due before it, not yet claimed): %d\n", f.Overdue)
		var top int64
		for _, b := range f.Buckets {
			top = max(top, b.Tasks)
		}
		layout := "15:04:05"
		if time.Duration(len(f.Buckets))*step > 24*time.Hour-time.Second || from.Day() != from.Add(step*time.Duration(len(f.Buckets))).Day() {
			layout = "2006-01-02 15:04:05"
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "DUE FROM (UTC)\tTASKS\t")
		for _, b := range f.Buckets {
			bar := ""
			if top > 0 && b.Tasks > 0 {
				bar = strings.Repeat("█", max(1, int(barWidth*b.Tasks/top)))
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\n", time.UnixMilli(b.FromMs).UTC().Format(layout), b.Tasks, bar)
		}
		tw.Flush()
		fmt.Fprintf(w, "total: %d\n", f.Total)
		fmt.Fprintln(w, busiest(f))
		for _, b := range f.Broken {
			fmt.Fprintf(w, "queue %s shard %d is broken, not counted: %s\n", f.Queue, b.Shard, b.Err)
		}
	}
}

// busiest says the busiest second and whether it is a herd.
func busiest(f queueForecast) string {
	p := f.Peak
	if p.Tasks == 0 {
		return "busiest second: nothing due"
	}
	s := fmt.Sprintf("busiest second: %d tasks at %s UTC (%s ahead)", p.Tasks, time.UnixMilli(p.FromMs).UTC().Format("2006-01-02 15:04:05"),
		shortDur(time.Duration(p.FromMs-f.FromMs)*time.Millisecond))
	if !p.Exact {
		s += fmt.Sprintf("; not certain: a bucket not looked at second by second holds %d, which could be one second's", p.Bound)
	}
	if f.Herd {
		s += fmt.Sprintf("\nTHUNDERING HERD: more than queue %s drains in %d s at %g/s (%s): %d", f.Queue, monitor.HerdSeconds, f.DrainRate, f.DrainRateFrom, f.HerdLimit)
	}
	return s
}

// shortDur writes 1h, 1m, 30s rather than 1h0m0s.
func shortDur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
