package scanner

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/redis/go-redis/v9"
)

// rateScript is the queue's dispatch rate limit, a token bucket shared by
// every instance: each claim first takes as many tokens as tasks it may
// claim. Times are the Redis server's, so instances' clocks do not matter.
// Its key holds the queue's hash tag, so on Redis Cluster it lives on one
// primary, like the balancer counter. allow-oom: a Redis at maxmemory must
// still let the queue drain.
//
// KEYS[1] the bucket P:{Q}:rate (hash: tokens, t = ms of the last refill)
// ARGV[1] rate, tasks per second
// ARGV[2] burst: most tokens the bucket holds
// ARGV[3] tokens wanted
// Returns {granted, wait_ms}: wait_ms is how long until the next token
// when none was granted, 0 otherwise.
var rateScript = redis.NewScript(`#!lua flags=allow-oom
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[1], 'tokens', 't')
local tokens, last = tonumber(b[1]), tonumber(b[2])
if not tokens or not last then
  tokens, last = burst, now
end
tokens = math.min(burst, tokens + math.max(0, now - last) * rate / 1000)
local granted = math.min(want, math.floor(tokens))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 't', string.format('%.3f', now))
redis.call('PEXPIRE', KEYS[1], string.format('%d', math.ceil(burst / rate * 1000) + 1000))
local wait = 0
if granted == 0 then
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
return {granted, wait}
`)

// rateBurst is how many tokens the bucket holds: a tenth of a second's
// worth, so that a claim takes a useful batch and the rate over a second
// stays within a tenth of the limit.
func rateBurst(rate float64) int64 { return max(1, int64(math.Ceil(rate/10))) }

// rateLimit is this instance's side of the queue's rate limit: it takes
// tokens before each claim and knows when the next comes. Its own type, as
// the bucket is one key on one primary with failures of its own, and the
// loop only needs to know whether to wait.
type rateLimit struct {
	rdb   redis.UniversalClient
	key   string        // the bucket's key
	rate  float64       // Options.MaxRate: tasks a second, 0 for no limit
	batch int           // Options.BatchSize
	poll  time.Duration // Options.PollInterval
	met   queueMetrics
	lim   *logLimiter

	until time.Time // no claim before: the rate limit's next token
}

// limited reports whether the queue waits for its rate limit's next
// token now.
func (r *rateLimit) limited(now time.Time) bool {
	return r.rate > 0 && now.Before(r.until)
}

// wait is how long from now until the rate limit's next token.
func (r *rateLimit) wait(now time.Time) time.Duration { return r.until.Sub(now) }

// allow takes tokens for up to BatchSize tasks of each target shard
// and returns the shards to claim from and how many tasks each may take,
// never more in all than the tokens granted. With no token it returns no
// shard and notes when the next comes (until). The bucket cannot be
// reached: nothing is claimed for a moment (fail closed: the limit exists
// to spare the consumers). claimable says whether a job would claim shard
// i now.
func (r *rateLimit) allow(ctx context.Context, targets []int, claimable func(i int, now time.Time) bool) ([]int, int) {
	if r.rate <= 0 || len(targets) == 0 {
		return targets, r.batch
	}
	// Tokens for a shard no job will claim now (its primary busy or backed
	// off, the shard set aside, e.g. paused) would be lost.
	now := time.Now()
	var ok []int
	for _, i := range targets {
		if claimable(i, now) {
			ok = append(ok, i)
		}
	}
	if targets = ok; len(targets) == 0 {
		// Look again shortly rather than at once: the loop would spin.
		r.until = now.Add(min(r.poll, 100*time.Millisecond))
		return nil, 0
	}
	rctx, cancel := context.WithTimeout(ctx, counterTimeout)
	defer cancel()
	want := int64(len(targets) * r.batch)
	res, err := rateScript.Run(rctx, r.rdb, []string{r.key}, r.rate, rateBurst(r.rate), want).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("rate script returned %d values, want 2", len(res))
	}
	if err != nil {
		if ctx.Err() == nil {
			r.met.error("redis", 1)
			r.lim.Warn("rate", "cannot reach the rate limit's bucket; claiming nothing meanwhile", "key", r.key, "err", err)
			r.until = time.Now().Add(100 * time.Millisecond)
		}
		return nil, 0
	}
	granted, wait := res[0], res[1]
	if granted <= 0 {
		r.until = time.Now().Add(time.Duration(max(wait, 1)) * time.Millisecond)
		return nil, 0
	}
	n := min(int((granted+int64(r.batch)-1)/int64(r.batch)), len(targets))
	return targets[:n], int(granted) / n
}
