package scanner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/coalesce"
)

// The scan loop claims shard by shard, in one pipelined round trip per
// Redis primary. On Redis Cluster the shards of a queue live on several
// primaries, and one that is slow or gone must only hold up its own
// shards: so each primary's claims run on their own goroutine, at most one
// at a time per primary, and the loop never waits for a particular one.
// A primary that fails is backed off on its own. With one server (or
// Sentinel) there is one primary and the loop behaves as a simple
// claim-publish cycle.

// claimDone is what Redis said to a claimJob, per shard.
type claimDone struct {
	job           claimJob
	vals          [][]any // nil where errs says why
	errs          []error
	before, after []time.Time // local clock around the round trip that answered
}

// Time limits of the loop's Redis calls. go-redis honours them because
// redisconn turns ContextTimeoutEnabled on; without them a primary that
// stopped answering would hold a claim for the read timeout times go-redis's
// retries and redirects (about 20 s on a cluster).
const (
	pausedRetry    = time.Second     // a paused shard is claimed from again after
	claimTimeout   = 3 * time.Second // one job's pipeline
	counterTimeout = time.Second     // the balancer's INCRBY
)

// NewCoalescer returns the Coalescer that the scanners of one instance
// share (Options.Coalescer) to send their sweeps and role renewals of the
// same moment in one round trip per primary. The 2 ms it waits for the
// others is nothing to a sweep, which is a poll.
func NewCoalescer(rdb redis.UniversalClient) *coalesce.Coalescer {
	return coalesce.New(rdb, 2*time.Millisecond, claimTimeout)
}

func (s *Scanner) loop(ctx, work context.Context, wg *sync.WaitGroup, slots chan struct{}) {
	busy := false // a primary gave a whole batch, or another instance told of a backlog
	done := make(chan claimDone, 1)
	freed := make(chan struct{}, 1) // a publish slot came free
	outstanding := 0

	launch := func(j claimJob) {
		s.prim.started(&j)
		outstanding++
		go func() { done <- s.runClaims(ctx, j) }()
	}
	finish := func(d claimDone) {
		outstanding--
		s.prim.answered(d.job)
		n := s.prim.node(d.job.node)
		batches, full, err := s.absorb(d)
		held := d.job.slots
		if len(batches) > 0 {
			s.lastClaimed.Store(time.Now().UnixNano())
		}
		for _, b := range batches {
			held--
			wg.Add(1)
			s.publishing.Add(1)
			go s.dispatch(work, b, func() {
				s.publishing.Add(-1)
				<-slots
				select {
				case freed <- struct{}{}:
				default:
				}
			}, wg.Done)
		}
		for ; held > 0; held-- {
			<-slots
		}
		if err != nil {
			n.full = false
			busy = s.prim.anyFull()
			s.prim.nodeTrouble(ctx, d.job.node, err)
			return
		}
		s.prim.nodeFine(d.job.node)
		if d.job.limit == 0 {
			return
		}
		n.full = full
		busy = s.prim.anyFull()
		if full {
			s.wake.announceBusy(ctx)
		} else if !busy && !s.role.leader {
			// What a helper learnt while busy is the sweeper's business.
			s.due.forget(s.prim.unanswered)
		}
	}
	defer func() {
		// Claims still running when the loop stops may have taken tasks
		// into flight: publish them rather than leave them to their lease.
		for outstanding > 0 {
			finish(<-done)
		}
		if s.role.leading {
			s.applyLead(ctx, <-s.role.done)
		}
	}()

	for ctx.Err() == nil {
		if !s.brokerReady() {
			// Claim nothing until the broker takes publishes again (a lost
			// connection, connection.blocked), but keep taking in the
			// claims that were running: publishing them fails fast and
			// hands their tasks back to any instance.
			wait, stop := context.WithCancel(ctx)
			ready := make(chan struct{})
			go func() { _ = s.pub.WaitReady(wait); close(ready) }()
			select {
			case <-ready:
			case d := <-done:
				finish(d)
			case r := <-s.role.done:
				s.applyLead(ctx, r)
			}
			stop()
			<-ready
			continue
		}
		s.takeNotes(ctx, &busy)

		// Hold as many publish slots as are free, and claim from that many
		// shards on primaries that are free.
		held := 0
	fill:
		for held < cap(slots) {
			select {
			case slots <- struct{}{}:
				held++
			default:
				break fill
			}
		}
		if held > 0 && !s.rate.limited(time.Now()) && s.prim.anyFree(ctx) {
			var targets []int
			if busy {
				targets = s.pick.next(ctx, held)
			} else {
				targets = s.dueShards(held)
			}
			targets, limit := s.rate.allow(ctx, targets, func(i int, now time.Time) bool {
				return s.prim.free(s.prim.nodeOf(ctx, i), now) && !s.due.aside(i, now)
			})
			for _, j := range s.prim.jobs(ctx, targets, limit, s.prim.slotsPerJob(held)) {
				j.slots = len(j.shards)
				j.ahead = !busy && s.due.ahead(j.shards)
				held -= j.slots
				launch(j)
			}
		}
		for ; held > 0; held-- {
			<-slots
		}
		// After the claims: a primary that takes longer to answer than a
		// poll interval is still swept and claimed from in turn (see
		// sweepFirst), as one turn used to do both.
		if s.role.leader && !busy {
			s.sweep(ctx, launch)
		}

		// With every slot publishing, due shards wait for a slot to come
		// free (freed), not for a timer.
		canClaim := len(slots) < cap(slots)
		t := time.NewTimer(s.idleDelay(busy, canClaim, busy && outstanding == 0 && canClaim))
		select {
		case d := <-done:
			finish(d)
		case r := <-s.role.done:
			s.applyLead(ctx, r)
		case <-freed:
		case <-s.wake.ch:
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// ended is a context that has already ended: WaitReady with it answers at
// once. Made once, as brokerReady runs on every turn of the loop.
var ended = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// brokerReady reports, without waiting, whether the broker takes publishes.
func (s *Scanner) brokerReady() bool { return s.pub.WaitReady(ended) == nil }

// sweep reads, on every primary whose last sweep is a poll interval old and
// that is free, when each of its shards next needs a claim (a claim of 0
// tasks: it claims and reaps nothing). Each primary is swept on its own
// clock, so one that is busy claiming is swept as soon as it is free.
func (s *Scanner) sweep(ctx context.Context, launch func(claimJob)) {
	now := time.Now()
	if len(s.prim.nodes) > 0 {
		due := false
		for _, n := range s.prim.nodes {
			due = due || (!n.claiming && !now.Before(s.sweepDue(n)))
		}
		if !due {
			return
		}
	}
	var shards []int
	for _, i := range s.due.sweepable() {
		n := s.prim.node(s.prim.nodeOf(ctx, i))
		// A claim that answered since the primary's last sweep told as
		// much as a sweep would: with steady traffic, claimed ahead, the
		// busy shards need no sweep.
		if s.due.claimedSince(i, n.sweptAt) {
			continue
		}
		if !now.Before(s.sweepDue(n)) {
			shards = append(shards, i)
		}
	}
	jobs := s.prim.jobs(ctx, shards, 0, len(shards))
	for _, j := range jobs {
		s.prim.node(j.node).sweptAt = now
		launch(j)
	}
	// A due primary that got no job (all its shards set aside, or backed
	// off) counts as swept too: otherwise it stays due and the loop wakes
	// every ms for it.
	for _, n := range s.prim.nodes {
		if !n.claiming && !now.Before(s.sweepDue(n)) {
			n.sweptAt = now
		}
	}
	if len(jobs) > 0 {
		s.due.cool()
	}
}

// sweepFirst reports whether a primary's sweep is overdue while its last
// job was a claim: then it is swept before it is claimed from again, so
// that neither starves the other when a round trip takes longer than a
// poll interval.
func (s *Scanner) sweepFirst(n *nodeState, now time.Time) bool {
	return s.role.leader && n.lastClaim && !now.Before(s.sweepDue(n))
}

// runClaims runs a job's scripts in one pipeline, loading the claim script
// first where the primary does not know it (new, restarted or promoted).
// A sweep runs the script (claiming nothing) on its first shard only, for
// the primary's clock and for its refusals (a replica refuses scripts, not
// reads), and plain reads on the others: a script call costs Redis several
// times two ZRANGEs, and with many queues sweeps are most of its work.
// It touches only Redis: the loop applies the answers (absorb).
func (s *Scanner) runClaims(ctx context.Context, j claimJob) claimDone {
	ctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	d := claimDone{job: j, vals: make([][]any, len(j.shards)), errs: make([]error, len(j.shards)),
		before: make([]time.Time, len(j.shards)), after: make([]time.Time, len(j.shards))}
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
				cmds[n] = s.st.claimCmd(ctx, pipe, j.shards[at], j.limit, j.tokens[at])
			}
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

// sweepDue is when primary n's shards are next swept.
func (s *Scanner) sweepDue(n *nodeState) time.Time { return s.due.nextSweep(n.sweptAt) }

// absorb applies a job's answers: each shard's next due time and server
// clock, reaped leases, and the batches claimed. full reports whether any
// shard gave a whole batch (more is due). A shard whose keys are unusable
// is left alone for a while (shardTrouble); a failure that is not the
// shard's own (connection lost, a server-wide refusal) is returned as
// err, alongside the batches of the shards that were claimed.
func (s *Scanner) absorb(d claimDone) (out []batch, full bool, trouble error) {
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
			s.clock.observe(i, c.now, d.before[n], d.after[n])
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
		b := batch{shard: i, deadline: c.deadline}
		for _, e := range c.entries {
			t, err := ParseEntry(e)
			if err != nil {
				s.lim.Error("entry", "skipping malformed in-flight entry", "shard", i, "err", err)
				continue
			}
			b.tasks = append(b.tasks, t)
		}
		if len(b.tasks) > 0 {
			s.met.batchSize(len(b.tasks))
			out = append(out, b)
		}
		if len(c.entries) >= d.job.limit {
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

// clusterTransient reports whether err is Redis Cluster moving a slot or
// electing a primary (after go-redis's own redirects and retries): the
// shard is looked at again shortly, not set aside like a broken one.
func clusterTransient(err error) bool {
	for _, p := range []string{"TRYAGAIN", "CLUSTERDOWN", "MOVED", "ASK", "MASTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// shardWait leaves shard i alone briefly after a transient cluster answer.
func (s *Scanner) shardWait(i int, err error) {
	s.met.error("cluster", 1)
	s.due.setAside(i, time.Now().Add(100*time.Millisecond))
	s.prim.reloadSlots()
	s.lim.Warn("shard:"+fmt.Sprint(i)+":cluster", "shard's slot is moving or its primary changing; retrying shortly",
		"shard", i, "key", s.keys.Pending(i), "err", err)
}
