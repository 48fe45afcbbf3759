package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/shard"
)

// setupIngress makes the AMQP ingress of every queue that has an
// INGRESS_EXCHANGE and declares its exchange and queue: a declaration the
// broker refuses stops the start; a broker not reachable yet does not.
func setupIngress(rdb redis.UniversalClient, cfg *config.Settings, reg prometheus.Registerer, log *slog.Logger) ([]*ingress.Ingress, error) {
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
			MaxDelay: maxDelay, MaxBodyBytes: cfg.MaxMessageBytes,
			Dial:   func() (*amqp.Connection, error) { return dialIngress(cfg) },
			Logger: log.With("component", "ingress"), Metrics: met,
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

// dialIngress connects to the first node of DISPATCHER_AMQP_URL that
// answers, for the ingress's consuming connection.
func dialIngress(cfg *config.Settings) (*amqp.Connection, error) {
	var tlsConf *tls.Config
	if f := cfg.AMQPTLSFiles(); !f.Empty() {
		c, err := f.Config()
		if err != nil {
			return nil, fmt.Errorf("AMQP TLS: %w", err)
		}
		tlsConf = c
	}
	var errs []string
	for _, u := range cfg.AMQPURLs() {
		c := amqp.Config{Dial: amqp.DefaultDial(10 * time.Second), Properties: amqp.Table{"connection_name": "dispatcher ingress"}}
		if strings.HasPrefix(strings.ToLower(u), "amqps://") {
			c.TLSClientConfig = tlsConf
		}
		conn, err := amqp.DialConfig(u, c)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", redact.URL(u), redact.Error(err)))
	}
	return nil, errors.New(strings.Join(errs, "; "))
}
