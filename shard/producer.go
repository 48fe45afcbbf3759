package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
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
	shards     int // used until a count is recorded in Redis
	layout     atomic.Pointer[readLayout]
	wakeWithin time.Duration
	// ordered: rdb sends a pipeline on one connection to one server, which
	// runs it in order, so a wake-up can follow its ZADD in one pipeline.
	ordered bool
	// age is how long ago a layout read was sent (time.Since; tests make
	// writes look slow).
	age func(sent time.Time) time.Duration
}

// DefaultWakeWithin: a task due sooner than this after it is scheduled also
// wakes the dispatchers; later ones are found by their regular poll in good
// time.
const DefaultWakeWithin = time.Second

// pipelineInOrder reports whether rdb runs a pipeline in order: a
// *redis.Client (one server, or the primary a Sentinel names) writes it on
// one connection. A *redis.ClusterClient does not: it sends each node's
// commands concurrently, and a PUBLISH, which has no key, goes to any
// primary, so it can be broadcast before a ZADD in the same pipeline has
// run on the shard's primary; a dispatcher woken by it would claim the
// shard too early, find nothing, and the task would wait for the next poll.
// Any other client (a Ring, a wrapper) is taken to be unordered too.
func pipelineInOrder(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.Client)
	return ok
}

// NewProducer returns a producer for queue under prefix. m is the shard
// count it uses while none is recorded in Redis; once a dispatcher has
// recorded one (P:{Q}:shards), the producer follows that, read at most
// LayoutTTL before each write.
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
	return &Producer{rdb: rdb, keys: Keys{Prefix: prefix, Queue: queue}, shards: m,
		wakeWithin: DefaultWakeWithin, ordered: pipelineInOrder(rdb), age: time.Since}, nil
}

// LayoutTTL is how long a producer uses the queue's layout it read before
// reading it again: a change of the shard count reaches it within this.
const LayoutTTL = time.Second

// LayoutSettle is how long after a change of the shard count is recorded
// no task is moved between shards (reshard waits for it): a write that a
// producer completes within it of reading the layout cannot be undone by
// a move, whatever the layout it used. A producer whose write took longer
// than LayoutRecheck after its layout read reads the layout again and, if
// it changed, writes again by the new one (CONTRACT.md).
const LayoutSettle = 5 * time.Second

// LayoutRecheck: see LayoutSettle. The 2 s between them allow for clocks
// that run at slightly different rates and for the read's own round trip.
const LayoutRecheck = LayoutSettle - 2*time.Second

type readLayout struct {
	l    Layout
	sent time.Time // when the read was sent: its age bounds the layout's
	read bool      // false: the configured count, or the last read kept after a failed read
}

// Layout returns the queue's layout as recorded in Redis, read at most
// once per LayoutTTL; the configured count while none is recorded, or if
// Redis cannot be read (the last one read, if any).
func (p *Producer) Layout(ctx context.Context) Layout {
	return p.readLayout(ctx, false).l
}

// readLayout is Layout with when its read was sent; fresh reads it
// whatever its age.
func (p *Producer) readLayout(ctx context.Context, fresh bool) readLayout {
	cur := p.layout.Load()
	if cur != nil && !fresh && time.Since(cur.sent) < LayoutTTL {
		return *cur
	}
	sent := time.Now()
	l, err := ReadLayout(ctx, p.rdb, p.keys)
	next := readLayout{l: l, sent: sent, read: err == nil || errors.Is(err, ErrNoLayout)}
	switch {
	case err == nil:
	case cur != nil && !errors.Is(err, ErrNoLayout):
		// The last layout read, as old as it is: a write by it must not
		// look as if it used a fresh one (settled).
		next.l, next.sent = cur.l, cur.sent
	default:
		next.l = Layout{Shards: p.shards}
	}
	p.layout.Store(&next)
	return next
}

// settled runs write with the queue's layout. If write's reply came
// LayoutRecheck or more after that layout was read (a slow Redis, a long
// pause of this process), the layout may have changed and a move started
// meanwhile, which could undo the write: the layout is read again and, if
// it changed, write runs again by the new one, until one completes in
// time or the layout holds. Writes are idempotent, so running one again
// is safe.
func (p *Producer) settled(ctx context.Context, write func(Layout) error) error {
	cur := p.readLayout(ctx, false)
	err := write(cur.l)
	for p.age(cur.sent) >= LayoutRecheck {
		next := p.readLayout(ctx, true)
		if !next.read {
			if err != nil {
				return err
			}
			return fmt.Errorf("queue %s: the write took %s, and the shard layout could not be read again to check that it still holds (write it again)",
				p.keys.Queue, p.age(cur.sent).Round(time.Millisecond))
		}
		if next.l == cur.l {
			break
		}
		cur = next
		err = write(cur.l)
	}
	return err
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
// also wakes the dispatchers, only once its ZADD has run: in the same
// pipeline on a single server (or Sentinel), which runs it in order; after
// the ZADD's reply, a second round trip, on Redis Cluster.
//
// While the queue's shard count changes, the task goes to its shard by the
// new count, and a copy pending in its shard by the old one is removed
// (after the ZADD, so that the task is never in neither): scheduling a
// member again is a reschedule whichever count wrote it first.
//
// During a change (and after a shrink, while retired shards are swept),
// the ZADD is a script that also unlists the member from the shard's
// moving hash (Keys.Moving), so that a move of the task under way never
// undoes this schedule.
func (p *Producer) Schedule(ctx context.Context, member []byte, due time.Time) error {
	return p.settled(ctx, func(l Layout) error { return p.scheduleBy(ctx, l, member, due) })
}

// scheduleBy is Schedule by layout l.
func (p *Producer) scheduleBy(ctx context.Context, l Layout, member []byte, due time.Time) error {
	i := Index(member, l.Shards)
	if err := p.schedule(ctx, i, member, due, moves(l)); err != nil {
		return err
	}
	return p.removeOld(ctx, l, member, i)
}

// moves reports whether tasks may be moved between shards under layout l
// (during a change, or out of the shards a shrink retired): writes then
// go through scheduleScript.
func moves(l Layout) bool { return l.Changing() || l.Retired != 0 }

// scheduleScript is the ZADD of tasks to a pending shard while tasks may
// be moved between shards: it also unlists each member from the shard's
// moving hash, so that a move whose first step added the member to this
// shard does not undo this later write (see reshard/scripts.go).
//
// KEYS[1] pending shard P:{Q:i}, KEYS[2] its moving hash P:{Q:i}:moving
// ARGV    score1, member1, score2, member2, ...
// Returns the number of members added (as ZADD).
var scheduleScript = redis.NewScript(`
local n = 0
for i = 1, #ARGV, 2 do
  n = n + redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HDEL', KEYS[2], ARGV[i + 1])
end
return n
`)

// zadd queues on c (a pipeline) the ZADD of zs to shard i, through
// scheduleScript when viaScript.
func (p *Producer) zadd(ctx context.Context, c redis.Pipeliner, i int, viaScript bool, zs ...redis.Z) redis.Cmder {
	if !viaScript {
		return c.ZAdd(ctx, p.keys.Pending(i), zs...)
	}
	args := make([]any, 0, 2*len(zs))
	for _, z := range zs {
		args = append(args, strconv.FormatInt(int64(z.Score), 10), z.Member)
	}
	return scheduleScript.Eval(ctx, c, []string{p.keys.Pending(i), p.keys.Moving(i)}, args...)
}

// schedule adds a task to shard i, with its wake-up; viaScript: see zadd.
func (p *Producer) schedule(ctx context.Context, i int, member []byte, due time.Time, viaScript bool) error {
	key := p.keys.Pending(i)
	dueMs := DueMs(due)
	z := redis.Z{Score: float64(dueMs), Member: member}
	wake := p.wakeSoon(dueMs)
	if wake && p.ordered {
		pipe := p.rdb.Pipeline()
		zadd := p.zadd(ctx, pipe, i, viaScript, z)
		// The wake-up's own error is ignored: a lost one costs a poll
		// interval, and a producer whose ACL forbids PUBLISH must still
		// schedule.
		pipe.Publish(ctx, p.keys.Wake(), WakeDue(i, dueMs))
		_, _ = pipe.Exec(ctx)
		if err := zadd.Err(); err != nil {
			return fmt.Errorf("schedule on %s: %w", key, err)
		}
		return nil
	}
	var err error
	if viaScript {
		err = scheduleScript.Run(ctx, p.rdb, []string{key, p.keys.Moving(i)}, strconv.FormatInt(dueMs, 10), member).Err()
	} else {
		err = p.rdb.ZAdd(ctx, key, z).Err()
	}
	if err != nil {
		return fmt.Errorf("schedule on %s: %w", key, err)
	}
	if wake {
		_ = p.rdb.Publish(ctx, p.keys.Wake(), WakeDue(i, dueMs)).Err() // ignored, as above
	}
	return nil
}

// ScheduleMany adds many tasks in one pipelined round trip per call; on
// Redis Cluster, when some are due soon, a second one sends the wake-ups
// after the ZADDs were answered (see Schedule). If a shard's ZADD fails,
// the other shards' tasks are still scheduled (and woken), and the error
// names the shard's key.
func (p *Producer) ScheduleMany(ctx context.Context, tasks []Task) error {
	if len(tasks) == 0 {
		return nil
	}
	return p.settled(ctx, func(l Layout) error { return p.scheduleManyBy(ctx, l, tasks) })
}

// scheduleManyBy is ScheduleMany by layout l.
func (p *Producer) scheduleManyBy(ctx context.Context, l Layout, tasks []Task) error {
	byShard := make(map[int][]redis.Z)
	earliest := make(map[int]int64)
	// During a change: by new shard, the members to remove from their
	// shard by the old count once their ZADD has succeeded.
	old := map[int]map[int][]any{}
	for _, t := range tasks {
		i := Index(t.Member, l.Shards)
		if l.Changing() {
			if j := Index(t.Member, l.From); j != i {
				if old[i] == nil {
					old[i] = map[int][]any{}
				}
				old[i][j] = append(old[i][j], t.Member)
			}
		}
		due := DueMs(t.Due)
		byShard[i] = append(byShard[i], redis.Z{Score: float64(due), Member: t.Member})
		if e, ok := earliest[i]; !ok || due < e {
			earliest[i] = due
		}
	}
	type shardAdd struct {
		i    int
		wake bool
		zadd redis.Cmder
	}
	adds := make([]shardAdd, 0, len(byShard))
	pipe := p.rdb.Pipeline()
	for i, zs := range byShard {
		a := shardAdd{i: i, wake: p.wakeSoon(earliest[i]), zadd: p.zadd(ctx, pipe, i, moves(l), zs...)}
		if a.wake && p.ordered {
			pipe.Publish(ctx, p.keys.Wake(), WakeDue(i, earliest[i]))
		}
		adds = append(adds, a)
	}
	_, _ = pipe.Exec(ctx) // wake-up errors are ignored, as in Schedule
	var firstErr error
	var wakes redis.Pipeliner
	rmOld := map[int][]any{}
	for _, a := range adds {
		if err := a.zadd.Err(); err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("schedule %d tasks on queue %s: %d on %s: %w",
					len(tasks), p.keys.Queue, len(byShard[a.i]), p.keys.Pending(a.i), err)
			}
			continue
		}
		for j, members := range old[a.i] {
			rmOld[j] = append(rmOld[j], members...)
		}
		if a.wake && !p.ordered {
			if wakes == nil {
				wakes = p.rdb.Pipeline()
			}
			wakes.Publish(ctx, p.keys.Wake(), WakeDue(a.i, earliest[a.i]))
		}
	}
	if wakes != nil {
		_, _ = wakes.Exec(ctx)
	}
	if len(rmOld) > 0 {
		// Only the old copies of the tasks whose ZADD succeeded: the others
		// stay where they were, as they were.
		rm := p.rdb.Pipeline()
		for j, members := range rmOld {
			rm.ZRem(ctx, p.keys.Pending(j), members...)
		}
		if _, err := rm.Exec(ctx); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("schedule %d tasks on queue %s: remove their copies by the old shard count %d: %w (run it again: a copy left there is dispatched at its old due time)",
				len(tasks), p.keys.Queue, l.From, err)
		}
	}
	return firstErr
}

// removeOld removes, during a change of the shard count, the copy of a
// member just written to shard i that is pending in its shard by the old
// count. Its error is the caller's: a copy left there would be dispatched
// at its old due time if that is sooner than the move's horizon.
func (p *Producer) removeOld(ctx context.Context, l Layout, member []byte, i int) error {
	if l.Changing() {
		if j := Index(member, l.From); j != i {
			if err := p.rdb.ZRem(ctx, p.keys.Pending(j), member).Err(); err != nil {
				return fmt.Errorf("remove the copy by the old shard count from %s (run it again): %w", p.keys.Pending(j), err)
			}
		}
	}
	return nil
}

// rescheduleScript moves a pending member to a new due time, and only if
// it is still pending, so that a task already dispatched is not scheduled
// again by accident. It unlists the member from the shard's moving hash,
// as scheduleScript does.
//
// KEYS[1] pending shard, KEYS[2] its moving hash
// ARGV[1] new due time (ms)
// ARGV[2] member
// Returns 1 if moved, 0 if the member was not pending.
var rescheduleScript = redis.NewScript(`
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
  return 1
end
return 0
`)

// Reschedule moves a pending task to a new due time. It returns
// ErrNotPending if the task is no longer pending.
//
// While the queue's shard count changes, a task still pending in its shard
// by the old count is moved to its shard by the new one.
func (p *Producer) Reschedule(ctx context.Context, member []byte, due time.Time) error {
	return p.settled(ctx, func(l Layout) error { return p.rescheduleBy(ctx, l, member, due) })
}

// rescheduleBy is Reschedule by layout l.
func (p *Producer) rescheduleBy(ctx context.Context, l Layout, member []byte, due time.Time) error {
	for _, i := range l.Indexes(member) {
		key := p.keys.Pending(i)
		n, err := rescheduleScript.Run(ctx, p.rdb, []string{key, p.keys.Moving(i)}, strconv.FormatInt(DueMs(due), 10), member).Int()
		if err != nil {
			return fmt.Errorf("reschedule on %s: %w", key, err)
		}
		if n == 0 {
			continue
		}
		if i != Index(member, l.Shards) {
			return p.scheduleBy(ctx, l, member, due) // to the new count's shard, then out of this one
		}
		return nil
	}
	return ErrNotPending
}

// Cancel removes a pending task. It reports whether the task was pending
// and is now removed; false means there was no such pending scheduling,
// e.g. because a dispatcher already claimed it. Dispatchers claim a task
// up to DISPATCHER_LOOKAHEAD (100 ms by default) before its due time, so a
// task that close to being due can no longer be cancelled. A claimed scheduling
// cannot be cancelled: it is delivered at least once, and may already be
// in the broker (a confirmed publish whose removal from Redis has not
// happened yet is sent again). Consumers that must honour a cancel after
// the claim check it themselves when the task arrives.
//
// While the queue's shard count changes, the task is removed from its
// shards by both counts.
//
// Its properties (a recurring occurrence's, say) go with it, in the same
// MULTI: left behind, a later task with the same member would carry them.
func (p *Producer) Cancel(ctx context.Context, member []byte) (bool, error) {
	removed := false
	err := p.settled(ctx, func(l Layout) error {
		for _, i := range l.Indexes(member) {
			key := p.keys.Pending(i)
			var n *redis.IntCmd
			_, err := p.rdb.TxPipelined(ctx, func(tx redis.Pipeliner) error {
				n = tx.ZRem(ctx, key, member)
				tx.HDel(ctx, p.keys.Props(i), string(member))
				return nil
			})
			if err != nil {
				return fmt.Errorf("cancel on %s: %w", key, err)
			}
			removed = removed || n.Val() > 0
		}
		return nil
	})
	// removed also with an error: a task removed before a failed layout
	// re-check is cancelled, and running Cancel again would say false.
	return removed, err
}
