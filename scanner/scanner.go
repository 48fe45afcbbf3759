// Package scanner moves due tasks of one queue from its Redis shards to the
// broker: it claims them atomically into a leased in-flight set, publishes
// them with confirms, and forgets them only once confirmed. Claims also
// reap expired leases, so tasks of an instance that died go out again.
package scanner

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/balancer"
	"github.com/dispatcher/dispatcher/internal/coalesce"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// Publisher is what the scanner needs of the broker side.
type Publisher interface {
	// PublishGated is a publish that asks still(i) before writing msgs[i]
	// after a wait (see publisher.Publisher.PublishGated).
	PublishGated(ctx context.Context, msgs []publisher.Message, still func(i int) error) []error
	// PublishAlone publishes one message on a channel of its own, asking
	// still right before writing it (see publisher.Publisher.PublishAlone).
	PublishAlone(ctx context.Context, msg publisher.Message, still func() error) error
	WaitReady(ctx context.Context) error
}

// Options configure the scanner of one queue.
type Options struct {
	Queue string
	// Shards is how many shards to serve: indexes 0..Shards-1 (during a
	// change of the shard count, those of both counts).
	Shards int
	// Layout is the shard count producers hash with, for counting tasks
	// found elsewhere; 0: not counted.
	Layout     int
	Exchange   string
	RoutingKey string
	KeyPrefix  string

	BatchSize    int           // most tasks per claim
	Pipeline     int           // claimed batches being published at once
	PollInterval time.Duration // how often the shards of a queue in use are swept
	// IdlePollInterval is how far the sweeps of a quiet queue stretch out:
	// each sweep that finds nothing new doubles the interval, from
	// PollInterval up to this; a sweep that finds a task due sooner than
	// this, or a wake-up, brings it back to PollInterval. 0 or less than
	// PollInterval: always PollInterval.
	IdlePollInterval time.Duration
	Lease            time.Duration
	ShutdownTimeout  time.Duration // wait for outstanding confirms on stop
	MaxMessageBytes  int
	MaxAttempts      int
	// Unroutable is what a task the broker returns as unroutable gets:
	// UnroutableRetry (""), UnroutableDeadLetter or UnroutableDrop.
	Unroutable string
	// UnroutableAttempts: with UnroutableDeadLetter, the returns after
	// which a task is dead-lettered; 0: MaxAttempts.
	UnroutableAttempts int
	// Lookahead lets a claim take tasks due up to this long after the
	// claim; the instance holds them and publishes each at its due time.
	// 0: only tasks already due are claimed.
	Lookahead time.Duration
	// PublishTick makes held tasks go out at the first multiple of it at
	// or after their due time, those of one tick in one publish: fewer,
	// larger publishes for up to a tick of lateness. 0: each at its due
	// time.
	PublishTick time.Duration
	// ClockReadGap is the least time between two readings of a primary's
	// clock for held tasks (see clockCheck); 0: one for each instant.
	ClockReadGap time.Duration
	RetryMin     time.Duration
	RetryMax     time.Duration
	// MaxRate limits the tasks the queue's instances claim, together, to
	// this many a second (a token bucket in Redis); 0: no limit. With a
	// limit, claims take due tasks only (no look-ahead): a token is taken
	// when a task is claimed, so tasks claimed ahead of a burst would all
	// go out at its due time, over the limit.
	MaxRate float64

	// Coalescer, shared by the scanners of one instance, sends their sweeps
	// and sweeper-role renewals that fall due together in one round trip
	// (NewCoalescer). Nil: each goes on its own.
	Coalescer *coalesce.Coalescer

	// WakeHub, shared by the scanners of one instance on one Redis,
	// carries every queue's wake channel over one subscription
	// (NewWakeHub). Nil: each queue subscribes on a connection of its own.
	WakeHub *WakeHub

	// IdleWatch, shared by the scanners of one instance, looks at the
	// queues that hold nothing in one call per Redis, so that they need no
	// sweeps of their own (NewIdleWatch; see doze.go). Nil: every queue
	// sweeps.
	IdleWatch *IdleWatch

	// StrayScan, shared by the queues of one instance, finds the keys
	// producers write beyond their served shards by one SCAN of the
	// keyspace while that is cheaper than each queue's walk of the
	// indexes (NewStrayScan; see strayscan.go). Nil: the queues walk.
	StrayScan *StrayScan

	// StampPublished adds header x-published-us to every message.
	StampPublished bool

	// Tracer, if set, is told of every message about to be published
	// whose headers carry a W3C traceparent (see Tracer). Nil: trace
	// context passes through unchanged and costs nothing.
	Tracer Tracer

	Logger  *slog.Logger
	Metrics *Metrics

	// OnLayout, if set, is called when the queue's wake channel says its
	// layout changed. It must not wait: over a WakeHub it runs on the
	// goroutine that reads every queue's wake-ups.
	OnLayout func()

	// Liveness, if set, is the instance's liveness (internal/liveness):
	// claims are recorded under its id, so that another instance hands
	// them out at once if this one dies, and tasks are published only
	// while it says so. Nil: claims come back only when their lease ends.
	Liveness Liveness

	// InstanceID names this process in the queue's sweeper role
	// (NewInstanceID if empty).
	InstanceID string

	// Now is the local clock (time.Now if nil). Only the difference to
	// Redis's TIME matters, so a skewed local clock changes nothing; tests
	// skew it to prove that.
	Now func() time.Time
}

// Liveness is what the scanner needs of the instance's liveness.
type Liveness interface {
	// ID is the id claims are recorded under now.
	ID() string
	// Check says whether tasks claimed under id may be published now
	// (ok), or never (fenced: id was declared dead, and its claims are
	// handed out to others); neither: wait.
	Check(id string) (ok, fenced bool)
	// Members are the live instances serving queue (liveness ids, sorted,
	// this one's included); nil if not known.
	Members(queue string) []string
}

// Scanner dispatches one queue. Run it once.
type Scanner struct {
	rdb  redis.UniversalClient
	pub  Publisher
	opt  Options
	keys shard.Keys
	st   *store
	log  *slog.Logger
	lim  *logLimiter
	met  queueMetrics
	// causes: why publishes failed lately, for the log, /readyz and the
	// stall report.
	causes *causes
	hold   *holder
	check  *clockCheck
	work   context.Context // publishes and settling: outlives Run's ctx a little

	// The loop's concerns, each in a file of its own.
	clock *serverClock // the Redis clock of each shard's primary
	role  *sweeperRole // the sweeper role
	pick  *picker      // the shards a busy queue's claims take
	rate  *rateLimit   // the queue's rate limit
	due   *dueTimes    // when each shard next needs a claim; the sweep interval
	prim  *primaries   // the primaries, and the claims on their way to them
	wake  *wakeups     // the queue's wake channel

	// What the queue's watchdog asks (Waiting): read off the loop.
	publishing atomic.Int64 // batches being published
	// quiet: the last job answered was a sweep that found every shard it
	// read empty, and no wake-up came since (canDoze). Owned by Run's
	// goroutine.
	quiet       bool
	dozing      atomic.Bool   // left to the IdleWatch (doze): read off the loop (Dozing)
	wakes       atomic.Uint64 // dozes ended (Dozing)
	lastClaimed atomic.Int64  // unix ns of the last claim that took tasks
	// reservedAhead: room in the holder reserved by claims ahead still out
	// (see reserveAhead).
	reservedAhead atomic.Int64
	lastAcked     atomic.Int64   // unix ns of the last batch that left Redis confirmed
	acking        sync.WaitGroup // early acks under way (ackConfirmed)
	early         earlyAcks      // batches with confirmed tasks to ack early
	layoutM       atomic.Int64   // Options.Layout, changed by Queue
}

// New returns a scanner for one queue.
func New(rdb redis.UniversalClient, pub Publisher, opt Options) *Scanner {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.InstanceID == "" {
		opt.InstanceID = NewInstanceID()
	}
	log := opt.Logger.With("queue", opt.Queue)
	lim := newLogLimiter(log, 10*time.Second)
	met := opt.Metrics.forQueue(opt.Queue)
	keys := shard.Keys{Prefix: opt.KeyPrefix, Queue: opt.Queue}
	ahead := opt.Lookahead
	if opt.MaxRate > 0 {
		ahead = 0 // see MaxRate
	}
	s := &Scanner{rdb: rdb, pub: pub, opt: opt, keys: keys, log: log, lim: lim, met: met,
		causes: newCauses(opt.Exchange, opt.RoutingKey, log, causeWindow(opt.RetryMax)),
		// A task held for up to the look-ahead still has a whole lease to
		// be published in.
		st: &store{rdb: rdb, keys: keys, lease: opt.Lease + ahead + opt.PublishTick, ahead: ahead,
			retryMin: opt.RetryMin, retryMax: opt.RetryMax, maxAttempts: opt.MaxAttempts, instance: opt.InstanceID},
	}
	s.clock = newServerClock(opt.Shards, opt.Now)
	s.prim = newPrimaries(rdb, keys, opt.Shards, s.st.token, met, lim)
	s.due = newDueTimes(opt.Shards, opt.PollInterval, opt.IdlePollInterval, ahead, s.clock)
	s.role = &sweeperRole{rdb: rdb, keys: keys, instance: opt.InstanceID, poll: opt.PollInterval, log: log, lim: lim, met: met,
		send: func(ctx context.Context, node string, fill func(redis.Pipeliner)) error {
			_, _, err := s.roundTrip(ctx, node, true, fill)
			return err
		},
		reload: s.prim.reloadSlots, done: make(chan leadResult, 1)}
	s.pick = &picker{bal: balancer.New(rdb, keys.Counter(), opt.Shards), shards: opt.Shards, key: keys.Counter(),
		met: met, lim: lim, reload: s.prim.reloadSlots}
	s.rate = &rateLimit{rdb: rdb, key: keys.Rate(), rate: opt.MaxRate, batch: opt.BatchSize, poll: opt.PollInterval,
		met: met, lim: lim}
	s.wake = newWakeups(rdb, keys, opt.Shards, opt.PollInterval, s.prim.cluster, log, lim)
	s.wake.onLayout = opt.OnLayout
	s.wake.hub = opt.WakeHub
	s.layoutM.Store(int64(opt.Layout))
	s.hold = newHolder(s.clock.surelyUs, s.clock.localUs, s.fire, opt.PublishTick)
	s.check = newClockCheck(s.clock, s.clockNode, lim, met)
	s.check.gap = opt.ClockReadGap
	s.check.wake, s.hold.confirmed = s.hold.wake, s.check.due
	return s
}

// Wake makes an idle scanner look at every shard now, e.g. when a producer
// says it added a task earlier than any known.
func (s *Scanner) Wake() { s.wake.kick() }

// Run dispatches until ctx ends. Then it claims nothing new, waits up to
// ShutdownTimeout for outstanding confirms, and hands what is still
// unconfirmed back (lease 0) to any instance. It returns nil on a clean stop.
func (s *Scanner) Run(ctx context.Context) error {
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	s.work = work
	var wg sync.WaitGroup
	// The holder stops with ctx and gives back what it still holds at
	// once; the batches of those tasks settle (wg) before Run returns.
	held := make(chan []heldTask, 1)
	go func() { held <- s.hold.run(ctx) }()
	slots := make(chan struct{}, s.opt.Pipeline)
	listenCtx, stopListen := context.WithCancel(ctx)
	var listening sync.WaitGroup
	var unlisten func()
	listening.Add(1)
	go func() { defer listening.Done(); unlisten = s.wake.listen(listenCtx) }()
	s.loop(ctx, work, &wg, slots)
	// Each on its own: a Redis that does not answer holds each batch's
	// settling up to its retries' limit, and the stop's wait (below) is
	// what bounds them all.
	for _, p := range s.handBack(<-held) {
		go s.settleBatch(p)
	}
	s.check.stop()
	stopListen()
	listening.Wait()
	if unlisten != nil {
		unlisten()
	}
	s.role.resign()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(s.opt.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.log.Warn("confirms still outstanding at shutdown timeout; handing those tasks back to the other instances")
		stopWork()
		// A publish stuck writing to a broker that stopped reading ignores
		// its context; do not wait for it forever. Its tasks stay in flight
		// and their lease brings them back.
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			s.log.Warn("abandoning publishes stuck in the broker connection; their leases will return them")
		}
	}
	s.stopEarly()
	s.acking.Wait() // early acks, each bounded by its own deadline
	return nil
}

// Sweeping reports whether this instance holds the queue's sweeper role:
// then it alone keeps the queue's state metrics and watches for stalls.
func (s *Scanner) Sweeping() bool { return s.role.sweeping.Load() }

// Dozing reports whether the queue dozes (it held nothing, and the
// IdleWatch looks at its pending and in-flight sets until one appears, see
// doze.go), and how many times it woke from a doze: a woken queue may doze
// again before a reader looks.
func (s *Scanner) Dozing() (dozing bool, wakes uint64) { return s.dozing.Load(), s.wakes.Load() }

// Waiting says what this instance sees holding up the queue's due tasks:
// Redis refusing its scripts, every publish slot waiting for confirms, or
// no claim taking tasks. The watchdog logs it when the queue stalls.
func (s *Scanner) Waiting() []string {
	var out []string
	for _, c := range s.causes.active(time.Now()) {
		out = append(out, "publishes fail, tasks kept for retry: "+c)
	}
	if why := s.RedisRefusal(); why != "" {
		out = append(out, "redis refuses the dispatcher's scripts: "+why)
	}
	if n := s.publishing.Load(); n >= int64(s.opt.Pipeline) {
		out = append(out, fmt.Sprintf("all %d publish slots wait for the broker's confirms%s", n, since(" (last confirmed batch %s ago)", s.lastAcked.Load())))
	}
	if s.opt.MaxRate > 0 {
		out = append(out, fmt.Sprintf("dispatching is limited to %g tasks/s (DISPATCHER_QUEUE_<NAME>_MAX_RATE); claims take due tasks only, no look-ahead", s.opt.MaxRate))
	}
	if last := s.lastClaimed.Load(); last == 0 {
		out = append(out, "this instance has claimed no task since it started")
	} else {
		out = append(out, since("this instance's last claim that took tasks was %s ago", last))
	}
	return out
}

// Queue is the name of the queue the scanner dispatches.
func (s *Scanner) Queue() string { return s.opt.Queue }

// PublishFailures names why this instance's publishes of the queue failed
// lately and were kept for retry, one line per cause, for /readyz:
// `unroutable: exchange "tasks" has no queue bound for routing key "orders"
// (312 NO_ROUTE) (40 failed publishes over 1m2s, the latest 1s ago)`.
// A cause is over once a publish is confirmed after it (unless it is a
// refusal of one message), or when it was not seen for twice RETRY_MAX.
func (s *Scanner) PublishFailures() []string {
	return s.causes.active(time.Now())
}

// causeWindow is how long a cause lasts unseen: every retried task is
// tried again within RETRY_MAX of its last failure, so a cause still there
// shows up within that; twice it leaves room for the publish itself.
func causeWindow(retryMax time.Duration) time.Duration {
	return max(2*retryMax, 10*time.Second)
}

// since formats how long ago unix ns at was, into format; "" if never.
func since(format string, at int64) string {
	if at == 0 {
		return ""
	}
	return fmt.Sprintf(format, time.Since(time.Unix(0, at)).Round(time.Millisecond))
}

// RedisRefusal says why Redis refuses this scanner's scripts (READONLY on
// a replica, LOADING, OOM, NOPERM, ...), or "" while they run: a PING
// answers even where every script is refused.
func (s *Scanner) RedisRefusal() string {
	return s.prim.refused()
}
