// Package shardcluster_test tests the producer package shard against
// servers the main module's testenv starts (a Redis Cluster, a
// cluster-enabled redis-server): the shard module itself depends on
// go-redis and xxhash alone, so these tests live here.
package shardcluster_test

import (
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// pendingKey computes the contract's key P:{Q:i}, i = XXH64(member) mod m,
// without the package under test.
func pendingKey(prefix, queue string, member []byte, m int) string {
	i := xxhash.Sum64(member) % uint64(m)
	return prefix + ":{" + queue + ":" + strconv.FormatUint(i, 10) + "}"
}
