package scanner

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// On Redis Cluster a claim job goes to one primary and holds publish slots
// until it answers. A primary that stopped answering must not take every
// slot (found in review: with its shards' due times never refreshed, they
// sorted first, its next claim took all the slots, and the other primaries'
// tasks waited while it timed out). A job may take an even share of the
// slots, and one primary that failed is probed with a single shard.
func TestClaimJobsShareSlotsOnCluster(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{ReplicasPer: -1})
	ctx := context.Background()
	s := New(c.Client(), nil, Options{Queue: "q", Shards: 16, KeyPrefix: "p", BatchSize: 10, Pipeline: 4,
		PollInterval: 50 * time.Millisecond, Lease: 30 * time.Second, MaxAttempts: 3,
		RetryMin: time.Second, RetryMax: time.Second})
	if !s.prim.cluster || !s.prim.anyFree(ctx) || len(s.prim.addrs) != 3 {
		t.Fatalf("cluster %v, primaries %v", s.prim.cluster, s.prim.addrs)
	}
	all := make([]int, 16)
	for i := range all {
		all[i] = i
	}
	per := s.prim.slotsPerJob(4)
	if per != 2 {
		t.Fatalf("slots per job of 4 over 3 primaries: %d, want 2", per)
	}
	jobs := s.prim.jobs(ctx, all, 10, per)
	if len(jobs) != 3 {
		t.Fatalf("%d jobs, want one per primary: %+v", len(jobs), jobs)
	}
	for _, j := range jobs {
		if len(j.shards) > per {
			t.Errorf("job on %s takes %d shards, more than its share %d", j.node, len(j.shards), per)
		}
	}
	// A primary that failed gets one shard until it answers again.
	bad := jobs[0].node
	s.prim.nodeTrouble(ctx, bad, errors.New("i/o timeout"))
	s.prim.node(bad).until = time.Time{} // its backoff is over: probe it
	for _, j := range s.prim.jobs(ctx, all, 10, per) {
		if j.node == bad && len(j.shards) != 1 {
			t.Errorf("probe of %s takes %d shards, want 1", bad, len(j.shards))
		}
	}
	s.prim.nodeFine(bad)
	for _, j := range s.prim.jobs(ctx, all, 10, per) {
		if j.node == bad && len(j.shards) != per {
			t.Errorf("%s answered again but takes %d shards, want %d", bad, len(j.shards), per)
		}
	}
	// Sweeps read every shard of a primary in one job.
	n := 0
	for _, j := range s.prim.jobs(ctx, all, 0, len(all)) {
		n += len(j.shards)
	}
	if n != 16 {
		t.Errorf("sweep jobs cover %d shards, want 16", n)
	}
}
