// Package scanner moves due tasks of one queue from its Redis shards to the
// broker: it claims them atomically into a leased in-flight set, publishes
// them with confirms, and forgets them only once confirmed. Claims also
// reap expired leases, so tasks of an instance that died go out again.
package scanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/balancer"
	"github.com/dispatcher/dispatcher/internal/wait"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// Publisher is what the scanner needs of the broker side.
type Publisher interface {
	Publish(ctx context.Context, msgs []publisher.Message) []error
	PublishAlone(ctx context.Context, msg publisher.Message) error
	WaitReady(ctx context.Context) error
}

// Options configure the scanner of one queue.
type Options struct {
	Queue      string
	Shards     int
	Exchange   string
	RoutingKey string
	KeyPrefix  string

	BatchSize       int           // most tasks per claim
	Pipeline        int           // claimed batches being published at once
	PollInterval    time.Duration // how often idle shards are looked at
	Lease           time.Duration
	ShutdownTimeout time.Duration // wait for outstanding confirms on stop
	MaxMessageBytes int
	MaxAttempts     int
	RetryMin        time.Duration
	RetryMax        time.Duration

	Logger  *slog.Logger
	Metrics *Metrics

	// InstanceID names this process in the queue's sweeper role
	// (NewInstanceID if empty).
	InstanceID string

	// Now is the local clock (time.Now if nil). Only the difference to
	// Redis's TIME matters, so a skewed local clock changes nothing; tests
	// skew it to prove that.
	Now func() time.Time
}

// Scanner dispatches one queue. Run it once.
type Scanner struct {
	rdb   redis.UniversalClient
	pub   Publisher
	opt   Options
	keys  shard.Keys
	st    *store
	bal   *balancer.Balancer
	log   *slog.Logger
	lim   *logLimiter
	met   queueMetrics
	wake  chan struct{}
	notes notes

	offset  atomic.Int64 // Redis server clock minus local clock, ms
	refusal atomic.Value // string: why Redis refuses the scripts now, "" if it does not

	// Owned by Run's goroutine.
	known    map[int]int64 // shard -> server ms at which it next needs a claim
	badUntil map[int]time.Time
	leader   bool      // this instance holds the sweeper role
	lastLead time.Time // last renewal of or bid for the role
	lastBusy time.Time // last time this instance told the others of a backlog
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
	keys := shard.Keys{Prefix: opt.KeyPrefix, Queue: opt.Queue}
	return &Scanner{
		rdb: rdb, pub: pub, opt: opt, keys: keys,
		st: &store{rdb: rdb, keys: keys, lease: opt.Lease, retryMin: opt.RetryMin, retryMax: opt.RetryMax,
			maxAttempts: opt.MaxAttempts, instance: opt.InstanceID},
		bal:      balancer.New(rdb, keys.Counter(), opt.Shards),
		log:      log,
		lim:      newLogLimiter(log, 10*time.Second),
		met:      opt.Metrics.forQueue(opt.Queue),
		wake:     make(chan struct{}, 1),
		known:    map[int]int64{},
		badUntil: map[int]time.Time{},
	}
}

// Wake makes an idle scanner look at every shard now, e.g. when a producer
// says it added a task earlier than any known.
func (s *Scanner) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run dispatches until ctx ends. Then it claims nothing new, waits up to
// ShutdownTimeout for outstanding confirms, and hands what is still
// unconfirmed back (lease 0) to any instance. It returns nil on a clean stop.
func (s *Scanner) Run(ctx context.Context) error {
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	var wg sync.WaitGroup
	slots := make(chan struct{}, s.opt.Pipeline)
	listenCtx, stopListen := context.WithCancel(ctx)
	var listening sync.WaitGroup
	listening.Add(1)
	go func() { defer listening.Done(); s.listen(listenCtx) }()
	s.loop(ctx, work, &wg, slots)
	stopListen()
	listening.Wait()
	if s.leader {
		s.stepDown()
		s.met.sweeper(false)
	}

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
	return nil
}

func (s *Scanner) loop(ctx, work context.Context, wg *sync.WaitGroup, slots chan struct{}) {
	var lastSweep time.Time
	busy := false
	errDelay := time.Duration(0)
	for ctx.Err() == nil {
		if err := s.pub.WaitReady(ctx); err != nil {
			return
		}
		if errDelay > 0 && !s.pause(ctx, errDelay) {
			return
		}
		if err := s.takeNotes(ctx, &busy); err != nil {
			errDelay = s.redisTrouble(ctx, err, errDelay)
			continue
		}
		if s.leader && !busy && time.Since(lastSweep) >= s.opt.PollInterval {
			lastSweep = time.Now()
			if err := s.sweep(ctx); err != nil {
				errDelay = s.redisTrouble(ctx, err, errDelay)
				continue
			}
			errDelay = 0
			s.refusal.Store("")
		}

		// Hold as many publish slots as are free (at least one).
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		held := 1
	fill:
		for held < cap(slots) {
			select {
			case slots <- struct{}{}:
				held++
			default:
				break fill
			}
		}
		// The broker may have blocked the connection (connection.blocked)
		// while this loop waited for a slot: claiming now would only take
		// more tasks into flight that cannot be confirmed until it unblocks.
		if err := s.pub.WaitReady(ctx); err != nil {
			for ; held > 0; held-- {
				<-slots
			}
			return
		}

		var targets []int
		var err error
		if busy {
			targets, err = s.bal.NextN(ctx, held)
		} else {
			targets = s.dueShards(held)
		}
		if err != nil || len(targets) == 0 {
			for ; held > 0; held-- {
				<-slots
			}
			if err != nil {
				// Back to sweeping: a Redis at maxmemory refuses the
				// balancer's INCRBY for as long as it stays full, while
				// claims (allow-oom) still drain it.
				busy = false
				errDelay = s.redisTrouble(ctx, err, errDelay)
				continue
			}
			if !s.sleep(ctx, s.idleDelay(lastSweep)) {
				return
			}
			continue
		}

		// Batches claimed before a failure (a shard on a Redis that went
		// away, a refusal of one command) are in flight under a lease:
		// publish them now rather than after the lease runs out.
		batches, full, err := s.claim(ctx, targets)
		for _, b := range batches {
			held--
			wg.Add(1)
			go func(b batch) {
				defer func() { <-slots; wg.Done() }()
				s.dispatch(work, b)
			}(b)
		}
		for ; held > 0; held-- {
			<-slots
		}
		if err != nil {
			errDelay = s.redisTrouble(ctx, err, errDelay)
			continue
		}
		errDelay = 0
		s.refusal.Store("")
		busy = full
		if full {
			s.announceBusy(ctx)
		} else if !s.leader {
			// What a helper learnt while busy is the sweeper's business.
			clear(s.known)
		}
	}
}

// takeNotes applies the wake-ups received since the last turn and renews
// or bids for the sweeper role when that is due.
func (s *Scanner) takeNotes(ctx context.Context, busy *bool) error {
	wasBusy, free, soon := s.notes.take()
	if wasBusy {
		*busy = true
	}
	if free {
		s.lastLead = time.Time{}
	}
	if time.Since(s.lastLead) >= s.leadEvery(s.leader) {
		leader, err := s.lead(ctx)
		if err != nil {
			return err
		}
		s.lastLead = time.Now()
		if leader != s.leader {
			s.log.Debug("sweeper role", "held", leader)
			s.met.sweeper(leader)
			if !leader {
				clear(s.known)
			}
		}
		s.leader = leader
	}
	if !s.leader {
		return nil
	}
	for i, at := range soon {
		if cur, ok := s.known[i]; !ok || at < cur {
			s.known[i] = at
		}
	}
	return nil
}

// announceBusy tells every instance that this one found a backlog, so they
// all claim (spread by the balancer) until it is gone. At most once per
// poll interval: helpers that ran dry go back to idle in between.
func (s *Scanner) announceBusy(ctx context.Context) {
	if time.Since(s.lastBusy) < s.opt.PollInterval {
		return
	}
	s.lastBusy = time.Now()
	if err := s.rdb.Publish(ctx, s.keys.Wake(), shard.WakeBusy).Err(); err != nil {
		s.lim.Warn("announce", "cannot tell other instances of the backlog", "err", err)
	}
}

// redisTrouble logs a Redis failure (rate-limited) and returns how long to
// wait before the next try.
func (s *Scanner) redisTrouble(ctx context.Context, err error, prev time.Duration) time.Duration {
	if ctx.Err() != nil {
		return prev
	}
	s.met.error("redis", 1)
	// One log key per kind of trouble, so that a LOADING after a lost
	// connection is not held back as a repeat of it.
	class := redisErrorClass(err)
	args := []any{"err", err}
	if hint, ok := redisHints[class]; ok {
		args = append(args, "hint", hint)
	}
	s.lim.Warn("redis:"+class, "redis unavailable; retrying", args...)
	if class != "conn" {
		why := class
		if hint, ok := redisHints[class]; ok {
			why += ": " + hint
		}
		s.refusal.Store(why)
	}
	return min(max(2*prev, 50*time.Millisecond), 2*time.Second)
}

// RedisRefusal says why Redis refuses this scanner's scripts (READONLY on
// a replica, LOADING, OOM, NOPERM, ...), or "" while they run: a PING
// answers even where every script is refused.
func (s *Scanner) RedisRefusal() string {
	why, _ := s.refusal.Load().(string)
	return why
}

// serverNow estimates the Redis server's clock in ms.
func (s *Scanner) serverNow() int64 { return s.opt.Now().UnixMilli() + s.offset.Load() }

// observeClock updates the clock offset from a server time read between
// before and after.
func (s *Scanner) observeClock(serverMs int64, before, after time.Time) {
	mid := before.UnixMilli() + after.Sub(before).Milliseconds()/2
	s.offset.Store(serverMs - mid)
}

// idleDelay is how long to sleep when no shard needs a claim: until the
// earliest known due time, the next sweep or the next turn at the sweeper
// role, whichever is first.
func (s *Scanner) idleDelay(lastSweep time.Time) time.Duration {
	d := time.Until(s.lastLead.Add(s.leadEvery(s.leader)))
	if s.leader {
		d = min(d, time.Until(lastSweep.Add(s.opt.PollInterval)))
	}
	now := s.serverNow()
	for _, at := range s.known {
		if w := time.Duration(at-now) * time.Millisecond; w < d {
			d = w
		}
	}
	return max(d, time.Millisecond)
}

// pause waits d unless ctx ends. Unlike sleep, wake-ups do not cut it
// short: it is the backoff after a Redis error, which must hold however
// many producers announce tasks meanwhile.
func (s *Scanner) pause(ctx context.Context, d time.Duration) bool { return wait.For(ctx, d) }

func (s *Scanner) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.wake:
	case <-ctx.Done():
		return false
	}
	return true
}

// dueShards returns up to n shards known to need a claim now, the longest
// waiting first.
func (s *Scanner) dueShards(n int) []int {
	now := s.serverNow()
	var due []int
	for i, at := range s.known {
		if at <= now {
			due = append(due, i)
		}
	}
	sort.Slice(due, func(a, b int) bool { return s.known[due[a]] < s.known[due[b]] })
	if len(due) > n {
		due = due[:n]
	}
	return due
}

// sweep reads every shard's next due time and lease deadline in one
// pipelined round trip: the claim script with a batch of 0 claims and
// reaps nothing.
func (s *Scanner) sweep(ctx context.Context) error {
	now := time.Now()
	var shards []int
	for i := 0; i < s.opt.Shards; i++ {
		if !now.Before(s.badUntil[i]) {
			shards = append(shards, i)
		}
	}
	if len(shards) == 0 {
		return nil
	}
	_, err := s.claimShards(ctx, shards, 0)
	return err
}

// noteNext records when shard i next needs a claim.
func (s *Scanner) noteNext(i int, pending, lease any) {
	p, okP := parseScore(pending)
	l, okL := parseScore(lease)
	switch {
	case okP && okL:
		s.known[i] = min(p, l)
	case okP:
		s.known[i] = p
	case okL:
		s.known[i] = l
	default:
		delete(s.known, i)
	}
}

// shardTrouble handles an error of one shard's script: the shard is left
// alone for a while and the error is counted and logged (rate-limited);
// the other shards carry on.
func (s *Scanner) shardTrouble(i int, err error) {
	kind := "redis"
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		kind = "wrongtype"
	}
	s.met.error(kind, 1)
	s.badUntil[i] = time.Now().Add(5 * time.Second)
	delete(s.known, i)
	s.lim.Error("shard:"+strconv.Itoa(i)+":"+kind, "shard unusable; skipping it for 5s",
		"shard", i, "key", s.keys.Pending(i), "err", err)
}

type batch struct {
	shard    int
	deadline int64 // the lease all its tasks are claimed under (server ms)
	tasks    []Task
}

// claim runs the claim script on each target shard in one pipelined round
// trip. full reports whether any shard gave a whole batch (more is due).
// The batches of shards that were claimed come back even when err says
// that others failed.
func (s *Scanner) claim(ctx context.Context, targets []int) ([]batch, bool, error) {
	results, err := s.claimShards(ctx, targets, s.opt.BatchSize)
	var out []batch
	full := false
	for n, c := range results {
		if c == nil {
			continue
		}
		i := targets[n]
		if c.reaped > 0 {
			s.met.reaped(c.reaped)
			s.lim.Warn("reaped", "took over tasks whose lease ran out", "shard", i, "tasks", c.reaped)
		}
		b := batch{shard: i, deadline: c.deadline}
		for _, e := range c.entries {
			t, err := ParseEntry(e)
			if err != nil {
				s.lim.Error("entry", "skipping malformed in-flight entry", "shard", i, "err", err)
				continue
			}
			b.tasks = append(b.tasks, t)
		}
		if len(b.tasks) > 0 {
			s.met.batchSize(len(b.tasks))
			out = append(out, b)
		}
		if len(c.entries) >= s.opt.BatchSize {
			full = true
		}
	}
	return out, full, err
}

// claimShards runs the claim script with batch limit on each shard in one
// pipeline, loading the script first where the server does not know it
// (new or restarted Redis). Each shard's answer is handled on its own: it
// notes the shard's next due time and the server clock, and results[n] is
// nil where shards[n] failed. A shard whose keys are unusable is left
// alone for a while (shardTrouble); a failure that is not the shard's own
// (connection lost, a server-wide refusal) is returned as err, alongside
// the results of the shards that were claimed.
func (s *Scanner) claimShards(ctx context.Context, shards []int, limit int) ([]*claimed, error) {
	results := make([]*claimed, len(shards))
	todo := make([]int, len(shards)) // indexes into shards
	for n := range todo {
		todo[n] = n
	}
	var trouble error
	clocked := false
	for attempt := 0; len(todo) > 0; attempt++ {
		before := s.opt.Now()
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(todo))
		for n, at := range todo {
			cmds[n] = s.st.claimCmd(ctx, pipe, shards[at], limit)
		}
		_, _ = pipe.Exec(ctx) // each command's own error is read below
		after := s.opt.Now()
		var again []int
		for n, cmd := range cmds {
			at, i := todo[n], shards[todo[n]]
			vals, err := cmd.Slice()
			switch {
			case err == nil:
				c, err := parseClaimed(vals)
				if err != nil {
					s.shardTrouble(i, err)
					continue
				}
				if !clocked {
					s.observeClock(c.now, before, after)
					clocked = true
				}
				s.noteNext(i, c.nextPending, c.nextLease)
				results[at] = &c
			case attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT"):
				again = append(again, at)
			case !isReply(err) || serverRefuses(err):
				if trouble == nil {
					trouble = err
				}
			default:
				s.shardTrouble(i, err)
			}
		}
		if len(again) > 0 {
			if err := claimScript.Load(ctx, s.rdb).Err(); err != nil {
				return results, fmt.Errorf("load claim script: %w", err)
			}
		}
		todo = again
	}
	return results, trouble
}

// serverRefuses reports whether err is Redis refusing every command for
// now (loading its data, a read-only replica, a busy script, an ACL or
// authentication problem) rather than trouble with one shard's keys: the
// loop backs off and logs it once, instead of blaming every shard.
func serverRefuses(err error) bool {
	for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "BUSY ", "NOPERM", "NOAUTH", "WRONGPASS", "OOM"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// redisHints explain the Redis refusals an operator can act on.
var redisHints = map[string]string{
	"LOADING":  "Redis is loading its data set after a restart; dispatching resumes when it is done",
	"READONLY": "DISPATCHER_REDIS_URL reaches a read-only replica; the dispatcher needs the primary",
	"OOM":      "Redis is at maxmemory: producers cannot schedule; the dispatcher keeps draining, which frees memory",
	"NOPERM":   "the Redis ACL user lacks a key, channel or command the dispatcher needs",
}

// redisErrorClass is the error code of a Redis reply error (LOADING,
// READONLY, OOM, ...) or "conn" for anything else (network, timeout).
func redisErrorClass(err error) string {
	var re redis.Error
	if !errors.As(err, &re) {
		return "conn"
	}
	code, _, _ := strings.Cut(re.Error(), " ")
	return code
}

// isReply reports whether err is an error reply of the server (as opposed
// to a connection or timeout error).
func isReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}
