package shardcluster_test

import (
	"context"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// TestBeyond: the indexes beyond a count whose keys exist are found, on
// one server and on a Redis Cluster (where one EXISTS may not span
// slots), the contract's last index included; none when none exist.
func TestBeyond(t *testing.T) {
	ctx := context.Background()
	single := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, single, prefix)
	cluster := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	for name, rdb := range map[string]redis.UniversalClient{"single": single, "cluster": cluster.Client()} {
		t.Run(name, func(t *testing.T) {
			k := shard.Keys{Prefix: prefix, Queue: "q"}
			got, err := shard.Beyond(ctx, rdb, k.Pending, 32)
			if err != nil || len(got) != 0 {
				t.Fatalf("nothing written: %v, %v", got, err)
			}
			want := []int{32, 40, 63, 4095}
			for _, i := range append(want, 3) { // 3 is not beyond
				if err := rdb.ZAdd(ctx, k.Pending(i), redis.Z{Score: 1, Member: "m"}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			got, err = shard.Beyond(ctx, rdb, k.Pending, 32)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("Beyond(32) = %v, %v; want %v", got, err, want)
			}
			if got, err := shard.Beyond(ctx, rdb, k.Pending, shard.MaxShards); err != nil || got != nil {
				t.Errorf("Beyond(MaxShards) = %v, %v; want none", got, err)
			}
		})
	}
}
