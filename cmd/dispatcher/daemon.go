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
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/instances"
	"github.com/dispatcher/dispatcher/internal/liveness"
	"github.com/dispatcher/dispatcher/internal/monitor"
	"github.com/dispatcher/dispatcher/internal/queuestate"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/internal/statuspage"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/scanner"
	"github.com/dispatcher/dispatcher/shard"
)

// runDaemon is the daemon: it loads the settings from the environment and
// dispatches until SIGTERM or SIGINT.
func runDaemon(stderr io.Writer) int {
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
	if cfg.BatchSize > config.MaxBatchSize {
		// Accepted up to 10,000 before: a rolling upgrade must not stop.
		log.Warn(fmt.Sprintf("DISPATCHER_BATCH_SIZE=%d is more than one claim takes: using %d, so that no claim holds Redis past a couple of ms (set it to %d or less to silence this)",
			cfg.BatchSize, config.MaxBatchSize, config.MaxBatchSize))
		cfg.BatchSize = config.MaxBatchSize
	}
	redis.SetLogger(newRedisLogger(log.With("component", "redis-client")))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	if path := os.Getenv("DISPATCHER_TEST_HEAPPROFILE"); path != "" {
		// For the memory an instance's queues cost: what the heap holds
		// when the stop signal comes, before anything stops.
		go func() {
			<-ctx.Done()
			runtime.GC()
			if f, err := os.Create(path); err == nil {
				_ = pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
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
	tracer, flushSpans, err := startTracing(ctx, log)
	if err != nil {
		fmt.Fprintf(stderr, "dispatcher: %v\n", err)
		return exitSettings
	}
	rdb := ropt.NewClient()
	defer rdb.Close()

	// Everything is built first, without touching the network, so that the
	// endpoint serves while the start waits for Redis.
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
	// Queues that hold nothing are looked at together (nil on a cluster).
	idle := scanner.NewIdleWatch(rdb, max(cfg.IdlePollInterval, cfg.PollInterval), log.With("component", "scanner"))
	defer idle.Close()
	// The keys producers write beyond the served shards, found for every
	// queue by one SCAN while the keyspace is small (nil on a cluster).
	strays := scanner.NewStrayScan(rdb, cfg.KeyPrefix, scanner.StrayCycle/2, log.With("component", "strays"))
	defer strays.Close()
	hub := scanner.NewWakeHub(rdb, log)
	defer hub.Close() // after the scanners (deferred later, run first)

	// One id for the whole process: the status page and `dispatcher stats`
	// show it as the holder of the queues' sweeper role.
	instance := scanner.NewInstanceID()
	var scs []*scanner.Queue
	// Liveness: a killed instance's claims are handed out again within
	// DISPATCHER_LIVENESS_TIMEOUT, by whichever instance finds it dead
	// first, in every queue that one serves.
	var live *liveness.Liveness
	var scLive scanner.Liveness // nil when turned off
	if cfg.LivenessTimeout > 0 {
		names := make([]string, len(cfg.QueueSettings))
		for n, q := range cfg.QueueSettings {
			names[n] = q.Name
		}
		// A fence outlives every lease: an instance frozen longer than the
		// records are kept must not find its old id unfenced.
		keep := max(liveness.Keep, 2*cfg.Lease+cfg.Lookahead)
		live = liveness.New(rdb, liveness.Options{Prefix: cfg.KeyPrefix, ID: instance, Timeout: cfg.LivenessTimeout, Queues: names, Keep: keep,
			Logger: log.With("component", "liveness"),
			OnDead: func(ctx context.Context, id string) { handBackDead(ctx, log, scs, id) }})
		scLive = live
	}
	byQueue := map[string]*scanner.Queue{}
	var targets []queuestate.Target
	for _, q := range cfg.QueueSettings {
		targets = append(targets, queuestate.Target{Name: q.Name, Shards: q.Shards})
		scs = append(scs, scanner.NewQueue(rdb, pub, scanner.Options{
			Queue: q.Name, Shards: q.Shards, Exchange: q.Exchange, RoutingKey: q.RoutingKey,
			KeyPrefix: cfg.KeyPrefix, BatchSize: cfg.BatchSize, Pipeline: cfg.Pipeline,
			PollInterval: cfg.PollInterval, IdlePollInterval: cfg.IdlePollInterval, Lookahead: cfg.Lookahead, PublishTick: cfg.PublishTick, ClockReadGap: cfg.ClockReadGap, Lease: cfg.Lease, ShutdownTimeout: cfg.ShutdownTimeout,
			MaxMessageBytes: cfg.MaxMessageBytes, MaxAttempts: cfg.MaxAttempts, Unroutable: q.Unroutable, UnroutableAttempts: q.UnroutableAttempts,
			RetryMin: cfg.RetryMin, RetryMax: cfg.RetryMax, MaxRate: q.MaxRate, StampPublished: cfg.StampPublished, Coalescer: coalescer, IdleWatch: idle, StrayScan: strays, WakeHub: hub, Tracer: tracer,
			Logger: log.With("component", "scanner"), Metrics: smet, Now: clock, InstanceID: instance, Liveness: scLive,
		}))
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

	// Asked once per queue at each read: cfg.Queue's search of every
	// queue's settings made that a thousand squared copies of them.
	type drain struct {
		rate float64
		from string
	}
	drains := make(map[string]drain, len(cfg.QueueSettings))
	for _, q := range cfg.QueueSettings {
		rate, from := q.HerdDrain()
		drains[q.Name] = drain{rate, from}
	}
	mon := monitor.New(rdb, monitor.Options{
		Queues: targets, KeyPrefix: cfg.KeyPrefix, Interval: cfg.StatsInterval, StallAfter: cfg.StallAfter,
		Sweeping: func(q string) bool { return byQueue[q].Sweeping() },
		Dozing:   func(q string) (bool, uint64) { return byQueue[q].Dozing() },
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
		DrainRate: func(q string) (float64, string) {
			if d, ok := drains[q]; ok {
				return d.rate, d.from
			}
			return config.Queue{}.HerdDrain()
		},
		Registerer: reg, Logger: log.With("component", "watchdog"),
	})

	// Every instance writes what it does for each queue to Redis, for the
	// status pages and /readyz of all of them.
	host, pid := hostPID()
	names := make([]string, len(cfg.QueueSettings))
	for n, q := range cfg.QueueSettings {
		names[n] = q.Name
	}
	ingSet := &ingressSet{} // the ingresses, made once the start is over
	records := instances.New(rdb, instances.Options{
		Prefix: cfg.KeyPrefix, ID: instance, Host: host, PID: pid, Version: version(), Queues: names,
		Totals: ingSet.totals(counterTotals(smet.Totals())), Sweeps: func(q string) bool { return byQueue[q].Sweeping() }, Paused: mon.Paused,
		Ingress: ingSet.record,
		Logger:  log.With("component", "instances"),
	})

	// The endpoint serves from here on: /healthz while the process runs,
	// /readyz and the status page saying what the start waits for.
	boot := &startup{since: time.Now()}
	counts := newCountSampler(smet.Totals())
	var httpSrv *httpServer
	if cfg.HTTPAddr != "" {
		httpSrv, err = startHTTP(cfg.HTTPAddr, cfg.HTTPAuthToken, status{reg: reg, rdb: rdb, pub: pub, mon: mon, refusals: refusals, boot: boot, counts: counts, failures: publishFailures(scs),
			recurring: recurringView(rdb, cfg),
			fleet:     &fleet{rdb: rdb, prefix: cfg.KeyPrefix, queues: names, self: records, id: instance},
			ingress:   ingSet, stallAfter: cfg.StallAfter,
			page: statuspage.Data{
				Instance: instance, Refresh: max(2, int((cfg.StatsInterval+time.Second-1)/time.Second)),
				Broker: statuspage.Broker{URL: redact.URLs(strings.Join(nodes, ","))},
				Redis:  statuspage.Redis{URL: redact.URL(cfg.RedisURL), Mode: string(ropt.Mode)},
			}}, log)
		if err != nil {
			log.Error("cannot start", "err", err)
			return exitFailure
		}
	}

	layouts, err := startChecks(ctx, rdb, cfg, log, boot)
	if err != nil {
		if httpSrv != nil {
			httpSrv.stop()
		}
		var refused *redisconn.RefusedError
		switch {
		case ctx.Err() != nil:
			return exitOK // stopped while waiting for Redis
		case errors.As(err, &refused):
			// Settings Redis refuses: like any other bad setting.
			fmt.Fprintf(stderr, "dispatcher: %v\n", redisRefusal(cfg, refused))
			return exitSettings
		}
		log.Error("cannot start", "err", err)
		return exitFailure
	}
	ingresses, err := setupIngress(rdb, cfg, reg, smet, log)
	if err != nil {
		if httpSrv != nil {
			httpSrv.stop()
		}
		log.Error("cannot start", "err", err)
		return exitFailure
	}
	ingSet.set(ingresses)
	boot.started()
	for n, sc := range scs {
		sc.SetLayout(layouts[n])
	}

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

	// Liveness outlives the scanners: their last publishes check it.
	liveCtx, stopLive := context.WithCancel(context.WithoutCancel(ctx))
	defer stopLive()
	var liveDone sync.WaitGroup
	if live != nil {
		live.Prepare(ctx) // before a scanner records a claim under its id
		liveDone.Add(1)
		go func() { defer liveDone.Done(); _ = live.Run(liveCtx) }()
	}
	var scanners sync.WaitGroup
	for _, sc := range scs {
		scanners.Add(1)
		go func() { defer scanners.Done(); _ = sc.Run(ctx) }()
	}
	scanners.Add(1)
	go func() { defer scanners.Done(); mon.Run(ctx) }()
	scanners.Add(1)
	go func() { defer scanners.Done(); records.Run(ctx) }()
	startRecurring(ctx, &scanners, rdb, cfg, byQueue, reg, log, coalescer)
	runIngress(ctx, &scanners, ingresses)
	// One line when Redis is lost and one when it is back, for the process.
	outages := &redisconn.Watcher{Client: rdb, Logger: log.With("component", "redis")}
	scanners.Add(1)
	go func() { defer scanners.Done(); outages.Run(ctx) }()
	if httpSrv != nil { // the status page's published per second and errors
		scanners.Add(1)
		go func() { defer scanners.Done(); counts.Run(ctx) }()
	}
	log.Info("dispatching", "instance", instance, "queues", cfg.Queues, "redis", redact.URL(cfg.RedisURL), "redis_mode", ropt.Mode, "amqp", redact.URLs(strings.Join(nodes, ",")), "amqp_node_order", cfg.AMQPNodeOrder)
	logShardPlacement(ctx, rdb, cfg, log)

	<-ctx.Done()
	log.Info("stopping: claiming nothing new, waiting for outstanding confirms", "timeout", cfg.ShutdownTimeout)
	if live != nil {
		live.Drain() // the others sweep its shards from its next heartbeat on
	}
	scanners.Wait()
	stopLive()
	liveDone.Wait()
	stopPub()
	pubDone.Wait()
	flushSpans() // every span has ended: the last confirms are in
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
// that differs is served as recorded, with a warning. An answer that
// waiting does not change (redisconn.Permanent: a wrong password, a
// database the server lacks, an ACL refusal) ends the wait as a
// *redisconn.RefusedError. boot learns what the wait is for.
func startChecks(ctx context.Context, rdb redis.UniversalClient, cfg *config.Settings, log *slog.Logger, boot *startup) ([]shard.Layout, error) {
	for delay, logged := 100*time.Millisecond, false; ; delay = min(2*delay, 5*time.Second) {
		err := redisconn.Check(ctx, rdb)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if redisconn.Permanent(err) {
			return nil, err
		}
		boot.waitingFor("Redis", redact.Error(err))
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
			errs = append(errs, redisconn.Refused("", err))
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

// redisRefusal is the one line for a setting Redis refuses, naming the
// variable and its value (without the password).
func redisRefusal(cfg *config.Settings, err *redisconn.RefusedError) error {
	return &config.Error{Var: "DISPATCHER_REDIS_URL", Value: cfg.RedisURL, Reason: err.Error()}
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

// redisLogger routes go-redis's own messages (pool and pub/sub trouble)
// into the daemon's log, in its format and with passwords hidden, each
// kind at most once per 10 s: a pub/sub connection the server keeps
// refusing is retried many times a second. Dial failures go to debug.
type redisLogger struct {
	log  *slog.Logger
	mu   *sync.Mutex
	last map[string]time.Time // format -> last logged
}

func newRedisLogger(log *slog.Logger) redisLogger {
	return redisLogger{log: log, mu: &sync.Mutex{}, last: map[string]time.Time{}}
}

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if strings.Contains(format, "failed to dial") {
		// The call that dialled fails with the same error, and its
		// caller logs it ("waiting for Redis", a scanner's error): at
		// info level, the line would only repeat it.
		l.log.DebugContext(ctx, redact.String(fmt.Sprintf(format, v...)))
		return
	}
	l.mu.Lock()
	if time.Since(l.last[format]) < 10*time.Second {
		l.mu.Unlock()
		return
	}
	l.last[format] = time.Now()
	l.mu.Unlock()
	l.log.Warn(redact.String(fmt.Sprintf(format, v...)))
}

// handBackDead hands out again, in every queue, what the dead instance
// with liveness id id had claimed.
func handBackDead(ctx context.Context, log *slog.Logger, qs []*scanner.Queue, id string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	total := 0
	for _, q := range qs {
		n, err := q.HandBack(ctx, id)
		total += n
		if err != nil {
			log.Error("could not hand out a dead instance's tasks at once; their lease will", "queue", q.Queue(), "instance", id, "err", err)
		}
	}
	if total > 0 {
		log.Warn("handed out a dead instance's claimed tasks", "instance", id, "tasks", total)
	}
}
