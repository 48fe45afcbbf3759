package shard

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Occupied returns the positions in keys of those that exist. On one
// server (or Sentinel) it costs one EXISTS of all of them, and only if
// that finds any, one pipelined EXISTS per key to tell which; on Redis
// Cluster, where one EXISTS may not span slots, one pipelined EXISTS per
// key, which go-redis sends to each node in one round trip.
func Occupied(ctx context.Context, rdb redis.UniversalClient, keys []string) ([]int, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if _, cluster := rdb.(*redis.ClusterClient); !cluster {
		n, err := rdb.Exists(ctx, keys...).Result()
		if err != nil {
			return nil, fmt.Errorf("exists %s..%s: %w", keys[0], keys[len(keys)-1], err)
		}
		if n == 0 {
			return nil, nil
		}
	}
	pipe := rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(keys))
	for n, k := range keys {
		cmds[n] = pipe.Exists(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("exists %s..%s: %w", keys[0], keys[len(keys)-1], err)
	}
	var out []int
	for n, c := range cmds {
		if c.Val() > 0 {
			out = append(out, n)
		}
	}
	return out, nil
}

// Beyond returns the indexes of [from, MaxShards) whose key (keyOf, e.g.
// Keys.Pending) exists: where a producer hashing with a larger shard
// count than the recorded one wrote tasks. It reads all of them at once,
// for the commands an operator runs (stats, list); the dispatcher walks
// them a chunk at a time.
func Beyond(ctx context.Context, rdb redis.UniversalClient, keyOf func(int) string, from int) ([]int, error) {
	if from >= MaxShards {
		return nil, nil
	}
	keys := make([]string, 0, MaxShards-from)
	for i := from; i < MaxShards; i++ {
		keys = append(keys, keyOf(i))
	}
	found, err := Occupied(ctx, rdb, keys)
	if err != nil {
		return nil, err
	}
	for n := range found {
		found[n] += from
	}
	return found, nil
}
