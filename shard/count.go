package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// ShardCountError says that the shard count recorded for a queue in Redis
// differs from the one an instance or producer was configured with.
type ShardCountError struct {
	Queue      string
	Recorded   int
	Configured int
}

func (e *ShardCountError) Error() string {
	return fmt.Sprintf("queue %s: shard count %d configured, but %d is recorded in Redis; "+
		"producers and dispatchers must agree on it", e.Queue, e.Configured, e.Recorded)
}

// EnsureShardCount records m as the queue's shard count if none is recorded
// yet, and returns a *ShardCountError if a different one is. It reads
// before it writes, so that a Redis refusing writes (out of memory, a
// read-only replica) does not stop a queue whose count is recorded.
func EnsureShardCount(ctx context.Context, rdb redis.UniversalClient, keys Keys, m int) error {
	key := keys.ShardCount()
	got, err := rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		if err := rdb.SetNX(ctx, key, m, 0).Err(); err != nil {
			return fmt.Errorf("record shard count at %s: %w", key, err)
		}
		got, err = rdb.Get(ctx, key).Result()
	}
	if err != nil {
		return fmt.Errorf("read shard count at %s: %w", key, err)
	}
	recorded, err := strconv.Atoi(got)
	if err != nil {
		return fmt.Errorf("shard count at %s is %q, not a number", key, got)
	}
	if recorded != m {
		return &ShardCountError{Queue: keys.Queue, Recorded: recorded, Configured: m}
	}
	return nil
}
