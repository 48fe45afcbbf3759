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
// task i due at dueMs(i), each in its shard by the contract's hashing.
// loaded counts the tasks written so far.
func load(ctx context.Context, rdb redis.UniversalClient, keys shard.Keys, m, size, from, to int,
	dueMs func(i int) int64, loaded *atomic.Int64) error {
	chunks := make(chan int)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make([]error, loadWorkers)
	var wg sync.WaitGroup
	for w := range loadWorkers {
		wg.Go(func() {
			l := &loader{rdb: rdb, keys: keys, m: m, pairs: pairsPerZADD(size), buf: make([][]any, m), pipe: rdb.Pipeline(), loaded: loaded}
			for start := range chunks {
				for i := start; i < min(start+loadChunk, to); i++ {
					if err := l.add(ctx, i, size, dueMs(i)); err != nil {
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

// loader is one loading connection's state: per shard, the ZADD being
// filled.
type loader struct {
	rdb      redis.UniversalClient
	keys     shard.Keys
	m        int
	pairs    int     // score/member pairs per ZADD
	buf      [][]any // per shard: "zadd", key, score, member, ...
	buffered int     // member bytes in buf
	pipe     redis.Pipeliner
	queued   int // tasks in queued pipeline commands
	loaded   *atomic.Int64
	member   []byte
}

func (l *loader) add(ctx context.Context, i, size int, due int64) error {
	l.member = member(l.member, i, size)
	s := shard.Index(l.member, l.m)
	if l.buf[s] == nil {
		l.buf[s] = make([]any, 0, 2+2*l.pairs)
		l.buf[s] = append(l.buf[s], "zadd", l.keys.Pending(s))
	}
	l.buf[s] = append(l.buf[s], due, string(l.member))
	l.buffered += size
	if len(l.buf[s]) >= 2+2*l.pairs {
		if err := l.queue(ctx, s); err != nil {
			return err
		}
	}
	if l.buffered >= maxBuffered {
		return l.flushAll(ctx)
	}
	return nil
}

// queue moves shard s's ZADD into the pipeline, running it when full.
func (l *loader) queue(ctx context.Context, s int) error {
	n := (len(l.buf[s]) - 2) / 2
	l.pipe.Do(ctx, l.buf[s]...)
	for i := 3; i < len(l.buf[s]); i += 2 {
		l.buffered -= len(l.buf[s][i].(string))
	}
	l.buf[s] = nil
	l.queued += n
	if l.pipe.Len() >= pipeCmds {
		return l.exec(ctx)
	}
	return nil
}

func (l *loader) exec(ctx context.Context) error {
	if l.pipe.Len() == 0 {
		return nil
	}
	if _, err := l.pipe.Exec(ctx); err != nil {
		return fmt.Errorf("load tasks: %w", err)
	}
	l.loaded.Add(int64(l.queued))
	l.queued = 0
	return nil
}

func (l *loader) flushAll(ctx context.Context) error {
	for s := range l.buf {
		if l.buf[s] != nil {
			if err := l.queue(ctx, s); err != nil {
				return err
			}
		}
	}
	return l.exec(ctx)
}

// produce schedules rate tasks a second for d, from task 0 on, each with
// a plain ZADD (no notification unless wake) about ahead before its due
// time: task j is due at start + ahead + j/rate, on queue j mod len(queues) (the
// rate spread evenly over the queues), in its shard of that queue. It
// returns how many ZADD commands it sent to each shard, indexed q*m+i for
// shard i of queue q, to be taken out of Redis's counts (on a cluster,
// out of those of the shard's primary).
func produce(ctx context.Context, rdb redis.UniversalClient, queues []shard.Keys, m, size, rate int,
	d time.Duration, start time.Time, scheduled *atomic.Int64, aheadD time.Duration, wake bool) (zadds []int64, err error) {
	ahead := aheadD.Milliseconds()
	total := int(int64(rate) * d.Milliseconds() / 1000)
	startMs := start.UnixMilli()
	due := func(j int) int64 { return startMs + ahead + int64(j)*1000/int64(rate) }
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	nq := len(queues)
	zadds = make([]int64, nq*m)
	var mem []byte
	byShard := map[int][]any{} // by q*m+i
	for j := 0; j < total; {
		horizon := time.Now().UnixMilli() + ahead
		for ; j < total && due(j) <= horizon; j++ {
			mem = member(mem, j, size)
			s := (j%nq)*m + shard.Index(mem, m)
			byShard[s] = append(byShard[s], due(j), string(mem))
		}
		if len(byShard) > 0 {
			// A cluster client splits the pipeline by node.
			pipe := rdb.Pipeline()
			wakes := rdb.Pipeline()
			for s, pairs := range byShard {
				pipe.Do(ctx, append([]any{"zadd", queues[s/m].Pending(s % m)}, pairs...)...)
				if wake { // pairs are in due order: the first is the earliest
					wakes.Publish(ctx, queues[s/m].Wake(), shard.WakeDue(s%m, pairs[0].(int64)))
				}
				zadds[s]++
				delete(byShard, s)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return zadds, fmt.Errorf("schedule tasks: %w", err)
			}
			// After the ZADDs' answers, as the Go producer does on a cluster.
			if wake {
				if _, err := wakes.Exec(ctx); err != nil {
					return zadds, fmt.Errorf("wake the dispatchers: %w", err)
				}
			}
			scheduled.Store(int64(j))
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return zadds, ctx.Err()
		}
	}
	return zadds, nil
}
