// Package balancer spreads dispatcher instances over the shards of a queue
// without them talking to each other: each takes its next shard from a
// shared Redis INCR counter, modulo the shard count.
package balancer

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Balancer picks shards of one queue.
type Balancer struct {
	rdb    redis.UniversalClient
	key    string
	shards int
}

// New returns a balancer over m shards using the counter at key.
func New(rdb redis.UniversalClient, key string, m int) *Balancer {
	return &Balancer{rdb: rdb, key: key, shards: m}
}

// Next returns the shard to scan next. Consecutive calls from all
// instances together walk the shards in turn, so N instances busy on the
// same queue each take about 1/N of the shards at any time.
func (b *Balancer) Next(ctx context.Context) (int, error) {
	if b.shards == 1 {
		return 0, nil // nothing to balance; save the round trip
	}
	n, err := b.rdb.Incr(ctx, b.key).Result()
	if err != nil {
		return 0, fmt.Errorf("balancer incr %s: %w", b.key, err)
	}
	return Index(n, b.shards), nil
}

// Index maps a counter value to a shard; counter values start at 1, so
// the first instance begins at shard 0. Negative values (a counter reset
// by hand to something odd) still map into range.
func Index(n int64, m int) int {
	i := (n - 1) % int64(m)
	if i < 0 {
		i += int64(m)
	}
	return int(i)
}

// NextN returns the next n shards to scan with one INCRBY.
func (b *Balancer) NextN(ctx context.Context, n int) ([]int, error) {
	if n <= 0 {
		return nil, nil
	}
	out := make([]int, 0, n)
	if b.shards == 1 {
		return append(out, 0), nil
	}
	last, err := b.rdb.IncrBy(ctx, b.key, int64(n)).Result()
	if err != nil {
		return nil, fmt.Errorf("balancer incrby %s: %w", b.key, err)
	}
	seen := map[int]bool{}
	for v := last - int64(n) + 1; v <= last; v++ {
		if i := Index(v, b.shards); !seen[i] {
			seen[i] = true
			out = append(out, i)
		}
	}
	return out, nil
}
