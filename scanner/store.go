package scanner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// store runs the scripts that move one queue's tasks between its keys
// (see scripts.go for what each does and why).
type store struct {
	rdb         redis.UniversalClient
	keys        shard.Keys
	lease       time.Duration
	ahead       time.Duration // look-ahead of claims
	retryMin    time.Duration
	retryMax    time.Duration
	maxAttempts int
	instance    string // names the instance in its claim tokens
}

// Claim tokens are unique in the process (one counter for all its stores)
// and across processes (a random part): an InstanceID a library user sets,
// the same after a restart, does not make a token of the last run's again.
var (
	tokenSeq   atomic.Uint64
	tokenNonce = strconv.FormatUint(rand.Uint64()>>32, 36)
)

// claimed is what one run of the claim script says of its shard.
type claimed struct {
	now         int64 // server clock, ms
	nowUs       int64 // the same, µs
	nextPending any   // earliest pending score, "" if none
	nextLease   any   // earliest lease deadline, "" if none
	reaped      int   // leases of dead or stalled instances taken over
	paused      bool  // the queue is paused: nothing claimed
	deadline    int64 // the batch's lease deadline (fences fail and release)
	entries     []string
	// bodies and props go with entries: a claimed body or properties
	// (string), or nil (the member is its own body; no properties).
	bodies, props []any
}

// outcome is what became of one in-flight entry's publish: the fail
// script takes those of modes retry, poison and dead (see progress.record
// for the others).
type outcome struct {
	entry  string
	mode   string // retry, poison or dead; or an out* outcome
	reason string
}

// claimBytes is the claim's byte budget: a claim stops taking pending
// tasks once their bodies add up to 1 MiB, so that no claim holds Redis
// much longer than a batch of small tasks does (about a ms for 500 tasks
// of 200 bytes).
const claimBytes = 1 << 20

// claimCmd queues a claim of up to limit tasks of shard i with token on
// pipe (limit 0 only reads when the shard next needs attention), taking
// tasks due up to ahead from now.
// A claim records owner (the instance's liveness id; "": none) as the
// holder of its batch.
func (st *store) claimCmd(ctx context.Context, pipe redis.Pipeliner, i, limit int, token string, ahead time.Duration, owner string) *redis.Cmd {
	return claimScript.EvalSha(ctx, pipe, st.claimKeys(i), limit, st.lease.Milliseconds(), token, ahead.Milliseconds(), claimBytes, owner)
}

// sweepCmd queues a sweep of shards (sweepScript) on pipe; probe: look
// with one EXISTS first.
func (st *store) sweepCmd(ctx context.Context, pipe redis.Pipeliner, shards []int, probe bool) *redis.Cmd {
	keys := make([]string, 0, 2*len(shards))
	for _, i := range shards {
		keys = append(keys, st.keys.Pending(i), st.keys.Inflight(i))
	}
	p := "0"
	if probe {
		p = "1"
	}
	return sweepScript.EvalSha(ctx, pipe, keys, p)
}

// sweptShard is the at-th shard's part of a sweepScript reply, in the
// claim script's form (see claimScript).
func sweptShard(vals []any, at int) ([]any, error) {
	if len(vals) < 3+2*at {
		return nil, fmt.Errorf("sweep: %d values in the reply, none for its shard %d", len(vals), at)
	}
	p, l := vals[1+2*at], vals[2+2*at]
	for _, v := range []any{p, l} {
		if err, ok := v.(error); ok {
			return nil, err
		}
	}
	return []any{vals[0], p, l, int64(0), ""}, nil
}

// sweepRead is a sweep's plain read of one shard: its earliest pending
// task and its earliest lease, as the claim script with a limit of 0 reads
// them.
type sweepRead struct {
	at              int // index in the job
	pending, leases *redis.ZSliceCmd
}

func (st *store) sweepRead(ctx context.Context, pipe redis.Pipeliner, i, at int) sweepRead {
	return sweepRead{at: at,
		pending: pipe.ZRangeWithScores(ctx, st.keys.Pending(i), 0, 0),
		leases:  pipe.ZRangeWithScores(ctx, st.keys.Inflight(i), 0, 0)}
}

// result is the read in the claim script's form (see claimScript), with
// now as the server clock (nil if unknown).
func (r sweepRead) result(now any) ([]any, error) {
	first := func(c *redis.ZSliceCmd) (any, error) {
		zs, err := c.Result()
		if err != nil || len(zs) == 0 {
			return "", err
		}
		return strconv.FormatFloat(zs[0].Score, 'f', -1, 64), nil
	}
	p, err := first(r.pending)
	if err != nil {
		return nil, err
	}
	l, err := first(r.leases)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = int64(0)
	}
	return []any{now, p, l, int64(0), ""}, nil
}

func (st *store) claimKeys(i int) []string {
	return []string{st.keys.Pending(i), st.keys.Inflight(i), st.keys.Attempts(i), st.keys.LastClaim(i), st.keys.Paused(i),
		st.keys.Tasks(i), st.keys.Props(i), st.keys.ClaimedBody(i), st.keys.ClaimedProps(i), st.keys.Dead(i), st.keys.DeadReason(i), st.keys.Owners(i)}
}

// token is unique per claim, so the script can tell a run of the same
// claim again (go-redis retrying after a lost reply) from a new one. It
// holds no space: the shard's :claim record is space-separated pairs.
func (st *store) token() string {
	return strings.ReplaceAll(st.instance, " ", "_") + "/" + tokenNonce + "." + strconv.FormatUint(tokenSeq.Add(1), 36)
}

// claim runs one claim on shard i (the scanner pipelines claimCmd instead).
func (st *store) claim(ctx context.Context, i, limit int) (claimed, error) {
	return st.claimAs(ctx, i, limit, st.token())
}

// claimAs is claim with a given token: running it again with the same
// token is what a retry after a lost reply does.
func (st *store) claimAs(ctx context.Context, i, limit int, token string) (claimed, error) {
	vals, err := claimScript.Run(ctx, st.rdb, st.claimKeys(i), limit, st.lease.Milliseconds(), token, st.ahead.Milliseconds(), claimBytes).Slice()
	if err != nil {
		return claimed{}, fmt.Errorf("claim on %s: %w", st.keys.Pending(i), err)
	}
	return parseClaimed(vals)
}

func parseClaimed(vals []any) (claimed, error) {
	if len(vals) < 5 {
		return claimed{}, fmt.Errorf("claim script returned %d values, want at least 5", len(vals))
	}
	c := claimed{nextPending: vals[1], nextLease: vals[2]}
	c.nowUs, _ = vals[0].(int64)
	c.now = c.nowUs / 1000
	reaped, _ := vals[3].(int64)
	c.reaped, c.paused = max(0, int(reaped)), reaped < 0
	if d, ok := parseScore(vals[4]); ok {
		c.deadline = d
	}
	if (len(vals)-5)%3 != 0 {
		return claimed{}, fmt.Errorf("claim script returned %d values after 5, want triples", len(vals)-5)
	}
	for n := 5; n < len(vals); n += 3 {
		e, _ := vals[n].(string)
		c.entries = append(c.entries, e)
		c.bodies = append(c.bodies, vals[n+1])
		c.props = append(c.props, vals[n+2])
	}
	return c, nil
}

// ack forgets confirmed entries of shard i.
func (st *store) ack(ctx context.Context, i int, entries []string) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	ns, errs, err := st.ackShards(ctx, []int{i}, [][]string{entries})
	if err != nil {
		return 0, err
	}
	return ns[0], errs[0]
}

// ackShards forgets confirmed entries of several shards in one call
// (entries[n] of shards[n]), whose keys must be on one server: one shard
// at a time on Redis Cluster. err is the call's; errs[n] is shard n's
// alone, the others acked all the same.
func (st *store) ackShards(ctx context.Context, shards []int, entries [][]string) (ns []int, errs []error, err error) {
	keys := make([]string, 0, 5*len(shards))
	args := make([]any, 0, 1+len(shards))
	args = append(args, len(shards))
	total := 0
	for n, i := range shards {
		keys = append(keys, st.keys.Inflight(i), st.keys.Attempts(i), st.keys.Retrying(i), st.keys.ClaimedBody(i), st.keys.ClaimedProps(i))
		args = append(args, len(entries[n]))
		total += len(entries[n])
	}
	for _, es := range entries {
		args = append(args, anys(es)...)
	}
	vals, err := ackScript.Run(ctx, st.rdb, keys, args...).Slice()
	if err == nil && len(vals) != len(shards) {
		err = fmt.Errorf("%d replies for %d shards", len(vals), len(shards))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("ack %d tasks of %d shards from %s: %w", total, len(shards), st.keys.Inflight(shards[0]), err)
	}
	ns, errs = make([]int, len(shards)), make([]error, len(shards))
	for n, v := range vals {
		switch v := v.(type) {
		case int64:
			ns[n] = int(v)
		default:
			errs[n] = fmt.Errorf("ack %d tasks on %s: %w", len(entries[n]), st.keys.Inflight(shards[n]), shardReplyError(fmt.Sprint(v)))
		}
	}
	return ns, errs, nil
}

// fail records failed publishes of entries claimed with lease deadline.
func (st *store) fail(ctx context.Context, i int, deadline int64, fails []outcome) (retried, dead int, err error) {
	return st.failAfter(ctx, i, deadline, st.maxAttempts, fails)
}

// failAfter is fail with "poison" entries dead after maxAttempts.
func (st *store) failAfter(ctx context.Context, i int, deadline int64, maxAttempts int, fails []outcome) (retried, dead int, err error) {
	if len(fails) == 0 {
		return 0, 0, nil
	}
	args := make([]any, 0, 4+3*len(fails))
	args = append(args, st.retryMin.Milliseconds(), st.retryMax.Milliseconds(), maxAttempts, deadline)
	for _, f := range fails {
		args = append(args, f.entry, f.mode, f.reason)
	}
	keys := []string{st.keys.Inflight(i), st.keys.Attempts(i), st.keys.Dead(i), st.keys.DeadReason(i), st.keys.Retrying(i)}
	res, err := failScript.Run(ctx, st.rdb, keys, args...).Int64Slice()
	if err != nil {
		return 0, 0, fmt.Errorf("record %d failed publishes on %s: %w", len(fails), st.keys.Inflight(i), err)
	}
	return int(res[0]), int(res[1]), nil
}

// unclaim puts entries claimed with lease deadline back into pending
// (those that cannot go back are released): see unclaimScript.
func (st *store) unclaim(ctx context.Context, i int, deadline int64, entries []string) (back, released int, err error) {
	if len(entries) == 0 {
		return 0, 0, nil
	}
	args := make([]any, 0, 1+len(entries))
	args = append(args, deadline)
	args = append(args, anys(entries)...)
	keys := []string{st.keys.Pending(i), st.keys.Inflight(i), st.keys.Attempts(i),
		st.keys.Tasks(i), st.keys.Props(i), st.keys.ClaimedBody(i), st.keys.ClaimedProps(i)}
	res, err := unclaimScript.Run(ctx, st.rdb, keys, args...).Int64Slice()
	if err == nil && len(res) != 2 {
		err = fmt.Errorf("unclaim script returned %d values, want 2", len(res))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("put %d tasks back on %s: %w", len(entries), st.keys.Pending(i), err)
	}
	return int(res[0]), int(res[1]), nil
}

// release hands entries claimed with lease deadline back for any instance
// to claim at once.
func (st *store) release(ctx context.Context, i int, deadline int64, entries []string) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	args := make([]any, 0, 1+len(entries))
	args = append(args, deadline)
	args = append(args, anys(entries)...)
	n, err := releaseScript.Run(ctx, st.rdb, []string{st.keys.Inflight(i)}, args...).Int()
	if err != nil {
		return 0, fmt.Errorf("release %d tasks on %s: %w", len(entries), st.keys.Inflight(i), err)
	}
	return n, nil
}

// handBack hands out again at once the entries of shard i that the claims
// of the dead instance owner still hold (see handBackScript).
func (st *store) handBackCmd(ctx context.Context, pipe redis.Pipeliner, i int, owner string) *redis.Cmd {
	return handBackScript.EvalSha(ctx, pipe, []string{st.keys.Inflight(i), st.keys.Owners(i)}, owner)
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// shardReplyError is the error a script reports for one of its shards
// (a call it made with pcall failed): a Redis reply error, as the call's
// own would have been, so that it is told apart as one (see replies.go).
type shardReplyError string

func (e shardReplyError) Error() string { return string(e) }

// RedisError marks it as a Redis reply (redis.Error).
func (shardReplyError) RedisError() {}
