package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// errStalled says that no task arrived for the -stall time.
var errStalled = errors.New("stalled")

// runner runs the points of one bench and keeps their results.
type runner struct {
	opt    *Options
	rdb    redis.UniversalClient // *redis.ClusterClient on a cluster
	runID  string
	seq    int
	prog   *progress
	stderr io.Writer
	// earlyUs is the lateness below which a delivery is surely early:
	// minus Redis's clock offset to ours, minus half the round trip.
	earlyUs int64
	// stamps: the instances are started with
	// DISPATCHER_STAMP_PUBLISHED=true (the dispatcher knows it).
	stamps   bool
	ceilings map[ceilingKey]*Ceiling
	rep      *Report
	// limiter caps each instance's CPU (-cpu-cap; nil: no cap).
	limiter *cpuLimiter
	// scaleBest is the highest rate that held at the scale point before
	// (0: none), where the next one starts.
	scaleBest int
}

// clientPrefix starts the Redis client name of the bench and of its
// dispatchers; other clients are reported as disturbing the counts.
func (r *runner) clientPrefix() string { return "dispatcher-bench-" + r.runID }

func newRunner(ctx context.Context, opt *Options, stderr io.Writer, rep *Report) (*runner, error) {
	id := make([]byte, 3)
	_, _ = rand.Read(id)
	r := &runner{
		opt: opt, runID: hex.EncodeToString(id), stderr: stderr, rep: rep,
		prog:     &progress{w: stderr, every: time.Second},
		ceilings: map[ceilingKey]*Ceiling{},
	}
	// Any mode redisconn knows: the bench's name and pool size go into
	// the URL, which all three of go-redis's URL parsers read.
	raw, err := withQuery(opt.RedisURL, "client_name", r.clientPrefix()+"-bench", "pool_size", strconv.Itoa(2*loadWorkers))
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", err)
	}
	ropt, err := redisconn.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", redact.Error(err))
	}
	r.rdb = ropt.NewClient()
	if err := r.rdb.Ping(ctx).Err(); err != nil {
		r.rdb.Close()
		return nil, fmt.Errorf("redis %s: %w", redact.URL(opt.RedisURL), redact.Error(err))
	}
	offset, rtt, err := clockOffset(ctx, r.rdb)
	if err != nil {
		r.rdb.Close()
		return nil, err
	}
	r.earlyUs = -offset - rtt/2 - 100
	rep.ClockOffsetUs, rep.ClockRTTUs = offset, rtt
	r.stamps = knowsSetting(ctx, opt.Dispatcher, stampVar)
	rep.DispatcherStamps, rep.Consumer = r.stamps, opt.consumerText()
	rep.Machine = machineInfo(ctx, r.rdb, ropt.Mode, opt.AMQPURL)
	rep.RunID = r.runID
	if opt.CPUCap > 0 {
		if r.limiter, err = newCPULimiter(cgroupBase, opt.CPUCap, time.Duration(opt.CPUPeriod), os.Geteuid()); err != nil {
			r.rdb.Close()
			return nil, err
		}
		c := r.limiter.cap
		rep.CPUCap = &c
	}
	return r, nil
}

// close removes what is left: cgroups of instances that could not be
// stopped, say.
func (r *runner) close() {
	r.rdb.Close()
	if r.limiter != nil {
		if err := r.limiter.removeAll(); err != nil {
			r.warnf("%v", err)
		}
	}
}

// name returns a name unique to this run for a point's key prefix,
// exchange and queue.
func (r *runner) name(what string) string {
	r.seq++
	return fmt.Sprintf("dispatcher-bench-%s-%d-%s", r.runID, r.seq, what)
}

func (r *runner) warnf(format string, args ...any) {
	r.prog.printf("bench: warning: "+format+"\n", args...)
}

// waitFor waits until done, or until activity has not changed for the
// stall time (errStalled), or ctx ends.
func (r *runner) waitFor(ctx context.Context, done func() bool, activity func() int64) error {
	last, since := activity(), time.Now()
	for !done() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if a := activity(); a != last {
			last, since = a, time.Now()
		} else if time.Since(since) > time.Duration(r.opt.Stall) {
			return errStalled
		}
	}
	return nil
}

func received(rec *recorder) func() int64 {
	return func() int64 { return rec.unique.Load() + rec.dups.Load() + rec.unexpected.Load() }
}

// cleanKeys removes every key of a point: the ones the dispatcher is
// known to use for each of its queues (of m shards each), then whatever
// else is under the prefix. UNLINK frees big sets in the background. It
// runs after the run's context may have ended. On a cluster, keys of
// different hash slots cannot share an UNLINK, and SCAN sees one node's
// keys only.
func (r *runner) cleanKeys(prefix string, queues []string, m int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The known keys: one UNLINK per hash tag ({Q} for the queue's own,
	// {Q:i} for shard i's), pipelined; a cluster client splits the
	// pipeline by node.
	pipe := r.rdb.Pipeline()
	var err error
	for _, q := range queues {
		if err != nil {
			break
		}
		keys := shard.Keys{Prefix: prefix, Queue: q}
		pipe.Unlink(ctx, keys.Counter(), keys.ShardCount(), keys.Sweeper(), keys.Wake())
		for i := 0; i < m && err == nil; i++ {
			pipe.Unlink(ctx, keys.Pending(i), keys.Inflight(i), keys.Attempts(i), keys.Retrying(i), keys.Dead(i), keys.DeadReason(i), keys.LastClaim(i),
				keys.Tasks(i), keys.Props(i), keys.ClaimedBody(i), keys.ClaimedProps(i))
			if pipe.Len() >= 100 {
				_, err = pipe.Exec(ctx)
			}
		}
	}
	if err == nil && pipe.Len() > 0 {
		_, err = pipe.Exec(ctx)
	}
	// Whatever else: SCAN on every primary, one UNLINK per key found
	// (pipelined), on the node that holds it.
	if err == nil {
		err = redisconn.ForEachPrimary(ctx, r.rdb, func(ctx context.Context, addr string, c *redis.Client) error {
			pipe := c.Pipeline()
			iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			for iter.Next(ctx) {
				pipe.Unlink(ctx, iter.Val())
				if pipe.Len() >= 500 {
					if _, err := pipe.Exec(ctx); err != nil {
						return fmt.Errorf("%s: %w", addr, err)
					}
				}
			}
			if err := iter.Err(); err != nil {
				return fmt.Errorf("%s: %w", addr, err)
			}
			if pipe.Len() > 0 {
				if _, err := pipe.Exec(ctx); err != nil {
					return fmt.Errorf("%s: %w", addr, err)
				}
			}
			return nil
		})
	}
	if err != nil {
		r.warnf("removing keys under %s: %v", prefix, err)
	}
}

// shardPrimaries returns the address of the primary (as readCmdStats
// names it in snap) that holds each of the m shards: on one server, or
// with Sentinel, that server.
func (r *runner) shardPrimaries(ctx context.Context, keys shard.Keys, m int, snap redisSnap) []string {
	var only string
	if len(snap) == 1 {
		for addr := range snap {
			only = addr
		}
	}
	out := make([]string, m)
	for i := range out {
		if out[i] = redisconn.NodeOf(ctx, r.rdb, keys.Pending(i)); out[i] == "" {
			out[i] = only
		}
	}
	return out
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}

// fleetUse reads the instances' CPU and memory into res.
func fleetUse(f fleet, cpu0 []float64, res *Result) error {
	cpu, hwm, err := f.usage()
	if err != nil {
		return err
	}
	for i := range cpu {
		if cpu0 != nil {
			cpu[i] -= cpu0[i]
		}
		res.CPUSeconds += cpu[i]
		res.CPUSecondsEach = append(res.CPUSecondsEach, cpu[i])
		res.RSSMB = append(res.RSSMB, float64(hwm[i])/(1<<20))
		res.PeakRSSMB = max(res.PeakRSSMB, float64(hwm[i])/(1<<20))
	}
	return nil
}

// settle waits until the instances have counted as dispatched (confirmed
// and removed from Redis) every task the consumer got, so that Redis's
// counts cover each task's whole path.
func settle(ctx context.Context, f fleet, want int64) (float64, error) {
	deadline := time.Now().Add(15 * time.Second)
	for {
		n, err := f.sum("dispatcher_tasks_dispatched_total")
		if err != nil || n >= float64(want) || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// claimBatchMean is the mean number of tasks per claim that took any.
func claimBatchMean(f fleet) float64 {
	sum, err1 := f.sum("dispatcher_claim_batch_size_sum")
	n, err2 := f.sum("dispatcher_claim_batch_size_count")
	if err1 != nil || err2 != nil || n == 0 {
		return 0
	}
	return sum / n
}
