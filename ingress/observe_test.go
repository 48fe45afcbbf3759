package ingress

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// clock is a settable clock for the observer.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func stamped(at time.Time) amqp.Delivery { // as RabbitMQ's interceptor stamps it
	return amqp.Delivery{Headers: amqp.Table{HeaderReceived: at.UnixMilli()}}
}

func newTestIngress(c *clock) *Ingress {
	return New(nil, nil, Options{Queue: "orders", Exchange: "orders.delayed", Now: c.now})
}

// TestOldestAge: the age of the oldest message not yet in Redis, as the
// observer knows it, step by step through a batch, a backlog, a lost
// session and an empty queue.
func TestOldestAge(t *testing.T) {
	c := &clock{t: time.UnixMilli(1_700_000_000_000)}
	g := newTestIngress(c)
	o := g.obs
	age := func() time.Duration { return g.Status().OldestAge }
	check := func(step string, want time.Duration) {
		t.Helper()
		if got := age(); got != want {
			t.Errorf("%s: oldest age %v, want %v", step, got, want)
		}
	}
	check("nothing known", 0)

	// A batch stamped by the broker 3 s and 1 s before it is taken.
	c.add(10 * time.Second)
	batch := []amqp.Delivery{stamped(c.t.Add(-3 * time.Second)), stamped(c.t.Add(-time.Second))}
	o.take(batch)
	check("batch taken", 3*time.Second)
	c.add(500 * time.Millisecond)
	check("batch being written", 3500*time.Millisecond)
	o.settled(batch)
	check("batch written, queue not read", 0)

	// The queue has a backlog: its messages came after the newest
	// settled (1.5 s ago now).
	o.read(amqp.Queue{Messages: 40, Consumers: 2}, nil)
	check("backlog after the batch", 1500*time.Millisecond)
	c.add(2 * time.Second)
	check("backlog, nothing taken", 3500*time.Millisecond)

	// A batch without the header: its arrival is when it was taken.
	o.take([]amqp.Delivery{{}, {}})
	check("unstamped batch taken (the backlog bound is older)", 3500*time.Millisecond)
	o.settled([]amqp.Delivery{{}, {}})
	check("unstamped batch written: the backlog came after it", 0)
	c.add(time.Second)
	check("backlog a second later", time.Second)

	// An empty read: the backlog is gone.
	o.read(amqp.Queue{Messages: 0}, nil)
	check("empty", 0)
	c.add(time.Minute)
	check("empty a minute later", 0)

	// Messages come; a read finds them before any is taken: they came
	// after the read before, which found none (an upper bound, within a
	// read interval).
	o.read(amqp.Queue{Messages: 0}, nil)
	c.add(5 * time.Second)
	o.read(amqp.Queue{Messages: 5}, nil)
	c.add(2 * time.Second)
	check("ready after an empty read", 7*time.Second)
	o.read(amqp.Queue{Messages: 0}, nil)
	check("taken by another instance", 0)

	// A session ends holding a batch: those messages go back to the
	// queue and still count, until a read finds it empty with nothing
	// held (another instance took them) or a batch is settled.
	o.consumingNow()
	o.take([]amqp.Delivery{stamped(c.t.Add(-4 * time.Second))})
	o.stopped(errors.New("connection lost"))
	c.add(time.Second)
	check("handed back on a lost session", 5*time.Second)
	o.read(amqp.Queue{Messages: 0}, nil)
	check("handed back, then the queue read empty", 0)

	// A clock behind the broker's: never negative.
	o.take([]amqp.Delivery{stamped(c.t.Add(time.Second))})
	check("stamped in the future", 0)
}

// TestReadiness: not consuming or a batch stuck longer than the threshold
// makes the instance not ready; an old message only says it is behind.
func TestReadiness(t *testing.T) {
	after := 30 * time.Second
	base := Status{Queue: "orders", IngressQueue: "dispatcher.ingress.orders", Consuming: true, Ready: 12, Consumers: 2,
		Now: time.Unix(1000, 0), Since: time.Unix(900, 0), ReadAt: time.Unix(999, 0)}
	for _, tc := range []struct {
		name             string
		edit             func(*Status)
		notReady, behind string
	}{
		{"consuming, on time", func(*Status) {}, "", ""},
		{"not consuming for 20s", func(s *Status) { s.Consuming, s.Since, s.Err = false, time.Unix(980, 0), "connection lost" }, "", ""},
		{"not consuming for 40s", func(s *Status) { s.Consuming, s.Since, s.Err = false, time.Unix(960, 0), "connection lost" },
			"queue orders: ingress not consuming dispatcher.ingress.orders for 40s: connection lost", ""},
		{"never connected", func(s *Status) { s.Consuming, s.Since = false, time.Unix(960, 0) },
			"queue orders: ingress not consuming dispatcher.ingress.orders for 40s: not connected yet", ""},
		{"batch held 31s", func(s *Status) { s.Held, s.HeldFor, s.OldestAge = 256, 31*time.Second, 33*time.Second },
			"queue orders: ingress stalled: 256 messages taken from dispatcher.ingress.orders 31s ago are not yet written to Redis",
			"queue orders: ingress behind: the oldest message not yet in Redis has waited 33s (over DISPATCHER_STALL_AFTER 30s); 12 ready in dispatcher.ingress.orders, 2 consumers, read 1s ago"},
		{"behind", func(s *Status) { s.OldestAge = 42 * time.Second },
			"", "queue orders: ingress behind: the oldest message not yet in Redis has waited 42s (over DISPATCHER_STALL_AFTER 30s); 12 ready in dispatcher.ingress.orders, 2 consumers, read 1s ago"},
		{"behind, never read", func(s *Status) { s.OldestAge, s.Ready = 42*time.Second, -1 },
			"", "queue orders: ingress behind: the oldest message not yet in Redis has waited 42s (over DISPATCHER_STALL_AFTER 30s)"},
	} {
		s := base
		tc.edit(&s)
		nr, b := s.Readiness(after)
		if nr != tc.notReady || b != tc.behind {
			t.Errorf("%s:\n got %q, %q\nwant %q, %q", tc.name, nr, b, tc.notReady, tc.behind)
		}
	}
}

// TestStatusCounts: the counts of the status follow the counters.
func TestStatusCounts(t *testing.T) {
	g := newTestIngress(&clock{t: time.Unix(1000, 0)})
	g.ingestedN(5)
	g.failed("bad_header", 2)
	g.failed("redis", 3)
	s := g.Status()
	if s.Ingested != 5 || s.Errors["bad_header"] != 2 || s.Errors["redis"] != 3 {
		t.Errorf("status counts: ingested %d, errors %v", s.Ingested, s.Errors)
	}
	if s.Consuming || s.Ready != -1 || !strings.HasPrefix(s.IngressQueue, "dispatcher.ingress.") {
		t.Errorf("fresh status: %+v", s)
	}
}
