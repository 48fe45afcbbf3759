package scanner

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A subscription is a connection of its own, with its buffers and
// goroutines: one per queue made an instance of a thousand queues hold a
// thousand connections to Redis and about half its heap for them. A
// WakeHub carries every queue's wake channel (and keyspace pattern) over
// one subscription per instance and hands each message to its queue.
//
// What a shared subscription must not do is let one queue's refused
// channel (an ACL without it) cost the others their wake-ups. Redis
// refuses a SUBSCRIBE of several channels whole if it may not have one of
// them, and go-redis subscribes everything again in one command whenever
// it reconnects. So channels are sent one a command, the refusal (an
// error reply, which names no channel) is the oldest unanswered one's,
// and a refusal that may be of go-redis's all-in-one resubscription makes
// the hub open the subscription again one channel a command.

// hubPing: a subscription silent this long is pinged; silent as long again
// after the ping, its connection is taken for dead and opened again.
const hubPing = 30 * time.Second

// WakeHub is one instance's subscription, shared by its queues on one
// Redis (or Sentinel). Start it with NewWakeHub; Close it after the
// scanners that use it have stopped.
type WakeHub struct {
	rdb redis.UniversalClient
	log *slog.Logger

	// send: one writer to the subscription at a time, held across its
	// network writes; mu is never held across one.
	send sync.Mutex

	mu    sync.Mutex
	ps    *redis.PubSub
	chans map[string]*route // channel -> its queue's route
	pats  map[string]*route // pattern -> its queue's route
	// asked are the subscriptions sent on the current connection and not
	// yet answered, in the order sent: Redis answers them in that order.
	asked []*asked
	// resent: the connection broke since the last confirmation; go-redis
	// subscribes everything again in one command, which a single
	// refused channel refuses whole.
	resent bool
	// missing: subscriptions whose send failed (name -> pattern), sent
	// again once a read shows a connection; resending: that is under way.
	missing   map[string]bool
	resending bool
	reopened  time.Time // the last reopen
	closed    bool

	stopped chan struct{}
}

// route is a queue's end of a channel or pattern.
type route struct {
	f       func(*redis.Message)
	refused func(error) // told when Redis refuses it; it is dropped then
}

type asked struct {
	name    string
	pattern bool
	done    chan error // buffered: the answer, once (nil: subscribed, or not known)
}

// NewWakeHub starts the shared subscription. Nil for a cluster client:
// there each queue subscribes on its own (a channel's node is chosen by
// its slot).
func NewWakeHub(rdb redis.UniversalClient, log *slog.Logger) *WakeHub {
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	h := &WakeHub{rdb: rdb, log: log, chans: map[string]*route{}, pats: map[string]*route{}, missing: map[string]bool{},
		stopped: make(chan struct{})}
	h.ps = rdb.Subscribe(context.Background())
	go h.run()
	return h
}

// Close ends the subscription.
func (h *WakeHub) Close() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.closed = true
	ps := h.ps
	h.settleAll(redis.ErrClosed)
	h.mu.Unlock()
	_ = ps.Close()
	<-h.stopped
}

// settleAll answers every unanswered subscription with err. h.mu is held.
func (h *WakeHub) settleAll(err error) {
	for _, a := range h.asked {
		a.done <- err
	}
	h.asked = nil
}

// subscribe adds a channel (or, pattern, a pattern) with its route and
// waits up to 5 s for Redis's answer. A refusal is told to refused (and
// the channel dropped) whenever it comes, and returned if it came in that
// time; no answer in time, or a connection error, returns nil (go-redis
// subscribes it again whenever it reconnects). If ctx ends first the
// channel is dropped.
func (h *WakeHub) subscribe(ctx context.Context, name string, pattern bool, f func(*redis.Message), refused func(error)) error {
	a := &asked{name: name, pattern: pattern, done: make(chan error, 1)}
	h.send.Lock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		h.send.Unlock()
		return redis.ErrClosed
	}
	h.routes(pattern)[name] = &route{f: f, refused: refused}
	h.asked = append(h.asked, a)
	ps := h.ps
	h.mu.Unlock()
	err := subscribeOne(ctx, ps, name, pattern)
	h.send.Unlock()
	if err != nil {
		// Not sent (or sent on a connection that broke). go-redis, if it
		// reconnected meanwhile, subscribed what it had before this one:
		// it is sent again once a read shows a connection (resend).
		h.mu.Lock()
		h.drop(a)
		h.missing[name] = pattern
		h.mu.Unlock()
		return nil
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case err = <-a.done:
	case <-t.C:
		return nil // its answer, when it comes, still settles it
	case <-ctx.Done():
		h.unsubscribe(name, pattern)
		return ctx.Err()
	}
	if isReply(err) {
		return err
	}
	return nil
}

// subscribeOne sends one SUBSCRIBE, or PSUBSCRIBE for a pattern, on ps:
// one a command, so that Redis's refusal names one queue's channel.
func subscribeOne(ctx context.Context, ps *redis.PubSub, name string, pattern bool) error {
	if pattern {
		return ps.PSubscribe(ctx, name)
	}
	return ps.Subscribe(ctx, name)
}

// drop takes a out of the subscriptions waiting for an answer. h.mu is held.
func (h *WakeHub) drop(a *asked) {
	for n, b := range h.asked {
		if b == a {
			h.asked = append(h.asked[:n:n], h.asked[n+1:]...)
			return
		}
	}
}

// resend sends again, one a command, the subscriptions whose send failed.
func (h *WakeHub) resend() {
	h.send.Lock()
	defer h.send.Unlock()
	h.mu.Lock()
	missing := h.missing
	h.missing = map[string]bool{}
	ps := h.ps
	var sent []*asked
	for name, pattern := range missing {
		if _, ok := h.routes(pattern)[name]; ok && !h.closed { // not dropped meanwhile
			a := &asked{name: name, pattern: pattern, done: make(chan error, 1)}
			h.asked = append(h.asked, a)
			sent = append(sent, a)
		}
	}
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, a := range sent {
		if err := subscribeOne(ctx, ps, a.name, a.pattern); err != nil {
			h.mu.Lock()
			h.drop(a)
			h.missing[a.name] = a.pattern
			h.mu.Unlock()
		}
	}
}

// routes is the map of channels or of patterns. h.mu is held.
func (h *WakeHub) routes(pattern bool) map[string]*route {
	if pattern {
		return h.pats
	}
	return h.chans
}

// unsubscribe drops a channel (or pattern) and its route.
func (h *WakeHub) unsubscribe(name string, pattern bool) {
	h.send.Lock()
	defer h.send.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	delete(h.routes(pattern), name)
	ps := h.ps
	h.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if pattern {
		_ = ps.PUnsubscribe(ctx, name)
	} else {
		_ = ps.Unsubscribe(ctx, name)
	}
}

// run reads the subscription until Close.
func (h *WakeHub) run() {
	defer close(h.stopped)
	ctx := context.Background()
	pinged := false
	backoff := 100 * time.Millisecond // between reads that fail
	var last *redis.PubSub
	for {
		h.mu.Lock()
		ps, closed := h.ps, h.closed
		h.mu.Unlock()
		if closed {
			return
		}
		msg, err := ps.ReceiveTimeout(ctx, hubPing)
		var ne net.Error
		switch {
		case errors.Is(err, redis.ErrClosed):
			if ps == last { // closed under the hub (the client closed first)
				time.Sleep(100 * time.Millisecond)
			}
			last = ps // Close, or a reopen: the loop's head says which
			continue
		case errors.As(err, &ne) && ne.Timeout():
			if pinged {
				h.reopen("the wake-up subscription answered no ping")
				pinged = false
			} else {
				pinged = ps.Ping(ctx) == nil
			}
			continue
		case redis.HasErrorPrefix(err, "NOPERM"):
			// The ACL's answer to a subscribe. Any other error, a reply
			// too (WRONGPASS, a database the server lacks: answers to the
			// connection's own setup), is the connection's.
			h.refused(ps, err)
			continue
		case err != nil:
			// go-redis reconnects, and subscribes everything again, on
			// the next read; meanwhile wake-ups wait for the next poll.
			h.mu.Lock()
			h.resent = true
			h.mu.Unlock()
			time.Sleep(backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		pinged, backoff = false, 100*time.Millisecond
		h.mu.Lock()
		resend := len(h.missing) > 0 && !h.resending
		h.resending = h.resending || resend
		h.mu.Unlock()
		if resend {
			go func() {
				h.resend()
				h.mu.Lock()
				h.resending = false
				h.mu.Unlock()
			}()
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "psubscribe" {
				h.confirmed(ps, m)
			}
		case *redis.Message:
			h.mu.Lock()
			r := h.chans[m.Channel]
			if m.Pattern != "" {
				r = h.pats[m.Pattern]
			}
			h.mu.Unlock()
			if r != nil {
				r.f(m)
			}
		}
	}
}

// confirmed settles the subscription m confirms.
func (h *WakeHub) confirmed(ps *redis.PubSub, m *redis.Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ps != h.ps {
		return // of a subscription replaced meanwhile (reopen)
	}
	h.resent = false
	for n, a := range h.asked {
		if a.name == m.Channel && a.pattern == (m.Kind == "psubscribe") {
			a.done <- nil
			h.asked = append(h.asked[:n:n], h.asked[n+1:]...)
			return
		}
	}
}

// refused settles the oldest subscription sent with a refusal: it is
// dropped and its queue told. A refusal that may be of go-redis's
// resubscription of everything after a reconnect opens the subscription
// again, one channel a command, so that each refusal is its own
// channel's.
func (h *WakeHub) refused(ps *redis.PubSub, err error) {
	h.mu.Lock()
	if ps != h.ps {
		// Read from a subscription a reopen replaced: the asks are the
		// new one's. (A bulk resubscription is refused twice, channels
		// and patterns; the second came after the first's reopen.)
		h.mu.Unlock()
		return
	}
	if h.resent {
		h.mu.Unlock()
		go h.reopen("Redis refused the resubscription of every queue's wake-ups after a reconnect")
		return
	}
	if len(h.asked) == 0 { // of no subscribe (a ping the ACL refuses): nothing to settle
		h.mu.Unlock()
		return
	}
	a := h.asked[0]
	h.asked = h.asked[1:]
	r := h.routes(a.pattern)[a.name]
	h.mu.Unlock()
	a.done <- err
	if r != nil {
		r.refused(err)
	}
	go h.unsubscribe(a.name, a.pattern) // go-redis would send it again at its next reconnect
}

// reopen replaces the subscription with a new one of every channel and
// pattern, one a command.
func (h *WakeHub) reopen(why string) {
	h.send.Lock()
	defer h.send.Unlock()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	// At most once a second: a refusal that keeps coming must not make
	// the hub reconnect in a loop.
	if wait := time.Second - time.Since(h.reopened); wait > 0 {
		h.mu.Unlock()
		time.Sleep(wait)
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return
		}
	}
	h.reopened = time.Now()
	h.log.Warn("opening the wake-up subscription again", "why", why)
	h.settleAll(nil)
	clear(h.missing) // every route is sent below
	old := h.ps
	ps := h.rdb.Subscribe(context.Background())
	h.ps, h.resent = ps, false
	var chans, pats []string
	for name := range h.chans {
		chans = append(chans, name)
		h.asked = append(h.asked, &asked{name: name, done: make(chan error, 1)})
	}
	for name := range h.pats {
		pats = append(pats, name)
		h.asked = append(h.asked, &asked{name: name, pattern: true, done: make(chan error, 1)})
	}
	h.mu.Unlock()
	_ = old.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	failed := false
	for _, name := range chans {
		failed = subscribeOne(ctx, ps, name, false) != nil || failed
	}
	for _, name := range pats {
		failed = subscribeOne(ctx, ps, name, true) != nil || failed
	}
	if failed { // go-redis reconnected meanwhile, sending all it had in one command
		h.mu.Lock()
		h.resent = true
		h.mu.Unlock()
	}
}
