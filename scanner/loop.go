package scanner

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"
)

// The scan loop claims shard by shard, in one pipelined round trip per
// Redis primary. On Redis Cluster the shards of a queue live on several
// primaries, and one that is slow or gone must only hold up its own
// shards: so each primary's claims run on their own goroutine, at most one
// at a time per primary, and the loop never waits for a particular one.
// A primary that fails is backed off on its own. With one server (or
// Sentinel) there is one primary and the loop behaves as a simple
// claim-publish cycle.

func (s *Scanner) loop(ctx, work context.Context, wg *sync.WaitGroup, slots chan struct{}) {
	busy := false // a primary gave a whole batch, or another instance told of a backlog
	done := make(chan claimDone, 1)
	freed := make(chan struct{}, 1) // a publish slot came free
	outstanding := 0

	launch := func(j claimJob) {
		s.prim.started(&j)
		outstanding++
		// A claim is waited for even when the loop stops: Redis may run it
		// anyway (sent, or queued in the Coalescer), and the loop publishes
		// or hands back what it took; given up, its batch would wait out
		// its lease (claimTimeout still bounds it).
		cctx := ctx
		if j.limit > 0 {
			cctx = context.WithoutCancel(ctx)
		}
		go func() { done <- s.runClaims(cctx, j) }()
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
			s.quiet = false
			n.full = false
			busy = s.prim.anyFull()
			s.prim.nodeTrouble(ctx, d.job.node, err)
			return
		}
		s.prim.nodeFine(d.job.node)
		if d.job.limit == 0 {
			s.quiet = len(s.due.known) == 0 && !slices.ContainsFunc(d.errs, func(e error) bool { return e != nil })
			return
		}
		s.quiet = false
		n.full = full
		busy = s.prim.anyFull()
		if full {
			s.wake.announceBusy(ctx)
		} else if !busy && !s.sweeps() {
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
			// hands their tasks back to any instance. Meanwhile its share
			// of the shards goes to the others.
			s.holdShare(true)
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
			if s.brokerReady() {
				s.holdShare(false)
			}
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
				s.reserveAhead(&j)
				j.ahead = !busy && s.due.ahead(j.shards) && j.aheadAt(len(j.shards)-1) > 0
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
		if !busy && s.sweeps() {
			s.sweep(ctx, launch)
		}

		// A queue that holds nothing leaves its sweeps to the IdleWatch.
		if s.canDoze(busy, outstanding) {
			s.doze(ctx)
			continue
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

// takeNotes applies the wake-ups received since the last turn and sends a
// renewal of or bid for the sweeper role when that is due.
func (s *Scanner) takeNotes(ctx context.Context, busy *bool) {
	wasBusy, free, soon := s.wake.notes.take()
	if wasBusy || free || len(soon) > 0 {
		s.quiet = false
	}
	if wasBusy {
		*busy = true
	}
	if wasBusy || len(soon) > 0 {
		s.due.hot()
	}
	if free {
		s.role.free()
	}
	s.role.bid(ctx)
	if !s.sweeps() {
		return
	}
	// Shared work: a wake-up is heard by every instance, but only the one
	// whose share holds the shard claims it; the others would claim
	// nothing (or steal a task from the claim ahead of its owner).
	if at, n := s.share(); n >= 2 {
		for i := range soon {
			if !s.mine(i, at, n) {
				delete(soon, i)
			}
		}
	}
	s.due.heard(soon)
}

// applyLead takes the answer about the sweeper role in. An instance that
// lost the role forgets the due times it knew: they are the sweeper's.
func (s *Scanner) applyLead(ctx context.Context, r leadResult) {
	if s.role.apply(ctx, r) && !s.sweeps() {
		s.due.forget(s.prim.unanswered)
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

// idleDelay is how long the loop may sleep: until the earliest known due
// time on a primary it may claim from, the end of a backoff, the next
// sweep of a primary (unless busy: then nothing is swept) or the next turn
// at the sweeper role, whichever is first. Shards whose primary is busy
// with a job are left out: its answer wakes the loop; so are all shards
// while canClaim is false (no publish slot free: one coming free wakes
// it). claimNow says the loop should claim again at once.
func (s *Scanner) idleDelay(busy, canClaim, claimNow bool) time.Duration {
	d := s.role.wait()
	now := time.Now()
	backedOff := false
	sweeps := s.sweeps()
	for _, n := range s.prim.nodes {
		if n.until.After(now) {
			d = min(d, n.until.Sub(now))
			backedOff = true
		}
		if sweeps && !busy && !n.claiming && !n.until.After(now) {
			d = min(d, s.sweepDue(n).Sub(now))
		}
	}
	if sweeps && !busy && len(s.prim.nodes) == 0 {
		d = min(d, s.due.every) // nothing swept yet
	}
	if claimNow && !backedOff && !s.rate.limited(now) {
		return 0
	}
	if claimNow && s.rate.limited(now) {
		d = min(d, s.rate.wait(now))
	}
	if !canClaim {
		return max(d, time.Millisecond)
	}
	ctx := context.Background()
	for i := range s.due.known {
		n := s.prim.node(s.prim.nodeOf(ctx, i))
		if n.claiming || n.until.After(now) || s.prim.inClaim[i] {
			continue
		}
		if s.rate.limited(now) {
			d = min(d, s.rate.wait(now)) // due shards wait for the next token
			continue
		}
		d = min(d, s.due.wait(i, now))
	}
	if d <= 0 {
		return time.Millisecond // due now but nothing claimable: no spinning
	}
	return d
}

// The holder is bounded, on the busy path too: a claim may take tasks
// ahead of their due time only if the holder, with what the claims ahead
// still out may bring, has room for a whole batch more (PIPELINE ×
// BATCH_SIZE in all); otherwise it takes due tasks only. Without the
// bound, claims that come back full (a backlog) would take everything
// within the look-ahead into memory, a batch at a time.

// roomAhead reports whether the holder has room for n more tasks claimed
// ahead.
func (s *Scanner) roomAhead(n int) bool {
	return s.st.ahead > 0 && s.hold.len()+int(s.reservedAhead.Load())+n <= s.opt.Pipeline*s.opt.BatchSize
}

// reserveAhead lets each of j's claims look ahead while the holder has
// room for its whole batch, reserving that room until the batch's tasks
// are held (dispatch) or the claim brought none (absorb).
func (s *Scanner) reserveAhead(j *claimJob) {
	j.aheads, j.reserved = make([]time.Duration, len(j.shards)), make([]int, len(j.shards))
	for n := range j.shards {
		if !s.roomAhead(j.limit) {
			break
		}
		s.reservedAhead.Add(int64(j.limit))
		j.aheads[n], j.reserved[n] = s.st.ahead, j.limit
	}
}

// freeAhead frees room reserved by reserveAhead.
func (s *Scanner) freeAhead(n int) {
	if n > 0 {
		s.reservedAhead.Add(-int64(n))
	}
}

// dueShards returns up to n shards known to need a claim now on primaries
// the loop may claim from, the longest waiting first.
func (s *Scanner) dueShards(n int) []int {
	now := time.Now()
	ctx := context.Background()
	var out []int
	// The holder is bounded: a publish slot is freed as soon as a batch's
	// due tasks are out, so without a bound a burst due at one instant
	// could be claimed ahead into memory without limit.
	full := !s.roomAhead(s.opt.BatchSize)
	for i, at := range s.due.known {
		if full {
			if in, _ := s.due.dueIn(i); in > 0 {
				continue // a claim ahead: waits until the holder has room
			}
		}
		addr := s.prim.nodeOf(ctx, i)
		if at <= s.clock.serverNow(i) && !s.prim.inClaim[i] && !s.due.aside(i, now) && s.prim.free(addr, now) && !s.sweepFirst(s.prim.node(addr), now) {
			out = append(out, i)
		}
	}
	sort.Slice(out, func(a, b int) bool { return s.due.known[out[a]] < s.due.known[out[b]] })
	if len(out) > n {
		out = out[:n]
	}
	return out
}

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
	at, of := s.share()
	for _, i := range s.due.sweepable() {
		if !s.mine(i, at, of) {
			continue
		}
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
	probe := len(s.due.known) == 0
	for _, j := range jobs {
		j.probe = probe
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
	return n.lastClaim && !now.Before(s.sweepDue(n)) && s.sweeps()
}

// sweepDue is when primary n's shards are next swept.
func (s *Scanner) sweepDue(n *nodeState) time.Time { return s.due.nextSweep(n.sweptAt) }
