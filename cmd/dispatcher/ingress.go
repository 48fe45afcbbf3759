package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

// setupIngress makes the AMQP ingress of every queue that has an
// INGRESS_EXCHANGE and declares its exchange and queue: a declaration the
// broker refuses stops the start; a broker not reachable yet does not.
func setupIngress(rdb redis.UniversalClient, cfg *config.Settings, reg prometheus.Registerer, smet *scanner.Metrics, log *slog.Logger) ([]*ingress.Ingress, error) {
	var out []*ingress.Ingress
	var met *ingress.Metrics
	for _, q := range cfg.QueueSettings {
		if q.IngressExchange == "" {
			continue
		}
		if met == nil {
			met = ingress.NewMetrics(reg)
		}
		prod, err := shard.NewProducer(rdb, cfg.KeyPrefix, q.Name, q.Shards)
		if err != nil {
			return nil, fmt.Errorf("ingress of queue %s: %w", q.Name, err)
		}
		maxDelay := q.IngressMaxDelay
		if maxDelay == 0 {
			maxDelay = config.DefaultIngressMaxDelay
		}
		prefetch := q.IngressPrefetch
		if prefetch == 0 {
			prefetch = config.DefaultIngressPrefetch
		}
		g := ingress.New(rdb, prod, ingress.Options{
			Queue: q.Name, Exchange: q.IngressExchange, Prefetch: prefetch, QueueType: q.IngressQueueType,
			MaxDelay: maxDelay, MaxBodyBytes: cfg.MaxMessageBytes, ReadEvery: cfg.StatsInterval,
			OnDeadLetters: func(n int) { smet.DeadLettered(q.Name, n) },
			Dial:          func() (*amqp.Connection, error) { return dialBroker(cfg, "dispatcher ingress") },
			Logger:        log.With("component", "ingress"), Metrics: met,
		})
		if err := g.Setup(); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

func runIngress(ctx context.Context, wg *sync.WaitGroup, gs []*ingress.Ingress) {
	for _, g := range gs {
		wg.Add(1)
		go func() { defer wg.Done(); g.Run(ctx) }()
	}
}
