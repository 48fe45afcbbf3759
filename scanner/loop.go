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
			s.forgetKnown()
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
				return s.prim.free(s.prim.nodeOf(ctx, i), now) && !now.Before(s.badUntil[i])
			})
			for _, j := range s.prim.jobs(ctx, targets, limit, s.prim.slotsPerJob(held)) {
				j.slots = len(j.shards)
				j.ahead = !busy && s.allAhead(j.shards)
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

// allAhead reports whether every shard's earliest task is due later than
// a coalesced round trip takes (a few ms): then its claim can share one.
func (s *Scanner) allAhead(shards []int) bool {
	for _, i := range shards {
		at, ok := s.known[i]
		if !ok || at+s.claimEarly() <= s.clock.serverNow(i)+coalesceAhead.Milliseconds() {
			return false
		}
	}
	return s.opt.Lookahead > 0
}

// coalesceAhead is how long before its first task is due a claim may still
// go through the Coalescer (which waits 2 ms for company).
const coalesceAhead = 5 * time.Millisecond

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
	for _, i := range s.sweepable() {
		n := s.prim.node(s.prim.nodeOf(ctx, i))
		// A claim that answered since the primary's last sweep told as
		// much as a sweep would: with steady traffic, claimed ahead, the
		// busy shards need no sweep.
		if at, ok := s.claimedAt[i]; ok && at.After(n.sweptAt) {
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
		s.cool()
	}
}

// cool stretches the sweep interval after a sweep: each sweep that brings
// no news (hot) doubles it, up to IdlePollInterval. So a quiet queue costs
// Redis a few reads per shard a second whatever the poll interval, while
// one in use is swept every PollInterval.
func (s *Scanner) cool() {
	s.sweepEvery = min(2*s.sweepEvery, s.idleEvery())
}

// idleEvery is the sweep interval of a quiet queue.
func (s *Scanner) idleEvery() time.Duration { return max(s.opt.IdlePollInterval, s.opt.PollInterval) }

// hot brings the sweep interval back to PollInterval: a task appeared, a
// claim took tasks, a producer or another instance sent a wake-up. A queue
// in use is likely to get tasks due at once from producers that send no
// wake-up, and those wait for a sweep.
func (s *Scanner) hot() { s.sweepEvery = s.opt.PollInterval }

// sweepFirst reports whether a primary's sweep is overdue while its last
// job was a claim: then it is swept before it is claimed from again, so
// that neither starves the other when a round trip takes longer than a
// poll interval.
func (s *Scanner) sweepFirst(n *nodeState, now time.Time) bool {
	return s.role.leader && n.lastClaim && !now.Before(s.sweepDue(n))
}

// sweepable lists the shards a sweep reads: all but those left alone for
// trouble of their own.
func (s *Scanner) sweepable() []int {
	now := time.Now()
	var out []int
	for i := 0; i < s.opt.Shards; i++ {
		if !now.Before(s.badUntil[i]) {
			out = append(out, i)
		}
	}
	return out
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

// gridNext is the first multiple of every (counted from Go's zero time, the
// same in every process) after t. Sweeps and role renewals fall due on this
// grid, so those of many queues fall due together and share a round trip.
func gridNext(t time.Time, every time.Duration) time.Time {
	if every <= 0 || t.IsZero() {
		return t
	}
	// Add, not Truncate: t keeps its monotonic reading, so a step of the
	// wall clock does not stop sweeps or renewals for the length of the step.
	return t.Add(every - time.Duration(t.UnixNano()%int64(every)))
}

// sweepDue is when primary n's shards are next swept.
func (s *Scanner) sweepDue(n *nodeState) time.Time { return gridNext(n.sweptAt, s.sweepEvery) }

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
			s.known[i] = 0
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
		if d.job.limit > 0 {
			s.claimedAt[i] = time.Now()
		}
		was, had := s.known[i]
		s.noteNext(i, c.nextPending, c.nextLease)
		if had && s.notedAt[i].After(d.job.sent) {
			// A wake-up came after this job was sent: Redis may have run it
			// before the producer's ZADD, so its answer does not overrule
			// the due time the wake-up gave.
			if at, ok := s.known[i]; !ok || was < at {
				s.known[i] = was
			}
		}
		if at, has := s.known[i]; d.job.limit == 0 && has && (!had || at < was) && at-s.clock.serverNow(i) < s.idleEvery().Milliseconds() {
			// A task appeared, or one due earlier than any known, at shorter
			// notice than a quiet queue's sweeps: the queue's producers
			// schedule tasks that wait for the sweeps, so sweep often.
			// Tasks scheduled further ahead are found in time by the
			// slower sweeps (steady traffic scheduled ahead stays cheap).
			s.hot()
		}
		if s.prim.lost(i) {
			// Its last claim may have run without an answer: claim it again
			// (with that claim's token) now, not when its lease runs out.
			s.known[i] = 0
		}
		if d.job.limit == 0 {
			continue
		}
		if c.paused {
			// Held by `dispatcher pause`: looked at again in a second, so a
			// paused queue with due tasks costs Redis little and a resume
			// takes effect within a second.
			s.badUntil[i] = time.Now().Add(pausedRetry)
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
	s.badUntil[i] = time.Now().Add(100 * time.Millisecond)
	s.prim.reloadSlots()
	s.lim.Warn("shard:"+fmt.Sprint(i)+":cluster", "shard's slot is moving or its primary changing; retrying shortly",
		"shard", i, "key", s.keys.Pending(i), "err", err)
}
