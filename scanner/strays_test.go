package scanner

import (
	"testing"

	"github.com/dispatcher/dispatcher/shard"
)

// TestStrayWalkCycle: a cycle of strayChunks chunks looks at every index
// beyond the served ones once (fewer than strayChunks: each at least
// once), each chunk of about the same size, and a
// layout that serves more (or retired more) moves the walk past them.
func TestStrayWalkCycle(t *testing.T) {
	for _, from := range []int{1, 32, 1000, 4095} {
		var w strayWalk
		seen := make([]int, shard.MaxShards)
		most := 0
		for range strayChunks {
			lo, hi := w.chunk(from)
			most = max(most, hi-lo)
			for i := lo; i < hi; i++ {
				seen[i]++
			}
		}
		for i, n := range seen {
			// Fewer indexes than chunks: a cycle is shorter, not slower.
			if (i < from && n != 0) || (i >= from && n < 1) || (shard.MaxShards-from >= strayChunks && n > 1) {
				t.Fatalf("from %d: index %d looked at %d times in a cycle", from, i, n)
			}
		}
		if limit := (shard.MaxShards-from+strayChunks-1)/strayChunks + 1; most > limit {
			t.Errorf("from %d: a chunk of %d indexes, want at most %d", from, most, limit)
		}
		// The next cycle starts over.
		if lo, _ := w.chunk(from); shard.MaxShards-from >= strayChunks && lo != from {
			t.Errorf("from %d: the next cycle starts at %d", from, lo)
		}
	}
	var w strayWalk
	w.chunk(32)
	if lo, _ := w.chunk(1000); lo != 1000 {
		t.Errorf("after the count grew to 1000 the walk goes on at %d", lo)
	}
	if lo, hi := w.chunk(shard.MaxShards); lo != hi {
		t.Errorf("at 4096 shards there is nothing beyond, yet %d..%d", lo, hi)
	}
}
