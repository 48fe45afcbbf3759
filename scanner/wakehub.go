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

// hubPing: a subscription silent this long is pinged; silent as long again
// after the ping, its connection is taken for dead and opened again.
const hubPing = 30 * time.Second

// WakeHub is one instance's subscription, shared by its queues on one
// Redis (or Sentinel). Start it with NewWakeHub; Close it after the
// scanners that use it have stopped.
type WakeHub struct {
	rdb redis.UniversalClient
	log *slog.Logger

	mu    sync.Mutex
	ps    *redis.PubSub
	chans map[string]func(*redis.Message) // channel -> its queue's handler
	pats  map[string]func(*redis.Message) // pattern -> its queue's handler
	// asked are the subscriptions sent and not yet confirmed, in the order
	// sent: Redis answers them in that order, so a refusal (an error reply,
	// which names no channel) is the oldest one's.
	asked  []*asked
	closed bool

	stopped chan struct{}
}

type asked struct {
	name    string
	pattern bool
	done    chan error // buffered: the answer, once
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
	h := &WakeHub{rdb: rdb, log: log, chans: map[string]func(*redis.Message){}, pats: map[string]func(*redis.Message){},
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
	for _, a := range h.asked {
		a.done <- redis.ErrClosed
	}
	h.asked = nil
	h.mu.Unlock()
	_ = ps.Close()
	<-h.stopped
}

// subscribe adds a channel (or, pattern, a pattern) and its handler, and
// waits up to 5 s for Redis's answer: an error reply (a refusal: an ACL
// without the channel) is returned and the channel dropped; a connection
// error or no answer in time is not returned (the subscription is kept,
// and go-redis subscribes it again whenever it reconnects).
func (h *WakeHub) subscribe(ctx context.Context, name string, pattern bool, f func(*redis.Message)) error {
	a := &asked{name: name, pattern: pattern, done: make(chan error, 1)}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return redis.ErrClosed
	}
	routes := h.chans
	if pattern {
		routes = h.pats
	}
	routes[name] = f
	h.asked = append(h.asked, a)
	var err error
	if pattern {
		err = h.ps.PSubscribe(ctx, name)
	} else {
		err = h.ps.Subscribe(ctx, name)
	}
	h.mu.Unlock()
	if err != nil {
		h.forget(a)
		return nil // not sent: go-redis sends it again when it reconnects
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case err = <-a.done:
	case <-t.C:
		h.forget(a)
		return nil
	case <-ctx.Done():
		h.forget(a)
		return ctx.Err()
	}
	if isReply(err) {
		h.unsubscribe(name, pattern)
	}
	return err
}

// forget stops waiting for a's answer.
func (h *WakeHub) forget(a *asked) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for n, b := range h.asked {
		if b == a {
			h.asked = append(h.asked[:n:n], h.asked[n+1:]...)
			return
		}
	}
}

// unsubscribe drops a channel (or pattern) and its handler.
func (h *WakeHub) unsubscribe(name string, pattern bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if pattern {
		delete(h.pats, name)
		_ = h.ps.PUnsubscribe(ctx, name)
	} else {
		delete(h.chans, name)
		_ = h.ps.Unsubscribe(ctx, name)
	}
}

// run reads the subscription until Close.
func (h *WakeHub) run() {
	defer close(h.stopped)
	ctx := context.Background()
	pinged := false
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
			continue // Close, or run's own reopen: the loop's head says which
		case errors.As(err, &ne) && ne.Timeout():
			if pinged {
				h.reopen()
				pinged = false
			} else {
				pinged = ps.Ping(ctx) == nil
			}
			continue
		case isReply(err):
			h.answer(nil, err)
			continue
		case err != nil:
			// go-redis reconnects, and subscribes everything again, on
			// the next read; meanwhile wake-ups wait for the next poll.
			h.sleep(100 * time.Millisecond)
			continue
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "psubscribe" {
				h.answer(m, nil)
			}
		case *redis.Message:
			h.mu.Lock()
			f := h.chans[m.Channel]
			if m.Pattern != "" {
				f = h.pats[m.Pattern]
			}
			h.mu.Unlock()
			if f != nil {
				f(m)
			}
		}
	}
}

// answer settles the subscription m confirms, or the oldest one, refused
// with err.
func (h *WakeHub) answer(m *redis.Subscription, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for n, a := range h.asked {
		if m == nil || a.name == m.Channel && a.pattern == (m.Kind == "psubscribe") {
			a.done <- err
			h.asked = append(h.asked[:n:n], h.asked[n+1:]...)
			return
		}
	}
}

// reopen replaces a subscription whose connection answers nothing (not
// even a ping) with a new one of every channel and pattern.
func (h *WakeHub) reopen() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.log.Warn("the wake-up subscription answered no ping: opening it again")
	_ = h.ps.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.ps = h.rdb.Subscribe(ctx)
	if len(h.chans) > 0 {
		_ = h.ps.Subscribe(ctx, keys(h.chans)...)
	}
	if len(h.pats) > 0 {
		_ = h.ps.PSubscribe(ctx, keys(h.pats)...)
	}
}

func (h *WakeHub) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	<-t.C
}

func keys(m map[string]func(*redis.Message)) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
