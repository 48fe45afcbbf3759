package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/shard"
)

// errStalled says that no task arrived for the -stall time.
var errStalled = errors.New("stalled")

// runner runs the points of one bench and keeps their results.
type runner struct {
	opt    *Options
	rdb    *redis.Client
	runID  string
	seq    int
	prog   *progress
	stderr io.Writer
	// earlyUs is the lateness below which a delivery is surely early:
	// minus Redis's clock offset to ours, minus half the round trip.
	earlyUs  int64
	ceilings map[int]*Ceiling // by message size
	rep      *Report
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
		ceilings: map[int]*Ceiling{},
	}
	ropt, err := redis.ParseURL(opt.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("-redis: %w", redact.Error(err))
	}
	ropt.ClientName = r.clientPrefix() + "-bench"
	ropt.PoolSize = 2 * loadWorkers
	r.rdb = redis.NewClient(ropt)
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
	rep.Machine = machineInfo(ctx, r.rdb, opt.AMQPURL)
	rep.RunID = r.runID
	return r, nil
}

func (r *runner) close() { r.rdb.Close() }

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
// known to use, then whatever else is under the prefix. UNLINK frees big
// sets in the background. It runs after the run's context may have ended.
func (r *runner) cleanKeys(keys shard.Keys, m int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := []string{keys.Counter(), keys.ShardCount()}
	flush := func() error {
		if len(names) == 0 {
			return nil
		}
		err := r.rdb.Unlink(ctx, names...).Err()
		names = names[:0]
		return err
	}
	var err error
	for i := 0; i < m && err == nil; i++ {
		names = append(names, keys.Pending(i), keys.Inflight(i), keys.Attempts(i), keys.Dead(i), keys.DeadReason(i), keys.LastClaim(i))
		if len(names) >= 500 {
			err = flush()
		}
	}
	if err == nil {
		err = flush()
	}
	iter := r.rdb.Scan(ctx, 0, keys.Prefix+":*", 1000).Iterator()
	for err == nil && iter.Next(ctx) {
		names = append(names, iter.Val())
		if len(names) >= 500 {
			err = flush()
		}
	}
	if err == nil {
		err = errors.Join(iter.Err(), flush())
	}
	if err != nil {
		r.warnf("removing keys under %s: %v", keys.Prefix, err)
	}
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
