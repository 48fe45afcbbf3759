package scanner

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/coalesce"
)

// A claim job (or sweep) goes in two halves: its round trip runs on a
// goroutine of its own and touches only Redis (runClaims); its answer is
// applied on the loop's goroutine (absorb), where it reaches every
// concern: the clock, the due times, the primaries' tokens and the batches
// to publish. Both are kept here, out of the loop itself.

// claimDone is what Redis said to a claimJob, per shard.
type claimDone struct {
	job           claimJob
	owner         string  // the liveness id the claims were recorded under
	vals          [][]any // nil where errs says why
	errs          []error
	before, after []time.Time // local clock around the round trip that answered
	sentTo        []string    // the primary each shard's commands were sent to (clockCheck.note)
}

// NewCoalescer returns the Coalescer that the scanners of one instance
// share (Options.Coalescer) to send their sweeps and role renewals of the
// same moment in one round trip per primary. The 2 ms it waits for the
// others is nothing to a sweep, which is a poll.
func NewCoalescer(rdb redis.UniversalClient) *coalesce.Coalescer {
	return coalesce.New(rdb, 2*time.Millisecond, claimTimeout)
}

// runClaims runs a job's scripts in one pipeline, loading the claim script
// first where the primary does not know it (new, restarted or promoted).
// A sweep on one Redis is one call of sweepScript (runSweep). On a
// cluster, whose shards' keys cannot share a script, it runs the claim
// script (claiming nothing) on its first shard only, for the primary's
// clock and for its refusals (a replica refuses scripts, not reads), and
// plain reads on the others: a script call costs Redis several times two
// ZRANGEs, and with many queues sweeps are most of its work.
// It touches only Redis: the loop applies the answers (absorb).
func (s *Scanner) runClaims(ctx context.Context, j claimJob) claimDone {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	d := claimDone{job: j, owner: s.owner(), vals: make([][]any, len(j.shards)), errs: make([]error, len(j.shards)),
		before: make([]time.Time, len(j.shards)), after: make([]time.Time, len(j.shards)), sentTo: make([]string, len(j.shards))}
	if j.limit == 0 && !s.prim.cluster {
		return s.runSweep(ctx, j, d)
	}
	todo := make([]int, len(j.shards)) // indexes into j.shards
	for n := range todo {
		todo[n] = n
	}
	for attempt := 0; len(todo) > 0; attempt++ {
		cmds := make([]*redis.Cmd, len(todo))
		var reads []sweepRead
		fill := func(pipe redis.Pipeliner) {
			for n, at := range todo {
				if j.limit == 0 && at > 0 {
					reads = append(reads, s.st.sweepRead(ctx, pipe, j.shards[at], at))
					continue
				}
				cmds[n] = s.st.claimCmd(ctx, pipe, j.shards[at], j.limit, j.tokens[at], j.aheadAt(at), d.owner)
			}
		}
		for _, at := range todo {
			d.sentTo[at] = s.check.primaryOf(j.shards[at])
		}
		before, after, err := s.roundTrip(ctx, j.node, j.limit == 0 || j.ahead, fill)
		if err != nil { // the round trip is left unread: it may still be writing the results
			for _, at := range todo {
				d.errs[at] = err
			}
			return d
		}
		var again []int
		var now any // the server clock, from the script of a sweep
		for n, cmd := range cmds {
			if cmd == nil {
				continue
			}
			at := todo[n]
			vals, err := cmd.Slice()
			if attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				again = append(again, at)
				continue
			}
			if err == nil && len(vals) > 0 {
				now = vals[0]
			}
			d.vals[at], d.errs[at] = vals, err
			d.before[at], d.after[at] = before, after
		}
		for _, r := range reads {
			d.vals[r.at], d.errs[r.at] = r.result(now)
			d.before[r.at], d.after[r.at] = before, after
		}
		if len(again) > 0 {
			if err := claimScript.Load(ctx, s.prim.scripter(ctx, j)).Err(); err != nil {
				err = fmt.Errorf("load claim script: %w", err)
				for _, at := range again {
					d.errs[at] = err
				}
				return d
			}
		}
		todo = again
	}
	return d
}

// runSweep runs a sweep of shards on one Redis (not a cluster) as one
// call of sweepScript, loading it first where Redis does not know it.
func (s *Scanner) runSweep(ctx context.Context, j claimJob, d claimDone) claimDone {
	for at := range j.shards {
		d.sentTo[at] = s.check.primaryOf(j.shards[at])
	}
	for attempt := 0; ; attempt++ {
		var cmd *redis.Cmd
		before, after, err := s.roundTrip(ctx, j.node, true, func(pipe redis.Pipeliner) {
			cmd = s.st.sweepCmd(ctx, pipe, j.shards, j.probe)
		})
		if err == nil {
			var vals []any
			vals, err = cmd.Slice()
			if attempt == 0 && redis.HasErrorPrefix(err, "NOSCRIPT") {
				if err = sweepScript.Load(ctx, s.prim.scripter(ctx, j)).Err(); err == nil {
					continue
				}
				err = fmt.Errorf("load sweep script: %w", err)
			}
			if err == nil {
				for at := range j.shards {
					d.vals[at], d.errs[at] = sweptShard(vals, at)
					d.before[at], d.after[at] = before, after
				}
				return d
			}
		}
		for at := range j.shards {
			d.errs[at] = err
		}
		return d
	}
}

// roundTrip sends the commands fill queues in one pipeline to the primary
// node and returns the local clock just before and after Redis ran them.
// Sweeps (shared) go through the instance's Coalescer, if any, with the
// other queues' sweeps of the moment; claims go on their own, at once.
// An error means ctx ended first (coalesced only): the commands must not be
// read.
func (s *Scanner) roundTrip(ctx context.Context, node string, shared bool, fill func(redis.Pipeliner)) (before, after time.Time, err error) {
	// On a cluster, "" is a primary not known (yet): alone, so that it
	// holds up no lane of a known one.
	if shared && s.opt.Coalescer != nil && (node != "" || !s.prim.cluster) {
		start := s.opt.Now()
		sent, took, err := s.opt.Coalescer.Do(ctx, node, fill)
		before = start.Add(sent)
		return before, before.Add(took), err
	}
	pipe := s.rdb.Pipeline()
	fill(pipe)
	before = s.opt.Now()
	_, _ = pipe.Exec(ctx) // each command's own error is read by the caller
	return before, s.opt.Now(), nil
}

// absorb applies a job's answers: each shard's next due time and server
// clock, reaped leases, and the batches claimed. full reports whether any
// shard gave a whole batch (more is due). A shard whose keys are unusable
// is left alone for a while (shardTrouble); a failure that is not the
// shard's own (connection lost, a server-wide refusal) is returned as
// err, alongside the batches of the shards that were claimed.
func (s *Scanner) absorb(d claimDone) (out []batch, full bool, trouble error) {
	// The room reserved for a shard's claim ahead stays reserved for its
	// batch until its tasks are held (dispatch); a shard without a batch
	// frees it now.
	batched := make([]bool, len(d.job.shards))
	defer func() {
		for n := range d.job.shards {
			if !batched[n] {
				s.freeAhead(d.job.reservedAt(n))
			}
		}
	}()
	for n, i := range d.job.shards {
		vals, err := d.vals[n], d.errs[n]
		if d.job.limit > 0 && s.prim.settleToken(i, d.job.tokens[n], vals, err) {
			s.due.dueNow(i)
		}
		switch {
		case err == nil:
		case !isReply(err) || serverRefuses(err):
			if trouble == nil {
				trouble = err
			}
			continue
		case clusterTransient(err):
			s.shardWait(i, err)
			continue
		default:
			s.shardTrouble(i, err)
			continue
		}
		c, err := parseClaimed(vals)
		if err != nil {
			s.shardTrouble(i, err)
			continue
		}
		if c.now > 0 { // a sweep's plain reads carry no clock when its script failed
			s.clock.observe(i, c.nowUs, d.before[n], d.after[n])
			var sentTo string // "" with one server
			if n < len(d.sentTo) {
				sentTo = d.sentTo[n]
			}
			s.check.note(i, c.nowUs, d.before[n], sentTo)
		}
		s.due.noteAnswer(i, c.nextPending, c.nextLease, d.job.sent, d.job.limit > 0)
		if s.prim.lost(i) {
			// Its last claim may have run without an answer: claim it again
			// (with that claim's token) now, not when its lease runs out.
			s.due.dueNow(i)
		}
		if d.job.limit == 0 {
			continue
		}
		if c.paused {
			// Held by `dispatcher pause`: looked at again in a second, so a
			// paused queue with due tasks costs Redis little and a resume
			// takes effect within a second.
			s.due.setAside(i, time.Now().Add(pausedRetry))
			s.lim.Info("paused", "queue paused: claiming nothing until `dispatcher resume`", "shard", i)
			continue
		}
		if c.reaped > 0 {
			s.met.reaped(c.reaped)
			s.lim.Warn("reaped", "took over tasks whose lease ran out", "shard", i, "tasks", c.reaped)
		}
		b := batch{shard: i, deadline: c.deadline, reserved: d.job.reservedAt(n), nowUs: c.nowUs, owner: d.owner}
		for k, e := range c.entries {
			t, err := ParseEntry(e)
			if err != nil {
				s.lim.Error("entry", "skipping malformed in-flight entry", "shard", i, "err", err)
				continue
			}
			t.withStored(c.bodies[k], c.props[k])
			b.tasks = append(b.tasks, t)
		}
		if len(b.tasks) > 0 {
			s.met.batchSize(len(b.tasks))
			out = append(out, b)
			batched[n] = true
		}
		// A claim the byte budget ended early is full too: more is due.
		if len(c.entries) >= d.job.limit || len(c.entries) > 0 && dueBy(c.nextPending, c.now) {
			full = true
		}
	}
	return out, full, trouble
}

// claim claims up to BatchSize tasks of each target shard, the way the
// loop does, and returns the batches (the caller publishes them).
func (s *Scanner) claim(ctx context.Context, targets []int) ([]batch, bool, error) {
	var out []batch
	full := false
	var errs []error
	for _, j := range s.prim.jobs(ctx, targets, s.opt.BatchSize, len(targets)) {
		j.sent = time.Now()
		j.aheads = make([]time.Duration, len(j.shards))
		for n := range j.aheads {
			j.aheads[n] = s.st.ahead
		}
		b, f, err := s.absorb(s.runClaims(ctx, j))
		out, full = append(out, b...), full || f
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return out, full, errs[0]
	}
	return out, full, nil
}

// shardTrouble handles an error of one shard's script: the shard is left
// alone for a while and the error is counted and logged (rate-limited);
// the other shards carry on.
func (s *Scanner) shardTrouble(i int, err error) {
	kind := "redis"
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		kind = "wrongtype"
	}
	s.met.error(kind, 1)
	s.due.setAside(i, time.Now().Add(5*time.Second))
	s.due.drop(i)
	s.lim.Error("shard:"+strconv.Itoa(i)+":"+kind, "shard unusable; skipping it for 5s",
		"shard", i, "key", s.keys.Pending(i), "err", err)
}

// shardWait leaves shard i alone briefly after a transient cluster answer.
func (s *Scanner) shardWait(i int, err error) {
	s.met.error("cluster", 1)
	s.due.setAside(i, time.Now().Add(100*time.Millisecond))
	s.prim.reloadSlots()
	s.lim.Warn("shard:"+fmt.Sprint(i)+":cluster", "shard's slot is moving or its primary changing; retrying shortly",
		"shard", i, "key", s.keys.Pending(i), "err", err)
}

// dueBy reports whether a claim's next pending score is due at nowMs.
func dueBy(score any, nowMs int64) bool {
	v, ok := parseScore(score)
	return ok && v <= nowMs
}
