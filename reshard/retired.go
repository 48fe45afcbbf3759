package reshard

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// Swept is what SweepRetired did.
type Swept struct {
	// Moved: pending tasks and dead letters producers still hashing with
	// the retired count wrote there, moved to their shards.
	Moved int64
	// Reclaimed: tasks left in flight there whose lease ran out (their
	// instance stopped without confirming them, having claimed them just
	// before the shrink finished), handed to their shards' dispatchers.
	Reclaimed int64
}

// retiredWork reports whether the retired shards of l hold anything to
// sweep: a pending task or dead letter, or an in-flight entry whose lease
// ran out (one whose lease runs is its holder's to confirm). One round
// trip: EXISTS and the earliest lease per shard, and the server clock.
func retiredWork(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, l shard.Layout) (bool, error) {
	pipe := rdb.Pipeline()
	now := pipe.Time(ctx)
	var exists []*redis.IntCmd
	var leases []*redis.ZSliceCmd
	for i := l.Shards; i < l.Retired; i++ {
		exists = append(exists, pipe.Exists(ctx, keys.Pending(i), keys.Dead(i)))
		leases = append(leases, pipe.ZRangeWithScores(ctx, keys.Inflight(i), 0, 0))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("queue %s: check the retired shards %d..%d: %w", keys.Queue, l.Shards, l.Retired-1, err)
	}
	nowMs := float64(now.Val().UnixMilli())
	for n := range exists {
		if exists[n].Val() > 0 {
			return true, nil
		}
		if zs := leases[n].Val(); len(zs) > 0 && zs[0].Score <= nowMs {
			return true, nil
		}
	}
	return false, nil
}

// reclaimInflight hands the in-flight entries of retired shard i whose
// lease ran out to the in-flight set of their member's shard by l.Shards,
// with a lease that has run out too: the next claim there, by any
// instance, takes and delivers them (with their due time, so their
// message_id, their failed attempts, body and properties). The shards are
// in different slots on Redis Cluster, so this goes in the three steps of
// a move (scripts.go: handInScript, takeInflightScript,
// undoInflightScript), each entry in at least one of the two sets at
// every moment.
func (m *Mover) reclaimInflight(ctx context.Context, l shard.Layout, i int) (int64, error) {
	batch := m.Batch
	if batch <= 0 {
		batch = 500
	}
	src := m.Keys.Inflight(i)
	var total int64
	for {
		now, err := m.RDB.Time(ctx).Result()
		if err != nil {
			return total, fmt.Errorf("shard %d: read the Redis clock: %w", i, err)
		}
		zs, err := m.RDB.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: src, Start: "-inf", Stop: now.UnixMilli(), ByScore: true, Count: int64(batch)}).Result()
		if err != nil {
			return total, fmt.Errorf("shard %d: read the expired leases of %s: %w", i, src, err)
		}
		if len(zs) == 0 {
			return total, nil
		}
		entries := make([]string, len(zs))
		for k, z := range zs {
			entries[k], _ = z.Member.(string)
		}
		pipe := m.RDB.Pipeline()
		attemptsCmd := pipe.HMGet(ctx, m.Keys.Attempts(i), entries...)
		bodies, props := pipe.HMGet(ctx, m.Keys.ClaimedBody(i), entries...), pipe.HMGet(ctx, m.Keys.ClaimedProps(i), entries...)
		_, _ = pipe.Exec(ctx)
		attempts, err := attemptsCmd.Result()
		if err != nil {
			return total, fmt.Errorf("shard %d: read the attempts of expired leases: %w", i, err)
		}
		fs, err := readFields(bodies, props, len(entries))
		if err != nil {
			return total, fmt.Errorf("shard %d: expired leases: %w", i, err)
		}
		groups := map[int][]handOver{}
		for k, e := range entries {
			due, member, ok := strings.Cut(e, ":")
			if !ok {
				continue // not an entry: nothing could deliver it
			}
			n, _ := attempts[k].(string)
			j := shard.Index([]byte(member), l.Shards)
			groups[j] = append(groups[j], handOver{entry: e, lease: strconv.FormatFloat(zs[k].Score, 'f', -1, 64), due: due, attempts: n, f: fs[k]})
		}
		n, err := m.handOver(ctx, i, groups, now.UnixMilli())
		total += n
		if err != nil || n == 0 || len(zs) < batch {
			return total, err
		}
	}
}

// handOver is one in-flight entry handed from a retired shard to another,
// with its body and properties.
type handOver struct {
	entry, lease, due, attempts string // attempts "": none failed
	f                           fields
}

// handOver runs the three steps for a page's entries, each step for all
// destinations in one pipelined round trip, to their end once begun; it
// returns how many left the retired shard.
func (m *Mover) handOver(ctx context.Context, i int, groups map[int][]handOver, nowMs int64) (int64, error) {
	if len(groups) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	marker := newMarker()
	bs := make([]*inflightMove, 0, len(groups))
	for j, hs := range groups {
		// At most moveBytes of bodies and properties per call.
		lo := 0
		for _, hi := range parts(len(hs), func(k int) int { return len(hs[k].entry) + hs[k].f.size() }) {
			bs = append(bs, m.inflightBatch(i, j, hs[lo:hi], marker))
			lo = hi
		}
	}
	err := runSteps(ctx, m.RDB, inflightSteps, bs)
	var moved int64
	for _, b := range bs {
		moved += b.moved
		if err == nil {
			// A hint: the sweep finds the expired leases anyway.
			_ = m.RDB.Publish(ctx, m.Keys.Wake(), shard.WakeDue(b.j, nowMs)).Err()
		}
	}
	return moved, err
}

// newMarker is the lease a hand-over run gives the entries it adds: run
// out, in (0, 1), and its own (scripts.go).
func newMarker() string {
	return strconv.FormatFloat(float64(1+rand.IntN(1<<21-1))/(1<<21), 'f', -1, 64)
}

// inflightMove is one batch's hand-over from retired shard i to shard j.
type inflightMove struct {
	j            int
	src, dst     []string // in-flight set, attempts hash, retrying index, claimed:body, claimed:props
	hs           []handOver
	marker       string
	added, taken []int64
	moved        int64 // taken out of the retired shard
}

func (m *Mover) inflightBatch(i, j int, hs []handOver, marker string) *inflightMove {
	keys := func(k int) []string {
		return []string{m.Keys.Inflight(k), m.Keys.Attempts(k), m.Keys.Retrying(k), m.Keys.ClaimedBody(k), m.Keys.ClaimedProps(k)}
	}
	return &inflightMove{j: j, src: keys(i), dst: keys(j), hs: hs, marker: marker}
}

var inflightSteps = []step[*inflightMove]{
	{handInScript, func(b *inflightMove) ([]string, []any) {
		args := []any{b.marker}
		for _, h := range b.hs {
			args = append(args, h.entry, h.attempts, h.due, h.f.has, h.f.body, h.f.props)
		}
		return b.dst, args
	}, func(b *inflightMove, c *redis.Cmd) (err error) {
		if b.added, err = c.Int64Slice(); err != nil {
			return fmt.Errorf("hand expired leases of %s to %s: %w", b.src[0], b.dst[0], err)
		}
		return nil
	}},
	{takeInflightScript, func(b *inflightMove) ([]string, []any) {
		args := make([]any, 0, 2*len(b.hs))
		for _, h := range b.hs {
			args = append(args, h.lease, h.entry)
		}
		return b.src, args
	}, func(b *inflightMove, c *redis.Cmd) (err error) {
		if b.taken, err = c.Int64Slice(); err != nil {
			// Those added are in both sets: the next sweep finishes
			// their hand-over (at worst they are delivered twice).
			return fmt.Errorf("hand expired leases of %s to %s: remove from the retired shard: %w", b.src[0], b.dst[0], err)
		}
		for _, f := range b.taken {
			if f == 1 {
				b.moved++
			}
		}
		return nil
	}},
	{undoInflightScript, func(b *inflightMove) ([]string, []any) {
		args := []any{b.marker}
		for k, h := range b.hs {
			if b.added[k] == 1 && b.taken[k] != 1 {
				args = append(args, h.entry)
			}
		}
		return b.dst, args
	}, func(b *inflightMove, c *redis.Cmd) error {
		if err := c.Err(); err != nil {
			return fmt.Errorf("undo hand-overs to %s (the retired shard's entry changed meanwhile): %w", b.dst[0], err)
		}
		return nil
	}},
}
