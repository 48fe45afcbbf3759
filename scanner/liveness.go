package scanner

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// owner is the liveness id claims are recorded under now ("": none).
func (s *Scanner) owner() string {
	if s.opt.Liveness == nil {
		return ""
	}
	return s.opt.Liveness.ID()
}

// Steady work is shared: while two or more live instances serve the
// queue (Liveness.Members), each sweeps, and so claims ahead from, its own
// share of the shards (shard i: the (i mod n)-th member), instead of the
// sweeper role holder doing it all; the role keeps its other duties. With
// one instance, no liveness, or one's own liveness lapsed, the role holder
// sweeps every shard, as before. A change of members moves shards at once:
// for a heartbeat's time a shard may be swept by two instances (a claim
// finds nothing) or by none (its tasks wait for the next heartbeat).

// share returns this instance's place among the queue's live members and
// their number; n < 2: not shared.
func (s *Scanner) share() (at, n int) {
	lv := s.opt.Liveness
	if lv == nil {
		return 0, 0
	}
	m := lv.Members(s.opt.Queue)
	at = slices.Index(m, lv.ID())
	if at < 0 || len(m) < 2 {
		return 0, 0
	}
	return at, len(m)
}

// sweeps reports whether this instance sweeps any of the queue's shards.
func (s *Scanner) sweeps() bool {
	if s.role.leader {
		return true
	}
	_, n := s.share()
	return n >= 2
}

// mine reports whether this instance sweeps shard i.
func (s *Scanner) mine(i, at, n int) bool {
	if n < 2 {
		return s.role.leader
	}
	return i%n == at
}

// shareHolder is a liveness that can leave a queue out of the instance's record
// (internal/liveness's Hold).
type shareHolder interface{ Hold(queue string, held bool) }

// holdShare leaves the queue out of this instance's liveness record while
// it cannot publish (held), so that the others sweep its share of the
// shards, or puts it back.
func (s *Scanner) holdShare(held bool) {
	if h, ok := s.opt.Liveness.(shareHolder); ok {
		h.Hold(s.opt.Queue, held)
	}
}

// livenessPoll is how often a publish held by a lapsed liveness looks
// again.
const livenessPoll = 10 * time.Millisecond

// gate holds back tasks while the instance's liveness has lapsed (its last
// heartbeat is too old: another instance may soon declare it dead), and
// returns those it may publish and the batches it completed: tasks claimed
// under a liveness id declared dead are given up, never published, since
// their claims were handed out to other instances. Such a task is
// released (lease 0, only while its lease is still its claim's): a claim
// answered after the one hand-back of the dead id would otherwise wait out
// its lease, and one the hand-back reached is left as it is.
func (s *Scanner) gate(work context.Context, tasks []heldTask) (keep []heldTask, done []*progress) {
	lv := s.opt.Liveness
	if lv == nil || s.allLive(tasks) {
		return tasks, nil // the usual case: no copy
	}
	record := func(t heldTask, mode string) {
		if t.batch.record(outcome{entry: t.task.Entry, mode: mode}) {
			done = append(done, t.batch)
		}
	}
	abandon := func(t heldTask) { record(t, outAbandoned) }
	given := 0
	defer func() {
		if given > 0 {
			s.met.error("fenced", given)
			s.lim.Warn("fenced", "this instance was declared dead: its claimed tasks are handed to other instances and not published here", "tasks", given)
		}
	}()
	for {
		var wait []heldTask
		for _, t := range tasks {
			switch ok, fenced := lv.Check(t.batch.b.owner); {
			case ok:
				keep = append(keep, t)
			case fenced:
				record(t, outReleased)
				given++
			default:
				wait = append(wait, t)
			}
		}
		if len(wait) == 0 {
			return keep, done
		}
		tasks = wait
		t := time.NewTimer(livenessPoll)
		select {
		case <-t.C:
		case <-work.Done():
			t.Stop()
			// Stopping with a lapsed liveness: left in flight for the
			// hand-back or their lease.
			for _, t := range tasks {
				abandon(t)
			}
			return keep, done
		}
	}
}

// allLive reports whether every task may be published now, asking the
// liveness once per batch (a publish's tasks come from few batches).
func (s *Scanner) allLive(tasks []heldTask) bool {
	var last *progress
	for _, t := range tasks {
		if t.batch == last {
			continue
		}
		last = t.batch
		if ok, _ := s.opt.Liveness.Check(t.batch.b.owner); !ok {
			return false
		}
	}
	return true
}

// HandBack hands out again at once, in every shard of the queue, the tasks
// that claims of the dead instance with liveness id owner still hold, and
// wakes the scanner to claim them. It returns how many it handed out.
func (s *Scanner) HandBack(ctx context.Context, owner string, shards int) (int, error) {
	if shards <= 0 {
		return 0, nil
	}
	run := func() ([]*redis.Cmd, error) {
		pipe := s.rdb.Pipeline()
		cmds := make([]*redis.Cmd, shards)
		for i := range shards {
			cmds[i] = s.st.handBackCmd(ctx, pipe, i, owner)
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := run()
	if slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return redis.HasErrorPrefix(c.Err(), "NOSCRIPT") }) {
		if err := handBackScript.Load(ctx, s.rdb).Err(); err != nil {
			return 0, fmt.Errorf("hand back %s's tasks of queue %s: load script: %w", owner, s.opt.Queue, err)
		}
		cmds, err = run()
	}
	err = nil // each command's own error says which shard failed
	n := 0
	for i, c := range cmds {
		got, cerr := c.Int()
		if cerr != nil {
			if err == nil {
				err = fmt.Errorf("hand back %s's tasks on %s: %w", owner, s.keys.Inflight(i), cerr)
			}
			continue
		}
		n += got
	}
	if n > 0 {
		s.met.returned(n)
		s.wake.kick()
	}
	return n, err
}
