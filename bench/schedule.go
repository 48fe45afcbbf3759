package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// Tasks with an id (-ids) are scheduled as the contract says a producer
// schedules them: per shard, MULTI, HSET P:{Q:i}:tasks <id> <body> ...,
// with -props HSET P:{Q:i}:props <id> <json> ..., ZADD P:{Q:i} <due> <id>
// ..., EXEC. Like the plain ZADDs, one transaction carries all the tasks a
// write has for that shard.

// shardWrite is what one write puts in one shard.
type shardWrite struct {
	zadd  []any // "zadd", pending key, score, member, ...
	hset  []any // "hset", tasks key, id, body, ...; nil for plain members
	props []any // "hset", props key, id, JSON, ...; nil without -props
	tasks int
	bytes int // bodies' and properties' bytes
}

// taskForm says how a point's tasks are scheduled.
type taskForm struct {
	ids, props bool
	// buffers reused from task to task
	idBuf, bodyBuf, propsBuf []byte
}

func formOf(p Point) *taskForm { return &taskForm{ids: p.IDs, props: p.IDs && p.Props} }

// add puts task i of size bytes, due at due, into the write of its shard
// s of keys (of m shards), by[base+s], and returns s and the bytes the
// task added to the write.
func (f *taskForm) add(by map[int]*shardWrite, keys shard.Keys, base, m, i, size int, due int64) (s, added int) {
	f.bodyBuf = member(f.bodyBuf, i, size)
	if !f.ids {
		s = shard.Index(f.bodyBuf, m)
		w := writeOf(by, base+s)
		if w.zadd == nil {
			w.zadd = []any{"zadd", keys.Pending(s)}
		}
		w.zadd = append(w.zadd, due, string(f.bodyBuf))
		w.tasks++
		w.bytes += size
		return s, size
	}
	f.idBuf = taskID(f.idBuf, i)
	id := string(f.idBuf)
	s = shard.Index(f.idBuf, m)
	w := writeOf(by, base+s)
	if w.zadd == nil {
		w.zadd = []any{"zadd", keys.Pending(s)}
		w.hset = []any{"hset", keys.Tasks(s)}
		if f.props {
			w.props = []any{"hset", keys.Props(s)}
		}
	}
	w.zadd = append(w.zadd, due, id)
	w.hset = append(w.hset, id, string(f.bodyBuf))
	added = size + len(id)
	if f.props {
		f.propsBuf = taskProps(f.propsBuf, i)
		w.props = append(w.props, id, string(f.propsBuf))
		added += len(f.propsBuf)
	}
	w.bytes += added
	w.tasks++
	return s, added
}

func writeOf(by map[int]*shardWrite, s int) *shardWrite {
	w := by[s]
	if w == nil {
		w = &shardWrite{}
		by[s] = w
	}
	return w
}

// commands are the commands a write costs Redis, as INFO commandstats
// names them: the bench's own, taken out of the dispatchers' counts.
func (w *shardWrite) commands(c cmdStats) {
	c["zadd"]++
	if w.hset != nil {
		c["multi"]++
		c["exec"]++
		c["hset"]++
		if w.props != nil {
			c["hset"]++
		}
	}
}

// writeShards sends the writes: on one server in one pipeline, each write
// with ids wrapped in MULTI and EXEC. A cluster client splits a pipeline
// by node, but would send a MULTI (no key) to any node, and its
// TxPipeline refuses a transaction across slots: there the plain ZADDs go
// in one pipeline and each write with ids is a TxPipeline of its own, all
// at once.
func writeShards(ctx context.Context, rdb redis.UniversalClient, ws []*shardWrite) error {
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		return writeCluster(ctx, rdb, ws)
	}
	pipe := rdb.Pipeline()
	var execs []*redis.Cmd
	for _, w := range ws {
		if w.hset == nil {
			pipe.Do(ctx, w.zadd...)
			continue
		}
		pipe.Do(ctx, "multi")
		pipe.Do(ctx, w.hset...)
		if w.props != nil {
			pipe.Do(ctx, w.props...)
		}
		pipe.Do(ctx, w.zadd...)
		execs = append(execs, pipe.Do(ctx, "exec"))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	// A command that fails inside EXEC leaves its error in EXEC's reply.
	for _, e := range execs {
		replies, err := e.Slice()
		if err != nil {
			return err
		}
		for _, r := range replies {
			if err, ok := r.(error); ok {
				return fmt.Errorf("in MULTI/EXEC: %w", err)
			}
		}
	}
	return nil
}

func writeCluster(ctx context.Context, rdb redis.UniversalClient, ws []*shardWrite) error {
	pipe := rdb.Pipeline()
	var txs []*shardWrite
	for _, w := range ws {
		if w.hset == nil {
			pipe.Do(ctx, w.zadd...)
		} else {
			txs = append(txs, w)
		}
	}
	errs := make([]error, len(txs)+1)
	var wg sync.WaitGroup
	for n, w := range txs {
		wg.Go(func() {
			tx := rdb.TxPipeline()
			tx.Do(ctx, w.hset...)
			if w.props != nil {
				tx.Do(ctx, w.props...)
			}
			tx.Do(ctx, w.zadd...)
			_, errs[n] = tx.Exec(ctx)
		})
	}
	if pipe.Len() > 0 {
		_, errs[len(txs)] = pipe.Exec(ctx)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// zaddsOnly is a count of ZADDs by shard as commands by shard.
func zaddsOnly(zadds []int64) []cmdStats {
	out := make([]cmdStats, len(zadds))
	for s, n := range zadds {
		out[s] = cmdStats{"zadd": n}
	}
	return out
}
