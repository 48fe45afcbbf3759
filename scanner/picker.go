package scanner

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/dispatcher/dispatcher/balancer"
)

// While the queue is busy every instance claims, and the shards are spread
// among them by a counter in Redis. That counter is one key on one
// primary, which can fail on its own: its backoff and the local walk that
// stands in for it meanwhile are kept here, apart from the loop.

// picker picks the shards a busy queue's claims take.
type picker struct {
	bal    *balancer.Balancer
	shards int
	key    string // the counter's key, for the log
	met    queueMetrics
	lim    *logLimiter
	// reload has a cluster client read the slot map again.
	reload func()

	until     time.Time // the balancer counter is not asked before (backoff)
	delay     time.Duration
	localNext int // next shard of the local walk when the balancer is unreachable
}

// next returns the next n shards from the queue's balancer counter.
// The counter is one key on one primary: while it cannot be reached, the
// instance walks the shards on its own from a random start, so that the
// other primaries' shards still drain.
func (p *picker) next(ctx context.Context, n int) []int {
	now := time.Now()
	if now.After(p.until) {
		bctx, cancel := context.WithTimeout(ctx, counterTimeout)
		out, err := p.bal.NextN(bctx, n)
		cancel()
		if err == nil {
			p.delay = 0
			return out
		}
		if ctx.Err() != nil {
			return nil
		}
		p.delay = min(max(2*p.delay, 100*time.Millisecond), 5*time.Second)
		p.until = now.Add(p.delay)
		p.met.error("redis", 1)
		p.reload()
		p.lim.Warn("balancer", "cannot reach the balancer counter; picking shards locally", "key", p.key, "err", err)
	}
	if p.localNext == 0 {
		p.localNext = 1 + rand.IntN(p.shards)
	}
	var out []int
	for k := 0; k < n && k < p.shards; k++ {
		out = append(out, (p.localNext-1)%p.shards)
		p.localNext++
	}
	return out
}
