package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// Loading sizes: ZADD with up to zaddPairs score/member pairs per command
// (fewer for big members), pipelines of up to pipeCmds commands, from
// loadWorkers connections at once so that building commands here overlaps
// Redis executing them.
const (
	zaddPairs   = 1000
	zaddBytes   = 4 << 20 // most member bytes in one ZADD
	pipeCmds    = 16
	loadWorkers = 4
	loadChunk   = 20000    // task indexes a worker takes at a time
	maxBuffered = 64 << 20 // member bytes a worker holds before it flushes all shards
)

// pairsPerZADD is how many members of size bytes go into one ZADD.
func pairsPerZADD(size int) int { return min(zaddPairs, max(1, zaddBytes/size)) }

// load schedules tasks from..to-1 of size bytes on the queue's m shards,
// task i due at dueMs(i), each in its shard by the contract's hashing, in
// the point's form (plain members, or ids: see taskForm). loaded counts
// the tasks written so far.
func load(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, p Point, from, to int,
	dueMs func(i int) int64, loaded *atomic.Int64) error {
	chunks := make(chan int)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, loadWorkers)
	var wg sync.WaitGroup
	for w := range loadWorkers {
		wg.Go(func() {
			l := &loader{rdb: rdb, keys: keys, m: p.Shards, pairs: pairsPerZADD(p.Size), form: formOf(p),
				by: map[int]*shardWrite{}, loaded: loaded}
			for start := range chunks {
				for i := start; i < min(start+loadChunk, to); i++ {
					if err := l.add(ctx, i, p.Size, dueMs(i)); err != nil {
						errs[w] = err
						cancel()
						return
					}
				}
			}
			if err := l.flushAll(ctx); err != nil {
				errs[w] = err
				cancel()
			}
		})
	}
feed:
	for start := from; start < to; start += loadChunk {
		select {
		case chunks <- start:
		case <-ctx.Done():
			break feed
		}
	}
	close(chunks)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// loader is one loading connection's state: per shard, the write being
// filled.
type loader struct {
	rdb      redis.UniversalClient
	keys     shard.Keys
	m        int
	pairs    int // tasks per write
	form     *taskForm
	by       map[int]*shardWrite // by shard: the write being filled
	buffered int                 // bytes in by
	queued   []*shardWrite       // full writes, sent pipeCmds at a time
	loaded   *atomic.Int64
}

func (l *loader) add(ctx context.Context, i, size int, due int64) error {
	s, added := l.form.add(l.by, l.keys, 0, l.m, i, size, due)
	l.buffered += added
	if l.by[s].tasks >= l.pairs {
		if err := l.queue(ctx, s); err != nil {
			return err
		}
	}
	if l.buffered >= maxBuffered {
		return l.flushAll(ctx)
	}
	return nil
}

// queue moves shard s's write to the queued ones, sending them when there
// are enough.
func (l *loader) queue(ctx context.Context, s int) error {
	w := l.by[s]
	delete(l.by, s)
	l.buffered -= w.bytes
	l.queued = append(l.queued, w)
	if len(l.queued) >= pipeCmds {
		return l.exec(ctx)
	}
	return nil
}

func (l *loader) exec(ctx context.Context) error {
	if len(l.queued) == 0 {
		return nil
	}
	if err := writeShards(ctx, l.rdb, l.queued); err != nil {
		return fmt.Errorf("load tasks: %w", err)
	}
	n := 0
	for _, w := range l.queued {
		n += w.tasks
	}
	l.loaded.Add(int64(n))
	l.queued = l.queued[:0]
	return nil
}

func (l *loader) flushAll(ctx context.Context) error {
	for s := range l.by {
		if err := l.queue(ctx, s); err != nil {
			return err
		}
	}
	return l.exec(ctx)
}

// produce schedules rate tasks a second for d, from task 0 on, in the
// point's form: plain members with a plain ZADD, or ids (see taskForm);
// no notification unless wake; each about ahead before its due
// time: task j is due at start + ahead + j/rate, on queue j mod len(queues) (the
// rate spread evenly over the queues), in its shard of that queue. It
// returns the commands it sent to each shard, indexed q*m+i for
// shard i of queue q, to be taken out of Redis's counts (on a cluster,
// out of those of the shard's primary).
func produce(ctx context.Context, rdb redis.UniversalClient, queues []shard.Keys, p Point,
	d time.Duration, start time.Time, scheduled *atomic.Int64, aheadD time.Duration, wake bool) (own []cmdStats, err error) {
	m, rate := p.Shards, p.Rate
	ahead := aheadD.Milliseconds()
	total := int(int64(rate) * d.Milliseconds() / 1000)
	startMs := start.UnixMilli()
	due := func(j int) int64 { return startMs + ahead + int64(j)*1000/int64(rate) }
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	nq := len(queues)
	own = make([]cmdStats, nq*m)
	for s := range own {
		own[s] = cmdStats{}
	}
	form := formOf(p)
	byShard := map[int]*shardWrite{} // by q*m+i
	var writes []*shardWrite
	for j := 0; j < total; {
		horizon := time.Now().UnixMilli() + ahead
		for ; j < total && due(j) <= horizon; j++ {
			q := j % nq
			form.add(byShard, queues[q], q*m, m, j, p.Size, due(j))
		}
		if len(byShard) > 0 {
			// After the writes' answers, as the Go producer does on a cluster.
			wakes := rdb.Pipeline()
			writes = writes[:0]
			for s, w := range byShard {
				writes = append(writes, w)
				if wake { // in due order: the first is the earliest
					wakes.Publish(ctx, queues[s/m].Wake(), shard.WakeDue(s%m, w.zadd[2].(int64)))
				}
				w.commands(own[s])
				delete(byShard, s)
			}
			if err := writeShards(ctx, rdb, writes); err != nil {
				return own, fmt.Errorf("schedule tasks: %w", err)
			}
			if wake {
				if _, err := wakes.Exec(ctx); err != nil {
					return own, fmt.Errorf("wake the dispatchers: %w", err)
				}
			}
			scheduled.Store(int64(j))
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return own, ctx.Err()
		}
	}
	return own, nil
}
