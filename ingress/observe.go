package ingress

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// observer keeps what one queue's ingress shows of itself: whether it
// consumes, the ingress queue's depth as last read, the deliveries it
// holds, and from these the age of the oldest message not yet in Redis
// (docs/monitoring.md#amqp-ingress).
//
// A message's arrival is the broker's receive time, the header
// timestamp_in_ms, when it carries one (RabbitMQ's incoming-message
// interceptor sets it); else the time this instance took the delivery,
// which is later than the arrival by however long the message waited in
// the ingress queue: without the header, a backlog that is being
// consumed shows in the depth, not in the age.
type observer struct {
	queue string
	now   func() time.Time

	mu        sync.Mutex
	start     time.Time
	consuming bool
	since     time.Time // when consuming last started or stopped (start if never)
	err       string    // why the last session ended, or could not start

	// The ingress queue at the last read (passive declare).
	ready     int64 // messages ready; -1 before the first read
	consumers int
	readAt    time.Time
	readErr   string
	emptyAt   time.Time // the last read that found none ready

	// Deliveries taken and not yet settled: their count, when the batch
	// was taken and the oldest arrival among them.
	held       int
	heldSince  time.Time
	heldOldest time.Time
	// lost is the oldest arrival among deliveries a session ended with
	// unsettled: the broker hands them out again, so they are still not
	// in Redis. Cleared by the next batch settled or an empty read.
	lost time.Time
	// newest is the latest arrival among the deliveries settled.
	newest time.Time

	ingested int64            // tasks written since the start
	errors   map[string]int64 // refusals and Redis failures since the start, by cause
}

func newObserver(queue string, now func() time.Time) *observer {
	if now == nil {
		now = time.Now
	}
	t := now()
	return &observer{queue: queue, now: now, start: t, since: t, ready: -1, errors: map[string]int64{}}
}

// arrival is when the broker received d (timestamp_in_ms), else taken.
func arrival(d amqp.Delivery, taken time.Time) time.Time {
	if v, ok := d.Headers[HeaderReceived]; ok {
		if ms, ok := integer(v); ok && ms > 0 {
			return time.UnixMilli(ms)
		}
	}
	return taken
}

// consumingNow: a session consumes from now on.
func (o *observer) consumingNow() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.consuming, o.since, o.err = true, o.now(), ""
}

// stopped: the session ended (or could not start) with err.
func (o *observer) stopped(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.consuming {
		o.since = o.now()
	}
	o.consuming = false
	if err != nil {
		o.err = err.Error()
	}
	if o.held > 0 && (o.lost.IsZero() || o.heldOldest.Before(o.lost)) {
		o.lost = o.heldOldest
	}
	o.held = 0
}

// take: a batch of deliveries is being written.
func (o *observer) take(batch []amqp.Delivery) {
	now := o.now()
	var oldest time.Time
	for _, d := range batch {
		if a := arrival(d, now); oldest.IsZero() || a.Before(oldest) {
			oldest = a
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.held, o.heldSince, o.heldOldest = len(batch), now, oldest
}

// settled: the batch taken last is acked or rejected.
func (o *observer) settled(batch []amqp.Delivery) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range batch {
		if a := arrival(d, o.heldSince); a.After(o.newest) {
			o.newest = a
		}
	}
	o.held, o.lost = 0, time.Time{}
}

// count adds n to the ingested tasks (cause "") or to the errors of cause.
func (o *observer) count(cause string, n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if cause == "" {
		o.ingested += int64(n)
	} else {
		o.errors[cause] += int64(n)
	}
}

// read records a reading of the ingress queue.
func (o *observer) read(q amqp.Queue, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.readAt = o.now()
	if err != nil {
		o.readErr = err.Error()
		return
	}
	o.readErr, o.ready, o.consumers = "", int64(q.Messages), q.Consumers
	if q.Messages == 0 {
		o.emptyAt = o.readAt
		if o.held == 0 {
			o.lost = time.Time{}
		}
	}
}

// oldestAge is how long the oldest message of the ingress queue not yet in
// Redis has waited, as far as this instance knows: the oldest arrival
// among the deliveries it holds, or handed back when its session ended;
// and, while the last read found messages ready, the latest of the newest
// arrival it settled, the last read that found none ready, and its start
// (the queue hands messages out in order, so those ready arrived after
// these; one requeued by another instance's lost session aside): an
// upper bound for them, within a read interval. 0 when none waits.
func (o *observer) oldestAge(now time.Time) time.Duration {
	var from time.Time
	pick := func(t time.Time) {
		if !t.IsZero() && (from.IsZero() || t.Before(from)) {
			from = t
		}
	}
	if o.held > 0 {
		pick(o.heldOldest)
	}
	pick(o.lost)
	if o.ready > 0 {
		b := o.start
		for _, t := range []time.Time{o.newest, o.emptyAt} {
			if t.After(b) {
				b = t
			}
		}
		pick(b)
	}
	if from.IsZero() {
		return 0
	}
	return max(now.Sub(from), 0)
}

// Status is one queue's ingress as this instance sees it.
type Status struct {
	Queue, Exchange, IngressQueue string
	Consuming                     bool
	// Since is when it last started or stopped consuming (its start if
	// never); Err why it does not consume, when it does not.
	Since time.Time
	Err   string
	// Ready is the messages ready in the ingress queue at the last read
	// (-1 before the first), Consumers its consumers then; ReadAt when,
	// ReadErr why the last read failed.
	Ready     int64
	Consumers int
	ReadAt    time.Time
	ReadErr   string
	// Held deliveries are taken and not yet written to Redis, since
	// HeldFor.
	Held    int
	HeldFor time.Duration
	// OldestAge is how long the oldest message not yet in Redis has
	// waited, as far as this instance knows (observer.oldestAge).
	OldestAge time.Duration
	// Ingested and Errors (by cause) since the start.
	Ingested int64
	Errors   map[string]int64
	// Now is when the status was taken.
	Now time.Time
}

// Status says how the ingress is doing.
func (g *Ingress) Status() Status {
	o := g.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	s := Status{Queue: g.opt.Queue, Exchange: g.opt.Exchange, IngressQueue: QueueName(g.opt.Queue),
		Consuming: o.consuming, Since: o.since, Err: o.err,
		Ready: o.ready, Consumers: o.consumers, ReadAt: o.readAt, ReadErr: o.readErr,
		Held: o.held, OldestAge: o.oldestAge(now), Ingested: o.ingested, Errors: maps.Clone(o.errors), Now: now}
	if o.held > 0 {
		s.HeldFor = now.Sub(o.heldSince)
	}
	return s
}

// Readiness says, for /readyz, what of the ingress makes this instance not
// ready and what shows it behind (still ready), "" for neither. Not
// ready: it has not consumed the ingress queue for longer than after, or
// has held a batch it cannot write to Redis as long: this instance does
// not ingest. Behind: the oldest message not yet in Redis has waited
// longer than after; every instance consuming the queue sees the same
// backlog and none is more ready than another, so a busy ingress never
// takes instances out of service (docs/monitoring.md#amqp-ingress).
func (s Status) Readiness(after time.Duration) (notReady, behind string) {
	switch {
	case !s.Consuming && s.Now.Sub(s.Since) > after:
		notReady = fmt.Sprintf("queue %s: ingress not consuming %s for %s: %s", s.Queue, s.IngressQueue, round(s.Now.Sub(s.Since)), or(s.Err, "not connected yet"))
	case s.Held > 0 && s.HeldFor > after:
		notReady = fmt.Sprintf("queue %s: ingress stalled: %d messages taken from %s %s ago are not yet written to Redis", s.Queue, s.Held, s.IngressQueue, round(s.HeldFor))
	}
	if s.OldestAge > after {
		behind = fmt.Sprintf("queue %s: ingress behind: the oldest message not yet in Redis has waited %s (over DISPATCHER_STALL_AFTER %s)", s.Queue, round(s.OldestAge), after)
		if s.Ready >= 0 {
			consumers := "consumers"
			if s.Consumers == 1 {
				consumers = "consumer"
			}
			behind += fmt.Sprintf("; %d ready in %s, %d %s, read %s ago", s.Ready, s.IngressQueue, s.Consumers, consumers, round(s.Now.Sub(s.ReadAt)))
		}
	}
	return notReady, behind
}

func round(d time.Duration) time.Duration {
	if d < time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}

func or(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

// sample reads the ingress queue's depth every g.opt.ReadEvery on a
// channel of conn of its own (a failed passive declare closes the
// channel), until ctx ends or stop is called; stop waits for it.
func (g *Ingress) sample(ctx context.Context, conn *amqp.Connection) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var ch *amqp.Channel
		defer func() {
			if ch != nil {
				_ = ch.Close()
			}
		}()
		t := time.NewTicker(g.opt.ReadEvery)
		defer t.Stop()
		for {
			if ch == nil || ch.IsClosed() {
				var err error
				if ch, err = conn.Channel(); err != nil {
					g.obs.read(amqp.Queue{}, fmt.Errorf("opening a channel: %w", err))
					ch = nil
				}
			}
			if ch != nil {
				q, err := ch.QueueDeclarePassive(QueueName(g.opt.Queue), true, false, false, false, nil)
				g.obs.read(q, err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}
