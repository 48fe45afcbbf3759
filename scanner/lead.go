package scanner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
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

// roleTTL is how long the sweeper role outlives its holder's last renewal.
func (s *Scanner) roleTTL() time.Duration { return max(10*s.opt.PollInterval, 1500*time.Millisecond) }

// leadEvery is how often an instance renews (sweeper) or bids for (other
// instances) the sweeper role. Three renewals per TTL, not one per sweep:
// with many queues the renewals were a third of an idle instance's Redis
// calls. At the default settings that is every 500 ms, on the grid of a
// quiet queue's sweeps, so both take one wake-up and one round trip.
func (s *Scanner) leadEvery(leader bool) time.Duration {
	if leader {
		return max(s.opt.PollInterval, s.roleTTL()/3)
	}
	return s.roleTTL() / 2
}

// lead renews or bids for the sweeper role. An error from the script
// itself (say an OOM refusal of its write) makes the instance sweep
// anyway: two sweepers cost Redis calls, none would cost tasks.
func (s *Scanner) lead(ctx context.Context) (bool, error) {
	keys, args := []string{s.keys.Sweeper()}, []any{s.opt.InstanceID, s.roleTTL().Milliseconds()}
	// Shared: with the other queues' renewals of the moment, in one round trip.
	var cmd *redis.Cmd
	if _, _, err := s.roundTrip(ctx, redisconn.NodeOf(ctx, s.rdb, s.keys.Sweeper()), true, func(pipe redis.Pipeliner) {
		cmd = leadScript.EvalSha(ctx, pipe, keys, args...)
	}); err != nil {
		return false, err // past the role's TTL: the answer is moot
	}
	n, err := cmd.Int()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		n, err = leadScript.Run(ctx, s.rdb, keys, args...).Int()
	}
	switch {
	case err == nil:
		return n == 1, nil
	case !isReply(err):
		return false, err
	default:
		s.lim.Warn("lead", "cannot take the sweeper role; sweeping anyway", "key", s.keys.Sweeper(), "err", err)
		return true, nil
	}
}

// stepDown gives up the sweeper role at shutdown.
func (s *Scanner) stepDown() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := stepDownScript.Run(ctx, s.rdb, []string{s.keys.Sweeper()},
		s.opt.InstanceID, s.keys.Wake(), shard.WakeLead).Err()
	if err != nil {
		s.log.Debug("could not give up the sweeper role; it expires by itself", "err", err)
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
