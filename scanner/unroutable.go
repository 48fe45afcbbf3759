package scanner

import (
	"context"

	"github.com/dispatcher/dispatcher/shard"
)

// What a task the broker returns as unroutable (published mandatory, no
// queue bound for its routing key) gets: Options.Unroutable.
const (
	// UnroutableRetry ("" too): retried with backoff, without limit when
	// it went with the queue's own routing key (an operator's missing
	// binding), dead-lettered after MaxAttempts returns when it went with
	// a routing key of its own (the task's fault).
	UnroutableRetry = "retry"
	// UnroutableDeadLetter: dead-lettered after UnroutableAttempts
	// returns (MaxAttempts if 0), whatever its routing key.
	UnroutableDeadLetter = "dead-letter"
	// UnroutableDrop: forgotten at its first return, as the delayed-message
	// plugin dropped it, counted and logged: it leaves the in-flight set
	// as a confirmed task does (the ack script), unpublished.
	UnroutableDrop = "drop"
)

// Outcomes of a returned task under UnroutableDeadLetter and UnroutableDrop.
const (
	// outUnroutable is a fail mode: "poison" after UnroutableAttempts.
	outUnroutable = "unroutable"
	// outDropped: forgotten unpublished (UnroutableDrop).
	outDropped = "dropped"
)

// drop is the outcome of a returned task under UnroutableDrop, counted and
// logged, one line per task: a drop is never silent.
func (s *Scanner) drop(t heldTask, err error) outcome {
	s.met.unroutableDropped(1)
	key := s.opt.RoutingKey
	if p := t.task.props; p != nil && p.RoutingKey != "" {
		key = p.RoutingKey
	}
	attrs := []any{"shard", t.batch.b.shard, "exchange", s.opt.Exchange, "routing_key", key,
		"message_id", shard.MessageID(t.task.Member, t.task.DueMs), "due_ms", t.task.DueMs}
	if t.task.HasID {
		attrs = append(attrs, "task_id", string(t.task.Member))
	} else {
		m := t.task.Member // its body: the first 64 bytes name it
		attrs = append(attrs, "member", string(m[:min(len(m), 64)]))
	}
	s.log.Warn("unroutable task dropped (UNROUTABLE=drop): "+err.Error(), attrs...)
	return outcome{entry: t.task.Entry, mode: outDropped}
}

// unroutableAttempts is the returns after which UnroutableDeadLetter
// dead-letters a task.
func (s *Scanner) unroutableAttempts() int {
	if s.opt.UnroutableAttempts > 0 {
		return s.opt.UnroutableAttempts
	}
	return s.opt.MaxAttempts
}

// splitUnroutable turns the outUnroutable fails into "poison" ones: those
// that go with the others (their attempts are MaxAttempts too), and those
// that need a fail call of their own, dead after unroutableAttempts.
func (s *Scanner) splitUnroutable(fails []outcome) (rest, own []outcome) {
	for _, f := range fails {
		if f.mode != outUnroutable {
			rest = append(rest, f)
			continue
		}
		f.mode = "poison"
		if s.unroutableAttempts() == s.opt.MaxAttempts {
			rest = append(rest, f)
		} else {
			own = append(own, f)
		}
	}
	return rest, own
}

// forgetDropped removes dropped tasks from the in-flight set, as an ack
// does: if that fails, their lease brings them back, to be published (and
// maybe dropped) again.
func (s *Scanner) forgetDropped(ctx context.Context, b batch, dropped []string) {
	if len(dropped) == 0 {
		return
	}
	if err := s.settle(ctx, func(ctx context.Context) error { _, err := s.st.ack(ctx, b.shard, dropped); return err }); err != nil {
		s.met.error("ack", 1)
		s.lim.Error("drop", "could not forget dropped unroutable tasks; their lease will send them again", "shard", b.shard, "tasks", len(dropped), "err", err)
	}
}
