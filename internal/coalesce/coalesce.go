// Package coalesce sends the Redis commands that many callers issue at about
// the same moment in one pipelined round trip per Redis primary.
//
// An instance serving many queues sweeps each of them on the same clock
// grid (see scanner), so their sweeps fall due together. Sent one queue at a
// time, a hundred quiet queues cost the dispatcher a hundred round trips per
// sweep, and a round trip's system calls and wake-ups cost far more than the
// few reads in it; sent together, they cost one.
package coalesce

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coalescer gathers requests per primary. The zero value is not usable;
// use New, and Close it when done.
type Coalescer struct {
	rdb     redis.UniversalClient
	window  time.Duration
	timeout time.Duration
	idle    time.Duration // a lane unused this long ends (primaries come and go)

	mu     sync.Mutex
	lanes  map[string]*lane
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// New returns a Coalescer that sends through rdb. A round trip waits window
// after the first request for others to join it, and is bounded by timeout.
func New(rdb redis.UniversalClient, window, timeout time.Duration) *Coalescer {
	return &Coalescer{rdb: rdb, window: window, timeout: timeout, idle: time.Minute, lanes: map[string]*lane{}, stop: make(chan struct{})}
}

type request struct {
	fill   func(redis.Pipeliner)
	queued time.Time
	sent   time.Duration // from Do's call to the round trip's start
	took   time.Duration // the round trip
	done   chan struct{}
}

// lane is the queue of requests for one primary, sent by a goroutine of its
// own that lives until Close: at most one round trip is on its way per
// lane, so a primary that hangs holds up only its own; and a goroutine
// started per round trip would grow its stack through go-redis every time.
type lane struct {
	mu    sync.Mutex
	queue []*request
	wake  chan struct{}
}

// Do adds the commands fill queues on the pipeline to the next round trip
// to node (the primary's address, or any string that names one; "" for a
// single server) and waits until it is answered or ctx ends. It returns
// how long after the call the round trip began and how long it took, so
// that a caller can tell when Redis ran the commands (a server clock read
// among them). Each command carries its own result or error: read them
// after Do returns nil, and never after it returned ctx's error (the round
// trip may still be writing them). fill must only queue commands, and runs
// on another goroutine. A round trip is bounded by the Coalescer's timeout;
// one queued behind a round trip that hangs waits for that one first,
// which is what ctx bounds. After Close, Do sends on its own.
func (c *Coalescer) Do(ctx context.Context, node string, fill func(pipe redis.Pipeliner)) (sent, took time.Duration, err error) {
	r := &request{fill: fill, queued: time.Now(), done: make(chan struct{})}
	l := c.enqueue(node, r)
	if l == nil {
		c.send([]*request{r})
		return r.sent, r.took, nil
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
	select {
	case <-r.done:
		return r.sent, r.took, nil
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// Close stops the lanes' goroutines once their requests are sent.
func (c *Coalescer) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.stop)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// enqueue adds r to node's lane, starting the lane if new, and returns the
// lane; nil after Close. Under the Coalescer's lock, so that nothing is
// queued after Close, whose lanes send what they hold before they end.
func (c *Coalescer) enqueue(node string, r *request) *lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	l := c.lanes[node]
	if l == nil {
		l = &lane{wake: make(chan struct{}, 1)}
		c.lanes[node] = l
		c.wg.Add(1)
		go c.run(node, l)
	}
	l.mu.Lock()
	l.queue = append(l.queue, r)
	l.mu.Unlock()
	return l
}

// run sends the lane's requests, those that came within the window in one
// pipeline, until Close.
func (c *Coalescer) run(node string, l *lane) {
	defer c.wg.Done()
	idle := time.NewTimer(c.idle)
	defer idle.Stop()
	for {
		select {
		case <-l.wake:
		case <-c.stop:
			// A Do that queued before Close is still answered.
			for c.flush(l) {
			}
			return
		case <-idle.C:
			if c.retire(node, l) {
				return
			}
			idle.Reset(c.idle)
			continue
		}
		idle.Reset(c.idle)
		if c.window > 0 {
			t := time.NewTimer(c.window)
			select {
			case <-t.C:
			case <-c.stop:
				t.Stop()
			}
		}
		for c.flush(l) {
		}
	}
}

// retire removes an unused lane, so that the lanes of primaries long gone
// (failed over, moved) do not pile up; false if a request came meanwhile.
// Under the Coalescer's lock, as enqueue: a request is either in the lane
// before it goes, or gets a new lane.
func (c *Coalescer) retire(node string, l *lane) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) > 0 || c.lanes[node] != l {
		return false
	}
	delete(c.lanes, node)
	return true
}

// flush sends what the lane holds in one round trip; false if it held none.
func (c *Coalescer) flush(l *lane) bool {
	l.mu.Lock()
	batch := l.queue
	l.queue = nil
	l.mu.Unlock()
	if len(batch) == 0 {
		return false
	}
	c.send(batch)
	return true
}

// send runs the requests' commands in one pipeline and answers them.
func (c *Coalescer) send(batch []*request) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	pipe := c.rdb.Pipeline()
	for _, r := range batch {
		r.fill(pipe)
	}
	before := time.Now()
	_, _ = pipe.Exec(ctx) // each command holds its own error
	after := time.Now()
	for _, r := range batch {
		r.sent, r.took = before.Sub(r.queued), after.Sub(before)
		close(r.done)
	}
}
