package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotPending is returned by Reschedule when the member is not pending
// (never scheduled, cancelled, or already taken by a dispatcher).
var ErrNotPending = errors.New("task is not pending")

// Task is one scheduling: the member (task body) and its due time.
type Task struct {
	Member []byte
	Due    time.Time
}

// Producer schedules tasks of one queue. It is safe for concurrent use.
type Producer struct {
	rdb        redis.UniversalClient
	keys       Keys
	shards     int
	wakeWithin time.Duration
}

// DefaultWakeWithin: a task due sooner than this after it is scheduled also
// wakes the dispatchers, in the same round trip; later ones are found by
// their regular poll in good time.
const DefaultWakeWithin = time.Second

// NewProducer returns a producer for queue with m shards under prefix.
// m must equal the dispatcher's DISPATCHER_QUEUE_<NAME>_SHARDS.
func NewProducer(rdb redis.UniversalClient, prefix, queue string, m int) (*Producer, error) {
	if !ValidQueueName(queue) {
		return nil, fmt.Errorf("queue name %q: want 1 to 64 characters of A-Z a-z 0-9 _ . -", queue)
	}
	if m < 1 || m > MaxShards {
		return nil, fmt.Errorf("queue %q: shard count %d out of range 1..%d", queue, m, MaxShards)
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Producer{rdb: rdb, keys: Keys{Prefix: prefix, Queue: queue}, shards: m, wakeWithin: DefaultWakeWithin}, nil
}

// SetWakeWithin sets how soon a task must be due for scheduling it to wake
// the dispatchers (DefaultWakeWithin); 0 turns wake-ups off, leaving only
// ZADDs, like any producer in another language.
func (p *Producer) SetWakeWithin(d time.Duration) { p.wakeWithin = d }

// Keys returns the key builder of the producer's queue.
func (p *Producer) Keys() Keys { return p.keys }

// DueMs converts a due time to the contract's score: integer ms since epoch.
func DueMs(t time.Time) int64 { return t.UnixMilli() }

// wakeSoon reports whether a task due at dueMs should wake the dispatchers.
func (p *Producer) wakeSoon(dueMs int64) bool {
	return p.wakeWithin > 0 && dueMs <= time.Now().Add(p.wakeWithin).UnixMilli()
}

// Schedule adds a task due at due. Scheduling a member that is already
// pending moves it to the new due time (see Reschedule). A task due soon
// also wakes the dispatchers, in the same round trip.
func (p *Producer) Schedule(ctx context.Context, member []byte, due time.Time) error {
	i := Index(member, p.shards)
	key := p.keys.Pending(i)
	z := redis.Z{Score: float64(DueMs(due)), Member: member}
	if !p.wakeSoon(DueMs(due)) {
		if err := p.rdb.ZAdd(ctx, key, z).Err(); err != nil {
			return fmt.Errorf("schedule on %s: %w", key, err)
		}
		return nil
	}
	pipe := p.rdb.Pipeline()
	zadd := pipe.ZAdd(ctx, key, z)
	// The wake-up's own error is ignored: a lost one costs a poll interval,
	// and a producer whose ACL forbids PUBLISH must still schedule.
	pipe.Publish(ctx, p.keys.Wake(), WakeDue(i, DueMs(due)))
	_, _ = pipe.Exec(ctx)
	if err := zadd.Err(); err != nil {
		return fmt.Errorf("schedule on %s: %w", key, err)
	}
	return nil
}

// ScheduleMany adds many tasks in one pipelined round trip per call.
func (p *Producer) ScheduleMany(ctx context.Context, tasks []Task) error {
	if len(tasks) == 0 {
		return nil
	}
	byShard := make(map[int][]redis.Z)
	earliest := make(map[int]int64)
	for _, t := range tasks {
		i := Index(t.Member, p.shards)
		due := DueMs(t.Due)
		byShard[i] = append(byShard[i], redis.Z{Score: float64(due), Member: t.Member})
		if e, ok := earliest[i]; !ok || due < e {
			earliest[i] = due
		}
	}
	pipe := p.rdb.Pipeline()
	var zadds []*redis.IntCmd
	for i, zs := range byShard {
		zadds = append(zadds, pipe.ZAdd(ctx, p.keys.Pending(i), zs...))
		if p.wakeSoon(earliest[i]) {
			pipe.Publish(ctx, p.keys.Wake(), WakeDue(i, earliest[i]))
		}
	}
	_, _ = pipe.Exec(ctx) // wake-up errors are ignored, as in Schedule
	for _, z := range zadds {
		if err := z.Err(); err != nil {
			return fmt.Errorf("schedule %d tasks on queue %s: %w", len(tasks), p.keys.Queue, err)
		}
	}
	return nil
}

// rescheduleScript moves a pending member to a new due time, and only if
// it is still pending, so that a task already dispatched is not scheduled
// again by accident.
//
// KEYS[1] pending shard
// ARGV[1] new due time (ms)
// ARGV[2] member
// Returns 1 if moved, 0 if the member was not pending.
var rescheduleScript = redis.NewScript(`
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
`)

// Reschedule moves a pending task to a new due time. It returns
// ErrNotPending if the task is no longer pending.
func (p *Producer) Reschedule(ctx context.Context, member []byte, due time.Time) error {
	key := p.keys.Shard(member, p.shards)
	n, err := rescheduleScript.Run(ctx, p.rdb, []string{key}, strconv.FormatInt(DueMs(due), 10), member).Int()
	if err != nil {
		return fmt.Errorf("reschedule on %s: %w", key, err)
	}
	if n == 0 {
		return ErrNotPending
	}
	return nil
}

// Cancel removes a pending task. It reports whether the task was pending
// and is now removed; false means there was no such pending scheduling,
// e.g. because a dispatcher already claimed it. A claimed scheduling
// cannot be cancelled: it is delivered at least once, and may already be
// in the broker (a confirmed publish whose removal from Redis has not
// happened yet is sent again). Consumers that must honour a cancel after
// the claim check it themselves when the task arrives.
func (p *Producer) Cancel(ctx context.Context, member []byte) (bool, error) {
	key := p.keys.Shard(member, p.shards)
	n, err := p.rdb.ZRem(ctx, key, member).Result()
	if err != nil {
		return false, fmt.Errorf("cancel on %s: %w", key, err)
	}
	return n > 0, nil
}
