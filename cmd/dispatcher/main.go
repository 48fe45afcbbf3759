// Command dispatcher moves due tasks from sharded Redis sorted sets to a
// RabbitMQ exchange. main only wires the parts together.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/bench"
	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/monitor"
	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/internal/statuspage"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes.
const (
	exitOK       = 0
	exitFailure  = 1 // could not start (e.g. shard count mismatch)
	exitSettings = 2 // bad settings or arguments
)

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			config.Usage(stdout)
			return exitOK
		case "bench": // measure this dispatcher against the raw broker
			return bench.Main(args[1:], stdout, stderr)
		case "stats": // what the queues hold, read from Redis
			return runStats(args[1:], stdout, stderr)
		case "schedule":
			return runSchedule(args[1:], stdout, stderr)
		case "cancel":
			return runCancel(args[1:], stdout, stderr)
		case "dead":
			return runDead(args[1:], stdout, stderr)
		case "reshard":
			return runReshard(args[1:], stdout, stderr)
		case "recurring":
			return runRecurring(args[1:], stdout, stderr)
		case "pause", "resume":
			return runPause(args[1:], stdout, stderr, args[0] == "pause")
		default:
			fmt.Fprintf(stderr, "dispatcher: unknown argument %q (see dispatcher --help)\n", args[0])
			return exitSettings
		}
	}
	cfg, err := config.Load()
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher: %v\n", err)
		return exitSettings
	}
	clock, err := testClock(stderr)
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher: %v\n", err)
		return exitSettings
	}
	if path := os.Getenv("DISPATCHER_TEST_CPUPROFILE"); path != "" {
		// For profiling the daemon under a benchmark; written at exit.
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer func() { pprof.StopCPUProfile(); f.Close() }()
		}
	}
	log := newLogger(cfg, stderr)
	if cfg.IdlePollInterval > shard.DefaultWakeWithin {
		// Tasks due between the two after their ZADD get no wake-up from the
		// Go producer and are found by a sweep after their due time.
		log.Warn("DISPATCHER_IDLE_POLL_INTERVAL is longer than the Go producer's wake-up window: on a quiet queue, tasks due that soon after their ZADD can be late by the difference (raise the producers' SetWakeWithin to match)",
			"idle_poll_interval", cfg.IdlePollInterval, "wake_within", shard.DefaultWakeWithin)
	}
	redis.SetLogger(newRedisLogger(log.With("component", "redis-client")))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	ropt, err := redisOptions(cfg)
	if err != nil { // Load validated it; kept for safety
		fmt.Fprintf(stderr, "dispatcher: %v\n", err)
		return exitSettings
	}
	var amqpTLS *tls.Config
	if f := cfg.AMQPTLSFiles(); !f.Empty() {
		if amqpTLS, err = f.Config(); err != nil {
			fmt.Fprintf(stderr, "dispatcher: AMQP TLS: %v\n", err)
			return exitSettings
		}
	}
	rdb := ropt.NewClient()
	defer rdb.Close()

	layouts, err := startChecks(ctx, rdb, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			return exitOK // stopped while waiting for Redis
		}
		log.Error("cannot start", "err", err)
		return exitFailure
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exchanges := make([]string, 0, len(cfg.QueueSettings))
	for _, q := range cfg.QueueSettings {
		exchanges = append(exchanges, q.Exchange)
	}
	nodes := cfg.AMQPURLs()
	if cfg.AMQPNodeOrder == config.NodeOrderShuffle {
		nodes = publisher.Shuffled(nodes)
	}
	pub := publisher.New(publisher.Options{
		URLs:           nodes,
		TLS:            amqpTLS,
		Exchanges:      exchanges,
		ConfirmTimeout: cfg.ConfirmTimeout,
		Logger:         log.With("component", "publisher"),
		Metrics:        publisher.NewMetrics(reg),
	})
	smet := scanner.NewMetrics(reg)
	// Shared by the queues' scanners; closed on return, when every scanner
	// has stopped (a Do after Close would still be answered).
	coalescer := scanner.NewCoalescer(rdb)
	defer coalescer.Close()

	// The publisher outlives the scanners: their last confirms need it.
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	var pubDone sync.WaitGroup
	pubDone.Add(1)
	go func() {
		defer pubDone.Done()
		if err := pub.Run(pubCtx); err != nil {
			log.Error("publisher stopped", "err", err)
		}
	}()

	// One id for the whole process: the status page and `dispatcher stats`
	// show it as the holder of the queues' sweeper role.
	instance := scanner.NewInstanceID()
	var scs []*scanner.Queue
	byQueue := map[string]*scanner.Queue{}
	var targets []queuestate.Target
	for n, q := range cfg.QueueSettings {
		targets = append(targets, queuestate.Target{Name: q.Name, Shards: layouts[n].Span()})
		scs = append(scs, scanner.NewQueue(rdb, pub, scanner.Options{
			Queue: q.Name, Shards: q.Shards, Exchange: q.Exchange, RoutingKey: q.RoutingKey,
			KeyPrefix: cfg.KeyPrefix, BatchSize: cfg.BatchSize, Pipeline: cfg.Pipeline,
			PollInterval: cfg.PollInterval, IdlePollInterval: cfg.IdlePollInterval, Lookahead: cfg.Lookahead, PublishTick: cfg.PublishTick, Lease: cfg.Lease, ShutdownTimeout: cfg.ShutdownTimeout,
			MaxMessageBytes: cfg.MaxMessageBytes, MaxAttempts: cfg.MaxAttempts,
			RetryMin: cfg.RetryMin, RetryMax: cfg.RetryMax, MaxRate: q.MaxRate, StampPublished: cfg.StampPublished, Coalescer: coalescer,
			Logger: log.With("component", "scanner"), Metrics: smet, Now: clock, InstanceID: instance,
		}, layouts[n]))
		byQueue[q.Name] = scs[len(scs)-1]
	}
	refusals := func() []string {
		var out []string
		for _, sc := range scs {
			if why := sc.RedisRefusal(); why != "" && !slices.Contains(out, why) {
				out = append(out, why)
			}
		}
		return out
	}

	mon := monitor.New(rdb, monitor.Options{
		Queues: targets, KeyPrefix: cfg.KeyPrefix, Interval: cfg.StatsInterval, StallAfter: cfg.StallAfter,
		Sweeping: func(q string) bool { return byQueue[q].Sweeping() },
		Layout:   func(q string) shard.Layout { return byQueue[q].Layout() },
		Waiting: func(q string) []string {
			var why []string
			switch {
			case pub.Blocked():
				why = append(why, "the broker blocks publishes (memory or disk alarm)")
			case !pub.Ready():
				why = append(why, "the broker is not connected")
			}
			return append(why, byQueue[q].Waiting()...)
		},
		Registerer: reg, Logger: log.With("component", "watchdog"),
	})

	var httpSrv *httpServer
	if cfg.HTTPAddr != "" {
		httpSrv, err = startHTTP(cfg.HTTPAddr, status{reg: reg, rdb: rdb, pub: pub, mon: mon, refusals: refusals,
			recurring: recurringView(rdb, cfg), page: statuspage.Data{
				Instance: instance, Refresh: max(2, int((cfg.StatsInterval+time.Second-1)/time.Second)),
				Broker: statuspage.Broker{URL: redact.URLs(strings.Join(nodes, ","))},
				Redis:  statuspage.Redis{URL: redact.URL(cfg.RedisURL), Mode: string(ropt.Mode)},
			}}, log)
		if err != nil {
			log.Error("cannot start", "err", err)
			stopPub()
			pubDone.Wait()
			return exitFailure
		}
	}

	var scanners sync.WaitGroup
	for _, sc := range scs {
		scanners.Add(1)
		go func() { defer scanners.Done(); _ = sc.Run(ctx) }()
	}
	scanners.Add(1)
	go func() { defer scanners.Done(); mon.Run(ctx) }()
	startRecurring(ctx, &scanners, rdb, cfg, byQueue, reg, log)
	log.Info("dispatching", "instance", instance, "queues", cfg.Queues, "redis", redact.URL(cfg.RedisURL), "redis_mode", ropt.Mode, "amqp", redact.URLs(strings.Join(nodes, ",")), "amqp_node_order", cfg.AMQPNodeOrder)
	logShardPlacement(ctx, rdb, cfg, log)

	<-ctx.Done()
	log.Info("stopping: claiming nothing new, waiting for outstanding confirms", "timeout", cfg.ShutdownTimeout)
	scanners.Wait()
	stopPub()
	pubDone.Wait()
	if httpSrv != nil {
		httpSrv.stop()
	}
	log.Info("stopped")
	return exitOK
}

// redisOptions are the Redis connection settings of cfg, TLS files
// applied; errors name the setting and never show a password.
func redisOptions(cfg *config.Settings) (*redisconn.Options, error) {
	ropt, err := redisconn.Parse(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("DISPATCHER_REDIS_URL: %v", redact.Error(err))
	}
	ropt.SetDefaultTimeouts()
	if f := cfg.RedisTLSFiles(); !f.Empty() {
		tc, err := f.Apply(ropt.TLSConfig())
		if err != nil {
			return nil, fmt.Errorf("Redis TLS: %w", err)
		}
		ropt.SetTLSConfig(tc)
	}
	return ropt, nil
}

func newLogger(cfg *config.Settings, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// startChecks waits for Redis, then reads every queue's layout, recording
// the configured shard count for a queue that has none yet. Once recorded,
// Redis is the truth (`dispatcher reshard` changes it): a configured count
// that differs is served as recorded, with a warning.
func startChecks(ctx context.Context, rdb redis.UniversalClient, cfg *config.Settings, log *slog.Logger) ([]shard.Layout, error) {
	for delay, logged := 100*time.Millisecond, false; ; delay = min(2*delay, 5*time.Second) {
		err := rdb.Ping(ctx).Err()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !logged {
			log.Warn("waiting for Redis", "redis", redact.URL(cfg.RedisURL), "err", redact.Error(err))
			logged = true
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// A least-privilege ACL user, or a managed Redis, may not allow CONFIG:
	// the check is advice, so it is skipped with a note, never fatal. On a
	// cluster every primary holds shards, so every primary is asked.
	_ = redisconn.ForEachPrimary(ctx, rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		if policy, err := c.ConfigGet(ctx, "maxmemory-policy").Result(); err != nil {
			log.Info("cannot read maxmemory-policy; make sure it is noeviction (an evicting Redis can drop scheduled tasks)",
				"node", addr, "err", redact.Error(err))
		} else if p := policy["maxmemory-policy"]; p != "" && p != "noeviction" {
			log.Warn("Redis may evict keys: scheduled tasks can silently disappear; set maxmemory-policy noeviction",
				"node", addr, "maxmemory-policy", p)
		}
		return nil
	})
	var errs []error
	layouts := make([]shard.Layout, len(cfg.QueueSettings))
	for n, q := range cfg.QueueSettings {
		keys := shard.Keys{Prefix: cfg.KeyPrefix, Queue: q.Name}
		l, err := shard.EnsureLayout(ctx, rdb, keys, q.Shards)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		layouts[n] = l
		switch {
		case l.Changing() && (q.Shards == l.From || q.Shards == l.Shards):
			log.Info("the queue's shard count is changing; serving the shards of both counts", "queue", q.Name, "layout", l.String())
		case q.Shards != l.Shards:
			log.Warn("the queue's shard count recorded in Redis differs from the configured one: serving the recorded one (set the variable to it; `dispatcher reshard` changes the count)",
				"queue", q.Name, "layout", l.String(), "setting", fmt.Sprintf("DISPATCHER_QUEUE_%s_SHARDS=%d", config.EnvName(q.Name), q.Shards))
		}
	}
	return layouts, errors.Join(errs...)
}

// testClock returns the local clock, shifted by DISPATCHER_TEST_CLOCK_SKEW
// (a Go duration) when set: the fault tests run instances whose clocks are
// minutes apart to show that only Redis's clock decides.
func testClock(w io.Writer) (func() time.Time, error) {
	v := os.Getenv("DISPATCHER_TEST_CLOCK_SKEW")
	if v == "" {
		return time.Now, nil
	}
	skew, err := time.ParseDuration(v)
	if err != nil {
		return nil, fmt.Errorf("DISPATCHER_TEST_CLOCK_SKEW=%q: %w", v, err)
	}
	fmt.Fprintf(w, "test: local clock skewed by %s\n", skew)
	return func() time.Time { return time.Now().Add(skew) }, nil
}

// redisLogger routes go-redis's own messages (dial failures, pool and
// pub/sub trouble) into the daemon's log, in its format and with passwords
// hidden, each kind at most once per 10 s: a pub/sub connection the server
// keeps refusing is retried many times a second.
type redisLogger struct {
	log  *slog.Logger
	mu   *sync.Mutex
	last map[string]time.Time // format -> last logged
}

func newRedisLogger(log *slog.Logger) redisLogger {
	return redisLogger{log: log, mu: &sync.Mutex{}, last: map[string]time.Time{}}
}

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.mu.Lock()
	if time.Since(l.last[format]) < 10*time.Second {
		l.mu.Unlock()
		return
	}
	l.last[format] = time.Now()
	l.mu.Unlock()
	l.log.Warn(redact.String(fmt.Sprintf(format, v...)))
}
