package shard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// IDTask is one scheduling of a task with an id (CONTRACT.md, "Tasks with
// an id and properties"): the id is the pending member, the body and the
// properties are kept beside it in the id's shard, so a task is cancelled
// or rescheduled by its id whatever its body, and two tasks may have the
// same body.
//
// It is a type of its own rather than optional fields of Task: a Task's
// Member is its body, an IDTask's member is its id, and a batch mixing the
// two would make that depend on which fields are set.
type IDTask struct {
	ID   []byte // 1 to MaxIDBytes bytes
	Body []byte
	// Props are the message's properties; nil (or zero) sets none, and
	// removes those of an earlier scheduling of the id.
	Props *Properties
	Due   time.Time
}

// shardTx is one MULTI/EXEC on shard i's keys (one hash tag, so one slot
// on Redis Cluster): its commands run in order and atomically.
type shardTx struct {
	i    int
	cmds [][]any
	wake string // a WakeDue message to send once it has run, or ""
	res  []any  // one reply per command (nil for a nil reply), once run
	err  error
}

func (tx *shardTx) add(args ...any) { tx.cmds = append(tx.cmds, args) }

// runTxs runs txs, each atomically, and sends the wake-ups of those that
// succeeded (wake-up errors are ignored, as in Schedule).
//
// On one server (or Sentinel) they go in one pipeline, MULTI ... EXEC per
// shard, the wake-ups after the EXECs: one round trip, and the server runs
// it in order. A PUBLISH is not put inside a MULTI: a producer whose ACL
// forbids it would have its transaction discarded. On Redis Cluster a
// plain pipeline sends MULTI, which has no key, to any node, and go-redis
// runs a TxPipeline on one slot only: each shard gets a TxPipeline of its
// own, sent concurrently, and the wake-ups follow their replies.
func (p *Producer) runTxs(ctx context.Context, txs []*shardTx) {
	p.runTxsThen(ctx, txs, nil)
}

// runTxsThen is runTxs, and then has then add commands to be sent after
// the transactions: on one server in the same pipeline (one round trip,
// run after them); on Redis Cluster in a pipeline of its own once every
// transaction has replied. It reports whether then's commands were sent.
func (p *Producer) runTxsThen(ctx context.Context, txs []*shardTx, then func(redis.Pipeliner)) bool {
	if p.ordered {
		p.runTxsPipelined(ctx, txs, then)
		return then != nil
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, tx := range txs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			pipe := p.rdb.TxPipeline()
			cmds := make([]*redis.Cmd, len(tx.cmds))
			for k, c := range tx.cmds {
				cmds[k] = pipe.Do(ctx, c...)
			}
			_, _ = pipe.Exec(ctx)
			tx.res = make([]any, len(cmds))
			for k, c := range cmds {
				v, err := c.Result()
				switch {
				case errors.Is(err, redis.Nil):
				case err != nil:
					if tx.err == nil {
						tx.err = err
					}
				default:
					tx.res[k] = v
				}
			}
		}()
	}
	wg.Wait()
	var wakes redis.Pipeliner
	for _, tx := range txs {
		if tx.err == nil && tx.wake != "" {
			if wakes == nil {
				wakes = p.rdb.Pipeline()
			}
			wakes.Publish(ctx, p.keys.Wake(), tx.wake)
		}
	}
	if wakes != nil {
		_, _ = wakes.Exec(ctx)
	}
	return false
}

// runTxsPipelined is runTxs on one server: see there.
func (p *Producer) runTxsPipelined(ctx context.Context, txs []*shardTx, then func(redis.Pipeliner)) {
	pipe := p.rdb.Pipeline()
	queued := make([][]*redis.Cmd, len(txs))
	execs := make([]*redis.Cmd, len(txs))
	for n, tx := range txs {
		pipe.Do(ctx, "multi")
		for _, c := range tx.cmds {
			queued[n] = append(queued[n], pipe.Do(ctx, c...))
		}
		execs[n] = pipe.Do(ctx, "exec")
	}
	for _, tx := range txs {
		if tx.wake != "" {
			pipe.Publish(ctx, p.keys.Wake(), tx.wake)
		}
	}
	if then != nil {
		then(pipe)
	}
	_, _ = pipe.Exec(ctx)
	for n, tx := range txs {
		v, err := execs[n].Result()
		if err != nil {
			// A command refused when queued (EXECABORT) says why better.
			for _, q := range queued[n] {
				if qe := q.Err(); qe != nil && !errors.Is(qe, redis.Nil) {
					err = qe
					break
				}
			}
			tx.err = err
			continue
		}
		arr, ok := v.([]any)
		if !ok || len(arr) != len(tx.cmds) {
			tx.err = fmt.Errorf("EXEC replied %v for %d commands", v, len(tx.cmds))
			continue
		}
		for _, r := range arr {
			if e, ok := r.(error); ok {
				tx.err = e
				break
			}
		}
		tx.res = arr
	}
}

// validIDTasks checks every task before anything is written, and returns
// the properties' JSON of each (nil: none).
func validIDTasks(tasks []IDTask) ([][]byte, error) {
	props := make([][]byte, len(tasks))
	for n, t := range tasks {
		what := "task"
		if len(tasks) > 1 {
			what = fmt.Sprintf("task %d of %d", n+1, len(tasks))
		}
		if err := ValidID(t.ID); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if t.Props == nil || t.Props.IsZero() {
			continue
		}
		b, err := t.Props.Marshal()
		if err != nil {
			return nil, fmt.Errorf("%s, id %.80q: %w", what, t.ID, err)
		}
		props[n] = b
	}
	return props, nil
}

// ScheduleID schedules a task with an id: in the id's shard, in one
// MULTI/EXEC, its body, its properties (or none) and its due time.
// Scheduling an id that is pending replaces its body, properties and due
// time. The id and the properties are checked before anything is
// written. A task due soon wakes the dispatchers, as Schedule does.
//
// During a change of the shard count it works as Schedule does: the task
// goes to its shard by the new count, unlisted from that shard's moving
// hash in the same MULTI, and is then removed (member, body, properties)
// from its shard by the old count if that differs.
func (p *Producer) ScheduleID(ctx context.Context, t IDTask) error {
	return p.ScheduleIDs(ctx, []IDTask{t})
}

// ScheduleIDs is ScheduleID for many tasks: one MULTI/EXEC per shard, all
// in one round trip on one server (see runTxs). Every task is checked
// before anything is written. If a shard's MULTI fails, the other
// shards' tasks are still scheduled, and the error names the shard's key.
// An id given twice is scheduled as the later of the two.
func (p *Producer) ScheduleIDs(ctx context.Context, tasks []IDTask) error {
	return p.ScheduleIDsThen(ctx, tasks, nil)
}

// ScheduleIDsThen is ScheduleIDs, and then sends the commands then adds
// to the pipeline it is given, after the tasks are written: on one Redis
// (or Sentinel) in the write's own round trip, which the server runs after
// the write; on Redis Cluster in a pipeline of its own once the write has
// replied. Their replies are read from the commands then made, after
// ScheduleIDsThen returns, whatever it returns. then may be called more
// than once (the write is made again when the shard layout changed
// meanwhile): the commands of its last call hold the replies. It is not
// called when the tasks are refused before anything is written.
func (p *Producer) ScheduleIDsThen(ctx context.Context, tasks []IDTask, then func(redis.Pipeliner)) error {
	if len(tasks) == 0 {
		return nil
	}
	props, err := validIDTasks(tasks)
	if err != nil {
		return fmt.Errorf("queue %s: %w (nothing scheduled)", p.keys.Queue, err)
	}
	return p.settled(ctx, func(l Layout) error { return p.scheduleIDsBy(ctx, l, tasks, props, then) })
}

// scheduleIDsBy is ScheduleIDsThen by layout l.
func (p *Producer) scheduleIDsBy(ctx context.Context, l Layout, tasks []IDTask, props [][]byte, then func(redis.Pipeliner)) error {
	byShard := map[int]*shardTx{}
	earliest := map[int]int64{}
	var txs []*shardTx
	for n, t := range tasks {
		i := Index(t.ID, l.Shards)
		tx := byShard[i]
		if tx == nil {
			tx = &shardTx{i: i}
			byShard[i] = tx
			txs = append(txs, tx)
		}
		due := DueMs(t.Due)
		tx.add("hset", p.keys.Tasks(i), t.ID, t.Body)
		if props[n] != nil {
			tx.add("hset", p.keys.Props(i), t.ID, props[n])
		} else {
			tx.add("hdel", p.keys.Props(i), t.ID)
		}
		tx.add("zadd", p.keys.Pending(i), strconv.FormatInt(due, 10), t.ID)
		if moves(l) {
			// As scheduleScript: a move under way never undoes this write.
			tx.add("hdel", p.keys.Moving(i), t.ID)
		}
		if e, ok := earliest[i]; !ok || due < e {
			earliest[i] = due
		}
	}
	for _, tx := range txs {
		if p.wakeSoon(earliest[tx.i]) {
			tx.wake = WakeDue(tx.i, earliest[tx.i])
		}
	}
	sent := p.runTxsThen(ctx, txs, then)
	if then != nil && !sent {
		defer func() {
			pipe := p.rdb.Pipeline()
			then(pipe)
			_, _ = pipe.Exec(ctx)
		}()
	}
	var firstErr error
	for _, tx := range txs {
		if tx.err != nil && firstErr == nil {
			firstErr = fmt.Errorf("schedule %d tasks with an id on queue %s: on %s: %w",
				len(tasks), p.keys.Queue, p.keys.Pending(tx.i), tx.err)
		}
	}
	// During a change: the copies by the old count of the tasks written,
	// by their old shard; after the writes' replies, so that a task is
	// never in neither shard, and only of those written.
	old := map[int]*shardTx{}
	var rm []*shardTx
	for _, t := range tasks {
		if !l.Changing() {
			break
		}
		i, j := Index(t.ID, l.Shards), Index(t.ID, l.From)
		if j == i || byShard[i].err != nil {
			continue
		}
		o := old[j]
		if o == nil {
			o = &shardTx{i: j}
			old[j] = o
			rm = append(rm, o)
		}
		p.removeIDCmds(o, t.ID)
	}
	if len(rm) > 0 {
		p.runTxs(ctx, rm)
		for _, o := range rm {
			if o.err != nil && firstErr == nil {
				firstErr = fmt.Errorf("schedule %d tasks with an id on queue %s: remove their copies by the old shard count %d from %s: %w (run it again: a copy left there is dispatched at its old due time)",
					len(tasks), p.keys.Queue, l.From, p.keys.Pending(o.i), o.err)
			}
		}
	}
	return firstErr
}

// removeIDCmds adds to tx (on shard tx.i) the removal of a task by id:
// member, body and properties.
func (p *Producer) removeIDCmds(tx *shardTx, id []byte) {
	tx.add("zrem", p.keys.Pending(tx.i), id)
	tx.add("hdel", p.keys.Tasks(tx.i), id)
	tx.add("hdel", p.keys.Props(tx.i), id)
}

// CancelID removes a pending task by its id, with its body and
// properties, in one MULTI/EXEC. It reports whether the task was pending
// and is now removed; false: never scheduled, cancelled already, or
// claimed by a dispatcher (see Cancel: a claimed task is delivered).
//
// While the queue's shard count changes, the task is removed from its
// shards by both counts.
func (p *Producer) CancelID(ctx context.Context, id []byte) (bool, error) {
	if err := ValidID(id); err != nil {
		return false, fmt.Errorf("cancel on queue %s: %w", p.keys.Queue, err)
	}
	removed := false
	err := p.settled(ctx, func(l Layout) error {
		var txs []*shardTx
		for _, i := range l.Indexes(id) {
			tx := &shardTx{i: i}
			p.removeIDCmds(tx, id)
			txs = append(txs, tx)
		}
		p.runTxs(ctx, txs)
		var firstErr error
		for _, tx := range txs {
			if tx.err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("cancel on %s: %w", p.keys.Pending(tx.i), tx.err)
				}
				continue
			}
			if n, _ := tx.res[0].(int64); n > 0 {
				removed = true
			}
		}
		return firstErr
	})
	// removed also with an error, as in Cancel.
	return removed, err
}

// RescheduleID moves a pending task, by its id, to a new due time; its
// body and properties stay as they are. moved is false when it was due
// at that time already; the error is ErrNotPending when the id is not
// pending (never scheduled, cancelled, or claimed by a dispatcher). It
// is one MULTI/EXEC: ZSCORE (pending or not), ZADD XX CH (only a pending
// id moves).
//
// While the queue's shard count changes, the task is moved where it is
// pending, in its shard by the new count or the old one: its body and
// properties are in the same shard, and a move (reshard) takes them along.
// A task moved to be due soon wakes the dispatchers.
func (p *Producer) RescheduleID(ctx context.Context, id []byte, due time.Time) (moved bool, err error) {
	if err := ValidID(id); err != nil {
		return false, fmt.Errorf("reschedule on queue %s: %w", p.keys.Queue, err)
	}
	dueMs := DueMs(due)
	err = p.settled(ctx, func(l Layout) error {
		for _, i := range l.Indexes(id) {
			tx := &shardTx{i: i}
			tx.add("zscore", p.keys.Pending(i), id)
			tx.add("zadd", p.keys.Pending(i), "xx", "ch", strconv.FormatInt(dueMs, 10), id)
			if moves(l) {
				tx.add("hdel", p.keys.Moving(i), id)
			}
			p.runTxs(ctx, []*shardTx{tx})
			if tx.err != nil {
				return fmt.Errorf("reschedule on %s: %w", p.keys.Pending(i), tx.err)
			}
			if tx.res[0] == nil {
				continue // not pending here
			}
			// Sticky: a run again by a new layout (settled) finds it
			// moved already.
			ch := tx.res[1] == int64(1)
			moved = moved || ch
			if ch && p.wakeSoon(dueMs) {
				_ = p.rdb.Publish(ctx, p.keys.Wake(), WakeDue(i, dueMs)).Err() // ignored, as in Schedule
			}
			return nil
		}
		return ErrNotPending
	})
	return moved, err
}
