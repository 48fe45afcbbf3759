package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/coalesce"
	"github.com/dispatcher/dispatcher/internal/statuspage"
	"github.com/dispatcher/dispatcher/recurring"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

func fmtMs(v int64) string {
	if v == 0 {
		return "-"
	}
	return time.UnixMilli(v).UTC().Format("2006-01-02 15:04:05.000")
}

// recurringRow is a schedule as the status page and the list show it.
func recurringRow(e recurring.Entry) statuspage.Recurring {
	r := statuspage.Recurring{Queue: e.Queue, Name: e.Name, Cron: e.Cron, TZ: e.TZ, CatchUp: e.CatchUp, Source: e.Source, Paused: e.Paused}
	if r.CatchUp == "" {
		r.CatchUp = recurring.CatchUpLatest
	}
	if e.Status != nil {
		r.NextMs, r.LastMs, r.Error = e.Status.NextMs, e.Status.LastMs, e.Status.Error
	}
	return r
}

// recurringView reads the served queues' schedules for the status page.
func recurringView(rdb redis.UniversalClient, cfg *config.Settings) func(context.Context) []statuspage.Recurring {
	return func(ctx context.Context) []statuspage.Recurring {
		var out []statuspage.Recurring
		for _, q := range cfg.Queues {
			es, err := recurring.NewStore(rdb, shard.Keys{Prefix: cfg.KeyPrefix, Queue: q}).List(ctx)
			if err != nil {
				continue // the page shows Redis's problems on its own
			}
			for _, e := range es {
				e.Queue = q
				out = append(out, recurringRow(e))
			}
		}
		return out
	}
}

// startRecurring runs a materialiser per queue (working while this
// instance sweeps the queue) and, with DISPATCHER_RECURRING_FILE, the
// file's watcher; wg waits for them.
func startRecurring(ctx context.Context, wg *sync.WaitGroup, rdb redis.UniversalClient, cfg *config.Settings,
	byQueue map[string]*scanner.Queue, reg prometheus.Registerer, log *slog.Logger, co *coalesce.Coalescer) {
	met := recurring.NewMetrics(reg)
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		co = nil // the revision keys live on many primaries
	}
	revs := recurring.NewRevWatch(rdb, 0, log.With("component", "recurring")) // nil on a cluster
	if revs != nil {
		wg.Add(1)
		go func() { defer wg.Done(); revs.Run(ctx) }()
	}
	for _, q := range cfg.QueueSettings {
		sq := byQueue[q.Name]
		m := recurring.New(rdb, recurring.Options{Keys: shard.Keys{Prefix: cfg.KeyPrefix, Queue: q.Name},
			Sweeping: sq.Sweeping, Layout: sq.Layout, Metrics: met, Logger: log.With("component", "recurring"), Coalescer: co, RevWatch: revs})
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.Run(ctx) }()
	}
	if cfg.RecurringFile != "" {
		w := recurring.NewWatcher(cfg.RecurringFile, recurring.NewReconciler(rdb, cfg.KeyPrefix, cfg.Queues, log.With("component", "recurring-file")), log.With("component", "recurring-file"))
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
}
