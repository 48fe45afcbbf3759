package scanner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// secondsScoreBelow: a due time under 10^11 ms (March 1973) is almost surely
// a producer writing seconds; read as ms it is long past, so it goes out at
// once, but it is counted and logged so the producer bug gets noticed.
const secondsScoreBelow = 100_000_000_000

// failed is one in-flight entry to hand to the fail script.
type failed struct {
	entry  string
	mode   string // retry, poison or dead
	reason string
}

// dispatch publishes one claimed batch and settles every task of it in
// Redis: confirmed ones leave the in-flight set, failed ones are retried
// with backoff or dead-lettered, and those that never reached the broker
// go back to pending. If the process dies anywhere in here, the tasks are
// still in the in-flight set and their lease brings them back.
func (s *Scanner) dispatch(work context.Context, b batch) {
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
		if t.DueMs > 0 && t.DueMs < secondsScoreBelow {
			s.met.secondsScore(1)
			s.lim.Warn("seconds", "score looks like seconds since the epoch, not milliseconds; dispatching it now as due",
				"shard", b.shard, "key", s.keys.Pending(b.shard), "score", t.DueMs)
		}
		sent = append(sent, t)
		msgs = append(msgs, s.message(t))
	}

	publishedAt := s.serverNow()
	errs := s.pub.Publish(work, msgs)
	s.isolateRefused(work, msgs, errs)

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
	ctx, cancel := context.WithTimeout(context.WithoutCancel(work), 15*time.Second)
	defer cancel()
	if err := s.settle(ctx, func(ctx context.Context) error { return s.ack(ctx, b.shard, acked) }); err != nil {
		s.met.error("ack", 1)
		s.lim.Error("ack", "could not forget confirmed tasks; their lease will send them again", "shard", b.shard, "tasks", len(acked), "err", err)
	} else {
		s.met.dispatched(len(acked))
	}
	if err := s.settle(ctx, func(ctx context.Context) error { return s.fail(ctx, b.shard, fails) }); err != nil {
		s.lim.Error("fail", "could not record failed publishes; their lease will retry them", "shard", b.shard, "err", err)
	}
	if err := s.settle(ctx, func(ctx context.Context) error { return s.release(ctx, b.shard, released) }); err != nil {
		s.lim.Error("release", "could not return tasks to pending; their lease will", "shard", b.shard, "err", err)
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
// is surely the poison.
func (s *Scanner) isolateRefused(work context.Context, msgs []publisher.Message, errs []error) {
	for n, err := range errs {
		if publisher.Kind(err) != "refused" {
			continue
		}
		wait, cancel := context.WithTimeout(work, 10*time.Second)
		err := s.pub.WaitReady(wait)
		cancel()
		if err != nil {
			errs[n] = publisher.ErrNotConnected
			continue
		}
		errs[n] = s.pub.PublishAlone(work, msgs[n])
	}
}

// settle runs a Redis write, retrying briefly: a task not settled is not
// lost (its lease brings it back) but would go out twice.
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

// ack forgets confirmed tasks.
func (s *Scanner) ack(ctx context.Context, i int, entries []string) error {
	if len(entries) == 0 {
		return nil
	}
	err := ackScript.Run(ctx, s.rdb, []string{s.keys.Inflight(i), s.keys.Attempts(i)}, anys(entries)...).Err()
	if err != nil {
		return fmt.Errorf("ack %d tasks on %s: %w", len(entries), s.keys.Inflight(i), err)
	}
	return nil
}

func (s *Scanner) fail(ctx context.Context, i int, fails []failed) error {
	if len(fails) == 0 {
		return nil
	}
	args := []any{s.opt.RetryMin.Milliseconds(), s.opt.RetryMax.Milliseconds(), s.opt.MaxAttempts}
	for _, f := range fails {
		args = append(args, f.entry, f.mode, f.reason)
	}
	keys := []string{s.keys.Inflight(i), s.keys.Attempts(i), s.keys.Dead(i), s.keys.DeadReason(i)}
	res, err := failScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("record %d failed publishes on %s: %w", len(fails), s.keys.Inflight(i), err)
	}
	s.met.retried(int(res[0]))
	if res[1] > 0 {
		s.met.dead(int(res[1]))
		s.log.Error("tasks moved to the dead-letter set", "shard", i, "key", s.keys.Dead(i), "tasks", res[1])
	}
	return nil
}

func (s *Scanner) release(ctx context.Context, i int, entries []string) error {
	if len(entries) == 0 {
		return nil
	}
	n, err := releaseScript.Run(ctx, s.rdb, []string{s.keys.Inflight(i), s.keys.Pending(i)}, anys(entries)...).Int()
	if err != nil {
		return fmt.Errorf("return %d tasks to %s: %w", len(entries), s.keys.Pending(i), err)
	}
	s.met.returned(n)
	return nil
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
