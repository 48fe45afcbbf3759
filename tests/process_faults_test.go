package tests

import (
	"context"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/shard"
)

// recorder keeps every delivery of one queue in arrival order, as soon as
// it arrives, and passes each on to h.got, where collect and verify read it.
type recorder struct {
	mu   sync.Mutex
	rs   []received
	more chan struct{} // signalled when rs grows
}

// record puts a recorder between the queue's consumer and h.got.
func (h *harness) record(queue string) *recorder {
	in := h.got[queue]
	out := make(chan amqp.Delivery)
	done := make(chan struct{})
	r := &recorder{more: make(chan struct{}, 1)}
	// Reader: records at once, never waits for the test to read.
	go func() {
		for d := range in {
			r.mu.Lock()
			r.rs = append(r.rs, received{at: time.Now(), d: d})
			r.mu.Unlock()
			select {
			case r.more <- struct{}{}:
			default:
			}
		}
	}()
	// Forwarder: hands the recorded deliveries on, in order.
	go func() {
		for next := 0; ; {
			r.mu.Lock()
			n := len(r.rs)
			var d amqp.Delivery
			if next < n {
				d = r.rs[next].d
			}
			r.mu.Unlock()
			if next == n {
				select {
				case <-r.more:
					continue
				case <-done:
					return
				}
			}
			select {
			case out <- d:
				next++
			case <-done:
				return
			}
		}
	}()
	// Registered after the consumer's cleanup, so it runs first: the
	// forwarder stops, and the reader ends when the consumer's channel
	// closes.
	h.t.Cleanup(func() { close(done) })
	h.got[queue] = out
	return r
}

// all returns the deliveries recorded so far.
func (r *recorder) all() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.rs...)
}

// TestSIGTERMDuringLargeBatch stops a dispatcher with SIGTERM while it is
// publishing claims of up to 1000 tasks (the most a claim takes; the 5000
// asked for, valid before, is taken as 1000 with a warning) from a large backlog: it waits for
// the outstanding confirms, returns what it had not published to pending,
// exits 0 and leaves nothing in flight; a new instance sends the rest.
// No task may arrive twice: a clean stop forgets exactly what the broker
// confirmed.
func TestSIGTERMDuringLargeBatch(t *testing.T) {
	h := newHarness(t, queueSpec{Name: "bigterm", Shards: 8})
	h.extra["DISPATCHER_BATCH_SIZE"] = "5000"
	// Long enough that every outstanding confirm arrives even on a busy
	// machine: a confirm given up on would count as a duplicate later.
	h.extra["DISPATCHER_SHUTDOWN_TIMEOUT"] = "60s"
	rec := h.record("bigterm")
	// The backlog is due already when the dispatcher starts.
	want := scheduleSpread(t, h.producer("bigterm"), "bt", 40000, time.Now().Add(-2*time.Second), 2*time.Second)
	p := h.start()

	var inflight int64
	eventually(t, 10*time.Second, "the warning that BATCH_SIZE is taken as 1000", func() bool {
		return strings.Contains(p.out.String(), "DISPATCHER_BATCH_SIZE=5000 is more than one claim takes: using 1000")
	})
	eventually(t, 30*time.Second, "a large claim in flight", func() bool {
		_, inflight, _ = h.leftovers(h.queues[0])
		return inflight >= 2000
	})
	verifyWhile(h, "bigterm", want, 90*time.Second, 0, func() {
		p.signal(syscall.SIGTERM)
		if code := p.exitCode(90 * time.Second); code != 0 {
			t.Errorf("exit code %d after SIGTERM", code)
			return
		}
		pending, left, dead := h.leftovers(h.queues[0])
		time.Sleep(300 * time.Millisecond) // the last confirmed deliveries reach the consumer
		t.Logf("SIGTERM with %d in flight: %d delivered before the stop, %d back in pending, %d in flight, %d dead",
			inflight, len(rec.all()), pending, left, dead)
		if left != 0 || dead != 0 {
			t.Errorf("%d tasks left in flight, %d dead after a clean stop", left, dead)
		}
		if int(pending) >= len(want) || pending == 0 {
			t.Errorf("%d of %d pending after the stop: the signal did not land mid-backlog", pending, len(want))
		}
		h.start()
	})
}

// TestAllInstancesDown stops every instance (SIGTERM) for a while under
// steady traffic, then starts them again: tasks that fell due meanwhile go
// out at once, oldest first, so the worst lateness is about the outage.
//
// Oldest first is measured on the backlog (tasks due during the outage):
// at least 90% of its earliest-due quarter must arrive before the median
// of its latest-due quarter. It is approximate by design: claims take the
// oldest BATCH_SIZE tasks of a shard, but several shards are claimed and
// published in parallel, so order holds to about shards*batch tasks.
func TestAllInstancesDown(t *testing.T) {
	const outage = 3 * time.Second
	h := newHarness(t, queueSpec{Name: "down", Shards: 8})
	h.extra["DISPATCHER_BATCH_SIZE"] = "100"
	rec := h.record("down")
	procs := []*proc{h.start(), h.start()}
	start := time.Now().Add(500 * time.Millisecond)
	want := scheduleSpread(t, h.producer("down"), "d", 12000, start, 8*time.Second)

	var stopAt, restartAt time.Time
	o := verifyWhile(h, "down", want, 60*time.Second, 0, func() {
		time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
		stopAt = time.Now()
		for _, p := range procs {
			p.signal(syscall.SIGTERM)
		}
		for _, p := range procs {
			if code := p.exitCode(30 * time.Second); code != 0 {
				t.Errorf("exit code %d after SIGTERM", code)
			}
		}
		if _, f, _ := h.leftovers(h.queues[0]); f != 0 {
			t.Errorf("%d tasks in flight with every instance stopped", f)
		}
		time.Sleep(time.Until(stopAt.Add(outage)))
		restartAt = time.Now()
		h.start()
		h.start()
	})

	// The task due right after the stop waited the whole outage; if
	// anything waited for a lease (30s) or a slow poll after the restart,
	// the worst lateness shows it.
	if o.WorstLate < outage-500*time.Millisecond {
		t.Errorf("worst lateness %s, under the %s outage: the instances were not down", o.WorstLate, outage)
	}
	if o.WorstLate > outage+10*time.Second {
		t.Errorf("worst lateness %s for a %s outage: the backlog did not go out at once after the restart", o.WorstLate, outage)
	}

	// Arrival rank of each backlog task (first arrival only).
	stopMs, restartMs := stopAt.UnixMilli(), restartAt.UnixMilli()
	rank := map[string]int{}
	for _, r := range rec.all() {
		due, ok := want[r.d.MessageId]
		if _, seen := rank[r.d.MessageId]; ok && !seen && due >= stopMs && due < restartMs {
			rank[r.d.MessageId] = len(rank)
		}
	}
	var backlog []string
	for id, due := range want {
		if due >= stopMs && due < restartMs {
			backlog = append(backlog, id)
		}
	}
	sort.Slice(backlog, func(a, b int) bool { return want[backlog[a]] < want[backlog[b]] })
	q := len(backlog) / 4
	if q < 500 {
		t.Fatalf("backlog of %d tasks is too small to judge the order", len(backlog))
	}
	var last []int
	for _, id := range backlog[len(backlog)-q:] {
		last = append(last, rank[id])
	}
	sort.Ints(last)
	median := last[len(last)/2]
	early := 0
	for _, id := range backlog[:q] {
		if r, ok := rank[id]; ok && r < median {
			early++
		}
	}
	share := float64(early) / float64(q)
	t.Logf("outage %s: backlog %d tasks; %.1f%% of its earliest-due quarter arrived before the median of its latest-due quarter",
		outage, len(backlog), 100*share)
	if share < 0.9 {
		t.Errorf("backlog not sent oldest first: only %.1f%% of the earliest-due quarter before the latest quarter's median", 100*share)
	}
}

// exitCode waits up to timeout for p to exit and returns its exit code,
// or -1 if it did not exit; unlike wait, it is safe off the test goroutine.
func (p *proc) exitCode(timeout time.Duration) int {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		return -1
	}
}

// scheduleAt schedules members at one due time and returns their ids.
func scheduleAt(t *testing.T, p *shard.Producer, due time.Time, members ...[]byte) map[string]int64 {
	t.Helper()
	want := map[string]int64{}
	var tasks []shard.Task
	for _, m := range members {
		tasks = append(tasks, shard.Task{Member: m, Due: due})
		want[shard.MessageID(m, due.UnixMilli())] = due.UnixMilli()
	}
	if err := p.ScheduleMany(context.Background(), tasks); err != nil {
		t.Fatal(err)
	}
	return want
}
