package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Layout is how a queue's tasks are spread over shards, as recorded in
// Redis. Shards (P:{Q}:shards) is the M producers hash with. While the
// shard count changes (`dispatcher reshard`), From is the M it changes
// from, and tasks written with either are dispatched; after a shrink,
// Retired is the M it shrank from, whose extra shards are watched for
// tasks from producers still hashing with it.
type Layout struct {
	Shards  int `json:"shards"`
	From    int `json:"changing_from,omitempty"` // 0 unless a change is in progress
	Retired int `json:"retired,omitempty"`       // 0 unless a shrink retired shards Shards..Retired-1
}

// Changing reports whether a change of the shard count is in progress.
func (l Layout) Changing() bool { return l.From != 0 }

// Span is how many shard indexes may hold tasks to dispatch: every
// index of either M while a change is in progress.
func (l Layout) Span() int { return max(l.Shards, l.From) }

// Indexes returns the shards a member may be pending in: its shard by M
// and, during a change, by the old M if that differs.
func (l Layout) Indexes(member []byte) []int {
	i := Index(member, l.Shards)
	if l.From != 0 {
		if j := Index(member, l.From); j != i {
			return []int{i, j}
		}
	}
	return []int{i}
}

func (l Layout) String() string {
	switch {
	case l.From != 0:
		return fmt.Sprintf("%d shards, changing from %d", l.Shards, l.From)
	case l.Retired != 0:
		return fmt.Sprintf("%d shards (shrunk from %d)", l.Shards, l.Retired)
	}
	return fmt.Sprintf("%d shards", l.Shards)
}

// ErrNoLayout: no shard count is recorded for the queue yet (no dispatcher
// has served it).
var ErrNoLayout = errors.New("no shard count recorded")

// ReadLayout reads a queue's layout in one round trip (its keys share the
// hash tag {Q}, so one node on Redis Cluster). It returns ErrNoLayout,
// wrapped, when no shard count is recorded.
func ReadLayout(ctx context.Context, rdb redis.UniversalClient, keys Keys) (Layout, error) {
	pipe := rdb.Pipeline()
	layout := QueueLayoutRead(ctx, pipe, keys)
	_, _ = pipe.Exec(ctx)
	return layout()
}

// QueueLayoutRead queues ReadLayout's reads on pipe, so that they can
// share a round trip with other commands; the function it returns gives
// the layout once pipe has run.
func QueueLayoutRead(ctx context.Context, pipe redis.Pipeliner, keys Keys) func() (Layout, error) {
	m := pipe.Get(ctx, keys.ShardCount())
	from := pipe.HGet(ctx, keys.Reshard(), "from")
	retired := pipe.Get(ctx, keys.Retired())
	return func() (Layout, error) {
		var l Layout
		var err error
		if l.Shards, err = count(m); err != nil {
			return Layout{}, err
		}
		if l.Shards == 0 {
			return Layout{}, fmt.Errorf("queue %s: %w at %s", keys.Queue, ErrNoLayout, keys.ShardCount())
		}
		if l.From, err = count(from); err != nil {
			return Layout{}, err
		}
		if l.Retired, err = count(retired); err != nil {
			return Layout{}, err
		}
		if l.Retired <= l.Shards {
			l.Retired = 0
		}
		return l, nil
	}
}

// count reads a shard count from cmd, a GET or HGET, named in an error by
// its key (and field): not before, as the reads of a thousand queues
// every few seconds would build the names for nothing.
func count(cmd *redis.StringCmd) (int, error) {
	v, err := cmd.Result()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	what := func() string {
		var parts []string
		for _, a := range cmd.Args()[1:] {
			parts = append(parts, fmt.Sprint(a))
		}
		return strings.Join(parts, " ")
	}
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", what(), err)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > MaxShards {
		return 0, fmt.Errorf("%s is %q, not a shard count 1..%d", what(), v, MaxShards)
	}
	return n, nil
}

// EnsureLayout records m as the queue's shard count if none is recorded
// yet, and returns the layout recorded (Redis is the truth once a count is
// recorded: `dispatcher reshard` changes it). It reads before it writes,
// so that a Redis refusing writes does not stop a queue whose count is
// recorded.
func EnsureLayout(ctx context.Context, rdb redis.UniversalClient, keys Keys, m int) (Layout, error) {
	l, err := ReadLayout(ctx, rdb, keys)
	if !errors.Is(err, ErrNoLayout) {
		return l, err
	}
	if err := rdb.SetNX(ctx, keys.ShardCount(), m, 0).Err(); err != nil {
		return Layout{}, fmt.Errorf("record shard count at %s: %w", keys.ShardCount(), err)
	}
	return ReadLayout(ctx, rdb, keys)
}
