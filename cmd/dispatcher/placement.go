package main

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// logShardPlacement says, on Redis Cluster, which primary holds which
// shards of each queue: one line per queue and primary, so an operator
// sees what waits when a primary is lost, and how evenly M spread.
func logShardPlacement(ctx context.Context, rdb redis.UniversalClient, cfg *config.Settings, log *slog.Logger) {
	if _, ok := rdb.(*redis.ClusterClient); !ok {
		return
	}
	for _, q := range cfg.QueueSettings {
		keys := shard.Keys{Prefix: cfg.KeyPrefix, Queue: q.Name}
		byNode := map[string][]int{}
		for i := 0; i < q.Shards; i++ {
			node := redisconn.NodeOf(ctx, rdb, keys.Pending(i))
			if node == "" {
				node = "unknown (no slot map yet)"
			}
			byNode[node] = append(byNode[node], i)
		}
		nodes := make([]string, 0, len(byNode))
		for n := range byNode {
			nodes = append(nodes, n)
		}
		slices.Sort(nodes)
		for _, n := range nodes {
			log.Info("shard placement", "queue", q.Name, "primary", n,
				"shards", len(byNode[n]), "of", q.Shards, "indexes", ranges(byNode[n]))
		}
	}
}

// ranges writes sorted ints compactly: "0-3,7,9-10".
func ranges(xs []int) string {
	var b strings.Builder
	for n := 0; n < len(xs); {
		m := n
		for m+1 < len(xs) && xs[m+1] == xs[m]+1 {
			m++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(xs[n]))
		if m > n {
			b.WriteString("-" + strconv.Itoa(xs[m]))
		}
		n = m + 1
	}
	return b.String()
}
