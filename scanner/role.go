package scanner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// Only one instance per queue sweeps (polls every shard for newly
// scheduled tasks); the others only claim when told the queue is busy.
// So the idle cost of a queue does not grow with the number of instances.
// The role is a Redis key with a TTL that its holder renews on every
// sweep; if the holder dies, another instance takes it when it expires.
// The loop asks the role only when to bid, how long it may sleep for it,
// and takes its answers in: the renewals, their backoff and the scripts
// stay here.

// leadScript takes or keeps the sweeper role.
//
// KEYS[1] the queue's sweeper key
// ARGV[1] this instance's id
// ARGV[2] role TTL, ms
// Returns 1 if this instance sweeps (it held the role, or the role was
// free and it took it), 0 if another instance holds it.
var leadScript = redis.NewScript(`
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// stepDownScript gives the role up if this instance holds it and tells the
// other instances, so one takes over at once rather than at expiry.
//
// KEYS[1] the queue's sweeper key
// ARGV[1] this instance's id
// ARGV[2] the queue's wake channel
// ARGV[3] the message saying the role is free
// Returns 1 if the role was given up, 0 if this instance did not hold it.
var stepDownScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
`)

// sweeperRole is this instance's part in the sweeper role. Its state is
// owned by Run's goroutine but for sweeping.
type sweeperRole struct {
	rdb      redis.UniversalClient
	keys     shard.Keys
	instance string        // Options.InstanceID
	poll     time.Duration // Options.PollInterval
	log      *slog.Logger
	lim      *logLimiter
	met      queueMetrics
	// send runs fill in a round trip to node shared with the other
	// queues' (Options.Coalescer); an error means ctx ended first.
	send func(ctx context.Context, node string, fill func(redis.Pipeliner)) error
	// reload has a cluster client read the slot map again.
	reload func()

	done     chan leadResult
	sweeping atomic.Bool // holds the sweeper role: read off the loop (Sweeping)

	leader     bool      // this instance holds the sweeper role
	leading    bool      // a renewal of or bid for the role is on its way
	lastLead   time.Time // last renewal of or bid for the role
	lastLeadOK time.Time // last answer to one
	until      time.Time // no renewal or bid before (backoff after a failure)
	delay      time.Duration
}

// leadResult is the answer to a renewal of or bid for the sweeper role.
type leadResult struct {
	leader bool
	err    error
}

// ttl is how long the sweeper role outlives its holder's last renewal.
func (r *sweeperRole) ttl() time.Duration { return max(10*r.poll, 1500*time.Millisecond) }

// every is how often an instance renews (sweeper) or bids for (other
// instances) the sweeper role. Three renewals per TTL, not one per sweep:
// with many queues the renewals were a third of an idle instance's Redis
// calls. At the default settings that is every 500 ms, on the grid of a
// quiet queue's sweeps, so both take one wake-up and one round trip.
func (r *sweeperRole) every() time.Duration {
	if r.leader {
		return max(r.poll, r.ttl()/3)
	}
	return r.ttl() / 2
}

// free notes that the role was given up: a bid is due at once.
func (r *sweeperRole) free() { r.lastLead = time.Time{} }

// bid sends a renewal of or bid for the role when one is due. The role's
// key lives on one primary: its answer comes back on done, so a primary
// that is slow to answer holds up no other.
func (r *sweeperRole) bid(ctx context.Context) {
	if !r.leading && !time.Now().Before(gridNext(r.lastLead, r.every())) && time.Now().After(r.until) {
		r.leading = true
		r.lastLead = time.Now()
		go func() {
			// Past the role's TTL an answer is moot: the role expired.
			lctx, cancel := context.WithTimeout(ctx, r.ttl())
			defer cancel()
			leader, err := r.lead(lctx)
			r.done <- leadResult{leader, err}
		}()
	}
}

// wait is how long until the next renewal or bid is due (or its backoff
// ends).
func (r *sweeperRole) wait() time.Duration {
	next := gridNext(r.lastLead, r.every())
	if r.until.After(next) {
		next = r.until
	}
	d := time.Until(next)
	if r.leading {
		d = time.Hour // its answer wakes the loop
	}
	return d
}

// apply takes the answer about the sweeper role in, and reports whether
// the instance took or lost the role by it. When the role's primary cannot
// be reached for longer than the role lives, nobody can hold it: the
// instance sweeps anyway (two sweepers cost Redis calls, none would cost
// tasks).
func (r *sweeperRole) apply(ctx context.Context, res leadResult) (changed bool) {
	r.leading = false
	leader := res.leader
	if res.err != nil {
		if ctx.Err() != nil {
			return false
		}
		r.met.error("redis", 1)
		r.lim.Warn("lead", "cannot reach the sweeper role's key", "key", r.keys.Sweeper(), "err", res.err)
		leader = r.leader || time.Since(r.lastLeadOK) > r.ttl()
		r.delay = min(max(2*r.delay, 100*time.Millisecond), 2*time.Second)
		r.until = time.Now().Add(r.delay)
		r.reload()
	} else {
		r.lastLeadOK = time.Now()
		r.delay = 0
	}
	changed = leader != r.leader
	if changed {
		r.log.Debug("sweeper role", "held", leader)
		r.met.sweeper(leader)
		r.sweeping.Store(leader)
	}
	r.leader = leader
	return changed
}

// lead renews or bids for the sweeper role. An error from the script
// itself (say an OOM refusal of its write) makes the instance sweep
// anyway: two sweepers cost Redis calls, none would cost tasks.
func (r *sweeperRole) lead(ctx context.Context) (bool, error) {
	keys, args := []string{r.keys.Sweeper()}, []any{r.instance, r.ttl().Milliseconds()}
	// Shared: with the other queues' renewals of the moment, in one round trip.
	var cmd *redis.Cmd
	if err := r.send(ctx, redisconn.NodeOf(ctx, r.rdb, r.keys.Sweeper()), func(pipe redis.Pipeliner) {
		cmd = leadScript.EvalSha(ctx, pipe, keys, args...)
	}); err != nil {
		return false, err // past the role's TTL: the answer is moot
	}
	n, err := cmd.Int()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		n, err = leadScript.Run(ctx, r.rdb, keys, args...).Int()
	}
	switch {
	case err == nil:
		return n == 1, nil
	case !isReply(err):
		return false, err
	default:
		r.lim.Warn("lead", "cannot take the sweeper role; sweeping anyway", "key", r.keys.Sweeper(), "err", err)
		return true, nil
	}
}

// resign gives up the sweeper role at shutdown, if this instance holds it.
func (r *sweeperRole) resign() {
	if r.leader {
		r.stepDown()
		r.met.sweeper(false)
		r.sweeping.Store(false)
	}
}

// stepDown gives up the sweeper role at shutdown.
func (r *sweeperRole) stepDown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := stepDownScript.Run(ctx, r.rdb, []string{r.keys.Sweeper()},
		r.instance, r.keys.Wake(), shard.WakeLead).Err()
	if err != nil {
		r.log.Debug("could not give up the sweeper role; it expires by itself", "err", err)
	}
}

// NewInstanceID names this process in the sweeper role: host, pid and a
// random part, so that a restarted process is a new instance.
func NewInstanceID() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b))
}
