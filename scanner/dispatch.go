package scanner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// failed is one in-flight entry to hand to the fail script.
type failed struct {
	entry  string
	mode   string // retry, poison or dead
	reason string
}

// dispatch publishes one claimed batch and settles every task of it in
// Redis: confirmed ones leave the in-flight set, failed ones are retried
// with backoff or dead-lettered, and those that never reached the broker
// are handed back (lease 0). If the process dies anywhere in here, the tasks are
// still in the in-flight set and their lease brings them back. published
// is called once publishing is over: settling needs no publish slot, and a
// primary that went away while its batch was out must not keep the slots
// from the other primaries' shards.
func (s *Scanner) dispatch(work context.Context, b batch, published func()) {
	defer published()
	var (
		acked    []string
		fails    []failed
		released []string
		sent     []Task
		msgs     []publisher.Message
	)
	for _, t := range b.tasks {
		if len(t.Member) > s.opt.MaxMessageBytes {
			s.met.error("too_large", 1)
			fails = append(fails, failed{t.Entry, "dead", fmt.Sprintf(
				"member is %d bytes, over DISPATCHER_MAX_MESSAGE_BYTES=%d", len(t.Member), s.opt.MaxMessageBytes)})
			continue
		}
		if shard.LooksLikeSeconds(t.DueMs) {
			s.met.secondsScore(1)
			s.lim.Warn("seconds", "score looks like seconds since the epoch, not milliseconds; dispatching it now as due",
				"shard", b.shard, "key", s.keys.Pending(b.shard), "score", t.DueMs)
		}
		sent = append(sent, t)
		msgs = append(msgs, s.message(t))
	}

	// Publishing ends before the batch's lease does, less a margin to
	// settle: past it another instance may take the tasks over. What is
	// not confirmed by then counts as timed out and is retried.
	margin := min(time.Second, s.opt.Lease/4)
	leased, cancel := context.WithTimeout(work, time.Duration(b.deadline-s.serverNow(b.shard))*time.Millisecond-margin)
	defer cancel()
	publishedUs := s.serverNowUs(b.shard)
	publishedAt := publishedUs / 1000
	if s.opt.StampPublished {
		for n := range msgs {
			msgs[n].PublishedUs = publishedUs
		}
	}
	errs := s.pub.Publish(leased, msgs)
	s.isolateRefused(leased, msgs, errs)
	published()
	if work.Err() == nil {
		for n, err := range errs {
			if errors.Is(err, publisher.ErrStopped) {
				errs[n] = publisher.ErrTimeout // the lease ran short, not a stop
			}
		}
	}

	for n, err := range errs {
		t := sent[n]
		kind := publisher.Kind(err)
		var le *publisher.LostError
		switch {
		case err == nil:
			acked = append(acked, t.Entry)
			s.met.late(float64(publishedAt-t.DueMs) / 1000)
		case kind == "refused" && errors.As(err, &le):
			fails = append(fails, failed{t.Entry, "poison", "broker refused it: " + le.Error()})
		case kind == "nack" || kind == "returned" || kind == "timeout" || kind == "channel":
			fails = append(fails, failed{t.Entry, "retry", err.Error()})
		default: // lost, not_connected, stopped: not the task's fault
			released = append(released, t.Entry)
		}
		if err != nil {
			s.met.error(kind, 1)
			if kind != "stopped" {
				s.lim.Warn("publish:"+kind, "publish failed; task kept for retry", "shard", b.shard, "kind", kind, "err", err)
			}
		}
	}

	// Settling must outlive a stopping daemon: give it its own deadline.
	// Fail and release act only on entries still under this batch's lease,
	// so settling late cannot disturb an instance that took them over.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), 15*time.Second)
	defer cancel()
	if err := s.settle(ctx, func(ctx context.Context) error {
		_, err := s.st.ack(ctx, b.shard, acked)
		return err
	}); err != nil {
		s.met.error("ack", 1)
		s.lim.Error("ack", "could not forget confirmed tasks; their lease will send them again", "shard", b.shard, "tasks", len(acked), "err", err)
	} else {
		s.met.dispatched(len(acked))
		if len(acked) > 0 {
			s.lastAcked.Store(time.Now().UnixNano())
		}
	}
	if err := s.settle(ctx, func(ctx context.Context) error { return s.fail(ctx, b, fails) }); err != nil {
		s.lim.Error("fail", "could not record failed publishes; their lease will retry them", "shard", b.shard, "err", err)
	}
	if err := s.settle(ctx, func(ctx context.Context) error {
		n, err := s.st.release(ctx, b.shard, b.deadline, released)
		s.met.returned(n)
		return err
	}); err != nil {
		s.lim.Error("release", "could not hand tasks back at once; their lease will", "shard", b.shard, "err", err)
	}
}

func (s *Scanner) message(t Task) publisher.Message {
	return publisher.Message{
		Exchange:   s.opt.Exchange,
		RoutingKey: s.opt.RoutingKey,
		Body:       t.Member,
		MessageID:  shard.MessageID(t.Member, t.DueMs),
		DueMs:      t.DueMs,
	}
}

// isolateRefused publishes again, each on a channel of its own, the
// messages that failed because the broker closed the shared channel over
// something it refused: one poison message takes down everything in
// flight on that channel, and only a message refused on its own channel
// is surely the poison. It stops when ctx (the batch's lease) ends: what
// is not isolated by then is retried later.
func (s *Scanner) isolateRefused(ctx context.Context, msgs []publisher.Message, errs []error) {
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
		errs[n] = s.pub.PublishAlone(ctx, msgs[n])
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

func (s *Scanner) fail(ctx context.Context, b batch, fails []failed) error {
	retried, dead, err := s.st.fail(ctx, b.shard, b.deadline, fails)
	if err != nil {
		return err
	}
	s.met.retried(retried)
	if dead > 0 {
		s.met.dead(dead)
		s.log.Error("tasks moved to the dead-letter set", "shard", b.shard, "key", s.keys.Dead(b.shard), "tasks", dead)
	}
	return nil
}
