package scanner

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
	"github.com/redis/go-redis/v9"
)

// progress is a claimed batch on its way out: the outcome of each of its
// tasks, gathered as they come (at once for the tasks due when it was
// claimed, at their due time for the held ones), and settled in Redis in
// one go once every task has one. A batch still publishing acks what was
// confirmed with the instance's next flush of acks (earlyAcks), at most
// partialAckAfter later, so a process that dies sends again (by its
// lease, or the hand-back once it is found dead) only what it published
// in the last few tens of ms, not the look-ahead's worth.
type progress struct {
	b    batch
	done func() // once settled

	mu       sync.Mutex
	left     int
	acked    []string
	ackSent  int // acked[:ackSent] were acked early (takeAcks)
	fails    []outcome
	released []string
	unclaim  []string // held, never published: back into pending
	dropped  []string // returned as unroutable, UNROUTABLE=drop: forgotten
}

// Outcomes of a task besides the fail script's modes (retry, poison, dead).
const (
	outAcked     = "acked"     // confirmed: forgotten
	outReleased  = "released"  // never reached the broker: lease 0
	outUnclaimed = "unclaimed" // held, never published, stopping: back into pending
	outAbandoned = "abandoned" // claimed under a liveness id declared dead: left as it is
)

// record notes one task's outcome (o.mode: an out* outcome or a fail
// script mode) and reports whether it was the batch's last.
func (p *progress) record(o outcome) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch o.mode {
	case outAcked:
		p.acked = append(p.acked, o.entry)
	case outReleased:
		p.released = append(p.released, o.entry)
	case outUnclaimed:
		p.unclaim = append(p.unclaim, o.entry)
	case outDropped:
		p.dropped = append(p.dropped, o.entry)
	case outAbandoned:
	default:
		p.fails = append(p.fails, o)
	}
	p.left--
	return p.left == 0
}

// partialAckAfter is how long confirmed tasks wait at most for the flush
// that acks them: the longer, the fewer acks per task; the shorter, the
// fewer tasks a crash sends twice.
const partialAckAfter = 20 * time.Millisecond

// takeAcks returns the confirmed entries of a batch still publishing not
// acked yet, for an early ack; nil if none (or the batch is complete:
// settling acks the rest).
func (p *progress) takeAcks() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.left == 0 || len(p.acked) == p.ackSent {
		return nil
	}
	out := append([]string(nil), p.acked[p.ackSent:]...)
	p.ackSent = len(p.acked)
	return out
}

// unacked is what settling still acks.
func (p *progress) unacked() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.acked[p.ackSent:]
}

// earlyAcks gathers what an instance acks: the confirmed tasks of batches
// still publishing, and the rest of each batch once it is settled. A
// timer of its own, armed by the first of them after a flush, sends them,
// every shard's in one call (one per shard on Redis Cluster), at most
// partialAckAfter after they were confirmed: not at the batch's next
// publish, which for a batch claimed ahead may be most of the look-ahead
// away, and not one call per batch and shard, whose fixed cost would be
// most of a task's. The timer runs only while there is something to ack,
// so an idle queue pays nothing for it.
type earlyAcks struct {
	mu      sync.Mutex
	batches map[*progress]struct{}
	settled map[int][]string // settled batches' acks, by shard
	timer   *time.Timer      // armed while batches or settled is not empty
	stopped bool
}

// ackEarly notes the batches of tasks just confirmed for an early ack.
func (s *Scanner) ackEarly(tasks []heldTask) {
	e := &s.early
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	if e.batches == nil {
		e.batches = map[*progress]struct{}{}
	}
	for _, t := range tasks {
		e.batches[t.batch] = struct{}{}
	}
	if e.timer == nil {
		e.timer = time.AfterFunc(partialAckAfter, s.flushEarly)
	}
}

// ackSettled adds a settled batch's confirmed entries of shard i to the
// next flush. false: acks have stopped, the caller acks them itself.
func (s *Scanner) ackSettled(i int, es []string) bool {
	e := &s.early
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return false
	}
	if e.settled == nil {
		e.settled = map[int][]string{}
	}
	e.settled[i] = append(e.settled[i], es...)
	if e.timer == nil {
		e.timer = time.AfterFunc(partialAckAfter, s.flushEarly)
	}
	return true
}

// flushEarly acks every confirmed task not acked yet and the settled
// batches' acks, in one go: the timer is armed again only by the next
// confirm, so an instance flushes at most once per partialAckAfter, and
// nothing confirmed waits longer than that.
func (s *Scanner) flushEarly() {
	e := &s.early
	e.mu.Lock()
	defer e.mu.Unlock()
	e.timer = nil
	if e.stopped {
		return
	}
	byShard := e.settled
	e.settled = nil
	if byShard == nil {
		byShard = map[int][]string{}
	}
	for p := range e.batches {
		if es := p.takeAcks(); len(es) > 0 {
			byShard[p.b.shard] = append(byShard[p.b.shard], es...)
		}
	}
	clear(e.batches)
	s.ackConfirmed(byShard) // under e.mu: before stopEarly's Wait
}

// stopEarly ends the timer's acks: those under way finish (Run waits for
// them), what settled batches left is sent now, and settling acks what
// is left after this on its own.
func (s *Scanner) stopEarly() {
	e := &s.early
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopped = true
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	e.batches = nil
	s.ackConfirmed(e.settled)
	e.settled = nil
}

// ackConfirmed forgets confirmed entries, by shard, on a goroutine of its
// own (s.acking): in one call where every shard is on one server, else one
// call per shard. A shard whose ack failed is tried again on its own.
func (s *Scanner) ackConfirmed(byShard map[int][]string) {
	var shards []int
	var entries [][]string
	for i, es := range byShard {
		if len(es) > 0 {
			shards = append(shards, i)
			entries = append(entries, es)
		}
	}
	if len(shards) == 0 {
		return
	}
	if _, cluster := s.rdb.(*redis.ClusterClient); cluster || len(shards) == 1 {
		for n, i := range shards {
			s.ackShard(i, entries[n])
		}
		return
	}
	s.acking.Add(1)
	go func() {
		defer s.acking.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.work), 15*time.Second)
		defer cancel()
		var errs []error
		if err := s.settle(ctx, func(ctx context.Context) (err error) {
			_, errs, err = s.st.ackShards(ctx, shards, entries)
			return err
		}); err != nil {
			for n, i := range shards {
				s.ackFailed(i, len(entries[n]), err)
			}
			return
		}
		for n, i := range shards {
			if errs[n] != nil {
				s.ackShard(i, entries[n])
				continue
			}
			s.acked(len(entries[n]))
		}
	}()
}

// ackShard forgets confirmed entries of shard i on a goroutine of its own.
func (s *Scanner) ackShard(i int, es []string) {
	s.acking.Add(1)
	go func() {
		defer s.acking.Done()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.work), 15*time.Second)
		defer cancel()
		if err := s.settle(ctx, func(ctx context.Context) error { _, err := s.st.ack(ctx, i, es); return err }); err != nil {
			s.ackFailed(i, len(es), err)
			return
		}
		s.acked(len(es))
	}()
}

// acked counts confirmed tasks forgotten.
func (s *Scanner) acked(tasks int) {
	s.met.dispatched(tasks)
	s.lastAcked.Store(time.Now().UnixNano())
}

func (s *Scanner) ackFailed(i, tasks int, err error) {
	s.met.error("ack", 1)
	s.lim.Error("ack", "could not forget confirmed tasks; their lease will send them again", "shard", i, "tasks", tasks, "err", err)
}

// dispatch publishes the tasks of one claimed batch that are due, hands
// those claimed ahead of their due time to the holder, and settles the
// batch in Redis once every task has an outcome: confirmed ones leave the
// in-flight set, failed ones are retried with backoff or dead-lettered,
// and those that never reached the broker are handed back (lease 0). If
// the process dies anywhere in here, the tasks are still in the in-flight
// set and their lease brings them back. published is called once the due
// tasks are published: settling needs no publish slot, and a primary that
// went away while its batch was out must not keep the slots from the other
// primaries' shards. done is called once the batch is settled.
func (s *Scanner) dispatch(work context.Context, b batch, published, done func()) {
	p := &progress{b: b, done: done, left: len(b.tasks)}
	var now, later []heldTask
	// Published at once only if the claim's own reading of the Redis clock
	// showed it due; the holder confirms the others by a later reading
	// (see clockCheck): never early, even if the clock stepped back.
	nowUs := min(s.clock.surelyUs(b.shard), b.nowUs)
	complete := len(b.tasks) == 0
	for _, t := range b.tasks {
		if n := len(t.Payload()); n > s.opt.MaxMessageBytes {
			s.met.error("too_large", 1)
			what := "member"
			if t.HasID {
				what = "body"
			}
			complete = p.record(outcome{t.Entry, "dead", fmt.Sprintf(
				"%s is %d bytes, over DISPATCHER_MAX_MESSAGE_BYTES=%d", what, n, s.opt.MaxMessageBytes)})
			continue
		}
		if t.Props != nil {
			// Bad properties are the task's own fault: it alone is
			// dead-lettered, with the field named.
			props, err := shard.ParseProperties(t.Props)
			if err != nil {
				s.met.error("bad_properties", 1)
				complete = p.record(outcome{t.Entry, "dead", err.Error()})
				continue
			}
			t.props = &props
		}
		if t.DueMs*1000 > nowUs {
			later = append(later, heldTask{task: t, batch: p})
		} else {
			now = append(now, heldTask{task: t, batch: p})
		}
	}
	if len(later) > 0 {
		if back := s.hold.add(later); back != nil {
			s.settleAll(s.handBack(back)) // stopping: given back at once
		}
	}
	s.freeAhead(b.reserved) // its tasks ahead are counted by the holder now
	var settled []*progress
	if len(now) > 0 {
		settled = s.publishTasks(work, now)
	}
	published()
	if complete {
		settled = append(settled, p)
	}
	s.settleAll(settled)
}

// fire publishes held tasks that fell due, a batch's worth at a time (the
// publish of a whole burst due at one instant could outrun its leases),
// and settles the batches they completed.
func (s *Scanner) fire(tasks []heldTask) {
	for len(tasks) > 0 {
		n := min(len(tasks), max(s.opt.BatchSize, 1))
		s.settleAll(s.publishTasks(s.work, tasks[:n]))
		tasks = tasks[n:]
	}
}

// handBack records held tasks that will not be published by this instance
// (it is stopping): they go back into pending, as if never claimed, and
// are claimed again in time by any instance (see unclaimScript).
func (s *Scanner) handBack(tasks []heldTask) []*progress {
	var out []*progress
	for _, t := range tasks {
		if t.batch.record(outcome{entry: t.task.Entry, mode: outUnclaimed}) {
			out = append(out, t.batch)
		}
	}
	return out
}

// publishTasks publishes tasks that are due, in one publish, and records
// each one's outcome in its batch. It returns the batches it completed.
func (s *Scanner) publishTasks(work context.Context, tasks []heldTask) []*progress {
	tasks, out := s.gate(work, tasks)
	tasks, dead := s.pastDeadline(tasks)
	out = append(out, dead...)
	if len(tasks) == 0 {
		return out
	}
	msgs := make([]publisher.Message, 0, len(tasks))
	// Publishing ends before the earliest lease of the tasks' batches
	// does, less a margin to settle: past it another instance may take
	// them over. What is not confirmed by then counts as timed out and is
	// retried.
	margin := min(time.Second, s.opt.Lease/4)
	leaseLeft := time.Duration(1<<63 - 1)
	var publishedUs int64
	at := make([]int64, len(tasks))      // publish time, server µs
	meantMs := make([]int64, len(tasks)) // the due time meant (checkScore), -1 if none
	for n, t := range tasks {
		b := t.batch.b
		if n == 0 || t.batch != tasks[n-1].batch {
			publishedUs = s.clock.serverNowUs(b.shard)
			leaseLeft = min(leaseLeft, time.Duration(b.deadline*1000-publishedUs)*time.Microsecond-margin)
		}
		meant, dated := s.checkScore(b.shard, t.task)
		if !dated {
			meant = -1 // no lateness to observe
		}
		at[n], meantMs[n] = publishedUs, meant
		h := shard.Hash(t.task.Member) // once, for the message id and the shard check
		m := s.message(t.task, h)
		if n := uint64(s.layoutM.Load()); n > 0 && int(h%n) != b.shard {
			// A producer hashing with another shard count wrote it: one
			// still on the old count during a change, or a misconfigured one.
			s.met.misplaced(1)
		}
		if s.opt.StampPublished {
			m.PublishedUs = publishedUs
		}
		msgs = append(msgs, m)
	}
	var ends []func(error)
	if s.opt.Tracer != nil {
		for n := range msgs {
			if _, ok := msgs[n].Headers["traceparent"].(string); ok {
				if ends == nil {
					ends = make([]func(error), len(msgs))
				}
				ends[n] = s.opt.Tracer.Start(s.opt.Queue, &msgs[n])
			}
		}
	}
	leased, cancel := context.WithTimeout(work, leaseLeft)
	defer cancel()
	still := s.stillLive(tasks)
	errs := s.pub.PublishGated(leased, msgs, still)
	s.isolateRefused(leased, msgs, errs, still)
	for n, end := range ends {
		if end != nil {
			end(errs[n])
		}
	}
	if work.Err() == nil {
		for n, err := range errs {
			if errors.Is(err, publisher.ErrStopped) {
				errs[n] = publisher.ErrTimeout // the lease ran short, not a stop
			}
		}
	}

	var confirmed, lapsed int
	var failed []error // the task's fault, or the broker's view of it: retried
	for n, err := range errs {
		t := tasks[n]
		kind := publisher.Kind(err)
		var le *publisher.LostError
		var last bool
		switch {
		case err == nil:
			if meantMs[n] >= 0 {
				s.met.late(float64(at[n]/1000-meantMs[n]) / 1000)
			}
			last = t.batch.record(outcome{entry: t.task.Entry, mode: outAcked})
			confirmed++
		case kind == "refused" && errors.As(err, &le):
			last = t.batch.record(outcome{t.task.Entry, "poison", "broker refused it: " + le.Error()})
			failed = append(failed, err)
		case kind == "returned" && s.opt.Unroutable == UnroutableDrop:
			last = t.batch.record(s.drop(t, err))
		case kind == "returned" && s.opt.Unroutable == UnroutableDeadLetter:
			last = t.batch.record(outcome{t.task.Entry, outUnroutable, "unroutable: " + err.Error()})
			failed = append(failed, err)
		case kind == "returned" && t.task.props != nil && t.task.props.RoutingKey != "":
			// Unroutable by its own routing key: a producer's key nothing
			// is bound to is the task's fault, dead after MAX_ATTEMPTS
			// (the queue's own key unbound is the operator's: retried).
			last = t.batch.record(outcome{t.task.Entry, "poison", "unroutable by its own routing_key " + strconv.Quote(t.task.props.RoutingKey) + ": " + err.Error()})
			failed = append(failed, err)
		case kind == "nack" || kind == "returned" || kind == "timeout" || kind == "channel":
			last = t.batch.record(outcome{t.task.Entry, "retry", err.Error()})
			failed = append(failed, err)
		case errors.Is(err, errLapsed):
			// Not published: handed back (a no-op if another instance
			// took the claim over already).
			last = t.batch.record(outcome{entry: t.task.Entry, mode: outReleased})
			lapsed++
		default: // lost, not_connected, stopped: not the task's fault
			last = t.batch.record(outcome{entry: t.task.Entry, mode: outReleased})
			if kind != "stopped" {
				s.lim.Warn("publish:"+kind, "publish failed; task handed back", "shard", t.batch.b.shard, "kind", kind, "err", err)
			}
		}
		if err != nil {
			s.met.error(kind, 1)
		}
		if last {
			out = append(out, t.batch)
		}
	}
	if lapsed > 0 {
		s.met.error("fenced", lapsed)
		s.lim.Warn("lapsed", "liveness lapsed while a publish waited for the broker: the tasks not yet written are handed back, not published", "tasks", lapsed)
	}
	s.causes.published(time.Now(), confirmed, failed)
	if confirmed > 0 {
		s.ackEarly(tasks)
	}
	return out
}

func (s *Scanner) settleAll(ps []*progress) {
	for _, p := range ps {
		s.settleBatch(p)
	}
}

// settleBatch writes a complete batch's outcomes to Redis.
func (s *Scanner) settleBatch(p *progress) {
	defer p.done()
	b := p.b
	// Settling must outlive a stopping daemon: give it its own deadline.
	// Fail and release act only on entries still under this batch's lease,
	// so settling late cannot disturb an instance that took them over.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.work), 15*time.Second)
	defer cancel()
	// The acks go with the next flush, all shards' in one call; once acks
	// have stopped, from here.
	if acked := p.unacked(); len(acked) > 0 && !s.ackSettled(b.shard, acked) {
		if err := s.settle(ctx, func(ctx context.Context) error {
			_, err := s.st.ack(ctx, b.shard, acked)
			return err
		}); err != nil {
			s.ackFailed(b.shard, len(acked), err)
		} else {
			s.acked(len(acked))
		}
	}
	if err := s.settle(ctx, func(ctx context.Context) error { return s.fail(ctx, b, p.fails) }); err != nil {
		s.lim.Error("fail", "could not record failed publishes; their lease will retry them", "shard", b.shard, "err", err)
	}
	s.forgetDropped(ctx, b, p.dropped)
	if err := s.settle(ctx, func(ctx context.Context) error {
		n, err := s.st.release(ctx, b.shard, b.deadline, p.released)
		s.met.returned(n)
		return err
	}); err != nil {
		s.lim.Error("release", "could not hand tasks back at once; their lease will", "shard", b.shard, "err", err)
	}
	if err := s.settle(ctx, func(ctx context.Context) error {
		back, released, err := s.st.unclaim(ctx, b.shard, b.deadline, p.unclaim)
		s.met.returned(back + released)
		return err
	}); err != nil {
		s.lim.Error("unclaim", "could not put held tasks back into pending; their lease will return them", "shard", b.shard, "err", err)
	}
}

func (s *Scanner) message(t Task, hash uint64) publisher.Message {
	m := publisher.Message{
		Exchange:   s.opt.Exchange,
		RoutingKey: s.opt.RoutingKey,
		Body:       t.Payload(),
		MessageID:  shard.MessageIDOf(hash, t.DueMs),
		DueMs:      t.DueMs,
	}
	if t.HasID {
		m.TaskID = string(t.Member)
	}
	if p := t.props; p != nil {
		if p.RoutingKey != "" {
			m.RoutingKey = p.RoutingKey
		}
		if len(p.Headers) > 0 {
			// A copy: a tracer may rewrite the trace context of this
			// publish only.
			m.Headers = make(map[string]any, len(p.Headers))
			for k, v := range p.Headers {
				m.Headers[k] = v
			}
		}
		m.ContentType, m.ContentEncoding, m.CorrelationID = p.ContentType, p.ContentEncoding, p.CorrelationID
		m.ReplyTo, m.Type = p.ReplyTo, p.Type
		s.withAMQPProps(&m, p)
		if p.Priority != nil {
			m.Priority = uint8(*p.Priority)
		}
		if p.ExpirationMs != nil {
			m.Expiration = strconv.FormatInt(*p.ExpirationMs, 10)
		}
	}
	return m
}

// pastDeadline dead-letters the tasks whose properties' deadline_ms the
// Redis clock has passed (an outage, a pause, a backlog or a rate limit
// kept them): they are not published late. It returns the others and the
// batches it completed.
func (s *Scanner) pastDeadline(tasks []heldTask) ([]heldTask, []*progress) {
	var keep []heldTask // nil while every task so far is kept
	var done []*progress
	for n, t := range tasks {
		if p := t.task.props; p != nil && p.DeadlineMs != nil {
			// The lower bound of the Redis clock, the reading that lets a
			// held task go out: a task due at its deadline is published.
			if nowMs := s.clock.surelyUs(t.batch.b.shard) / 1000; nowMs > *p.DeadlineMs {
				if keep == nil {
					keep = append(make([]heldTask, 0, len(tasks)), tasks[:n]...)
				}
				s.met.error("deadline", 1)
				why := fmt.Sprintf("deadline passed: deadline_ms %d, %d ms before it could be published (Redis clock)", *p.DeadlineMs, nowMs-*p.DeadlineMs)
				if t.batch.record(outcome{t.task.Entry, "dead", why}) {
					done = append(done, t.batch)
				}
				continue
			}
		}
		if keep != nil {
			keep = append(keep, t)
		}
	}
	if keep == nil {
		return tasks, nil
	}
	return keep, done
}

// isolateRefused publishes again, each on a channel of its own, the
// messages that failed because the broker closed the shared channel over
// something it refused: one poison message takes down everything in
// flight on that channel, and only a message refused on its own channel
// is surely the poison. It stops when ctx (the batch's lease) ends: what
// is not isolated by then is retried later.
func (s *Scanner) isolateRefused(ctx context.Context, msgs []publisher.Message, errs []error, still func(int) error) {
	for n, err := range errs {
		if publisher.Kind(err) != "refused" {
			continue
		}
		if ctx.Err() != nil {
			errs[n] = publisher.ErrStopped
			continue
		}
		wait, cancelWait := context.WithTimeout(ctx, 10*time.Second)
		err := s.pub.WaitReady(wait)
		cancelWait()
		if err != nil {
			errs[n] = publisher.ErrNotConnected
			continue
		}
		var stillN func() error
		if still != nil {
			if err := still(n); err != nil { // the wait may have outlasted the liveness gate
				errs[n] = err
				continue
			}
			stillN = func() error { return still(n) } // and so may opening the channel
		}
		errs[n] = s.pub.PublishAlone(ctx, msgs[n], stillN)
	}
}

// errLapsed: the liveness gate, passed before a publish, no longer held
// after the publish waited (for room among the unconfirmed publishes, or
// for the broker): the task was not written.
var errLapsed = errors.New("liveness lapsed while the publish waited: not published")

// stillLive re-checks the liveness gate for tasks[n] after a wait, nil
// without liveness. Past the gate, nothing stops a claim from being handed
// to another instance once this one's heartbeats are too old (see gate).
func (s *Scanner) stillLive(tasks []heldTask) func(int) error {
	lv := s.opt.Liveness
	if lv == nil {
		return nil
	}
	return func(n int) error {
		if ok, _ := lv.Check(tasks[n].batch.b.owner); !ok {
			return errLapsed
		}
		return nil
	}
}

// settle runs a Redis write, retrying briefly: a task not settled is not
// lost (its lease brings it back) but would go out twice. Every write is
// safe to run twice (see scripts.go).
func (s *Scanner) settle(ctx context.Context, f func(context.Context) error) error {
	var err error
	for delay := 20 * time.Millisecond; ; delay *= 2 {
		if err = f(ctx); err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

func (s *Scanner) fail(ctx context.Context, b batch, fails []outcome) error {
	fails, unroutable := s.splitUnroutable(fails)
	retried, dead, err := s.st.fail(ctx, b.shard, b.deadline, fails)
	if err != nil {
		return err
	}
	r, d, err := s.st.failAfter(ctx, b.shard, b.deadline, s.unroutableAttempts(), unroutable)
	if err != nil {
		return err
	}
	retried, dead = retried+r, dead+d
	s.met.retried(retried)
	if dead > 0 {
		s.met.dead(dead)
		s.log.Error("tasks moved to the dead-letter set", "shard", b.shard, "key", s.keys.Dead(b.shard), "tasks", dead)
	}
	return nil
}
