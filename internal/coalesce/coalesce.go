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
// use New.
type Coalescer struct {
	rdb     redis.UniversalClient
	window  time.Duration
	timeout time.Duration

	mu    sync.Mutex
	lanes map[string]*lane
}

// New returns a Coalescer that sends through rdb. A round trip waits window
// after the first request for others to join it, and is bounded by timeout.
func New(rdb redis.UniversalClient, window, timeout time.Duration) *Coalescer {
	return &Coalescer{rdb: rdb, window: window, timeout: timeout, lanes: map[string]*lane{}}
}

type request struct {
	fill   func(redis.Pipeliner)
	queued time.Time
	sent   time.Duration // from Do's call to the round trip's start
	took   time.Duration // the round trip
	done   chan struct{}
}

// lane is the queue of requests for one primary; at most one round trip
// is on its way per lane, so a primary that hangs holds up only its own.
type lane struct {
	mu      sync.Mutex
	queue   []*request
	running bool
}

// Do adds the commands fill queues on the pipeline to the next round trip
// to node (the primary's address, or any string that names one; "" for a
// single server) and waits until it is answered, at most the Coalescer's
// timeout. It returns how long after the call the round trip began and
// how long it took, so that a caller can tell when Redis ran the commands
// (a server clock read among them). Each command carries its own result or
// error: read them after Do returns. fill must only queue commands; the
// context given to them does not bound the round trip.
func (c *Coalescer) Do(node string, fill func(pipe redis.Pipeliner)) (sent, took time.Duration) {
	r := &request{fill: fill, queued: time.Now(), done: make(chan struct{})}
	l := c.lane(node)
	l.mu.Lock()
	l.queue = append(l.queue, r)
	start := !l.running
	l.running = true
	l.mu.Unlock()
	if start {
		go c.run(l)
	}
	<-r.done
	return r.sent, r.took
}

func (c *Coalescer) lane(node string) *lane {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.lanes[node]
	if l == nil {
		l = &lane{}
		c.lanes[node] = l
	}
	return l
}

// run sends the lane's requests, the ones that came meanwhile in one
// pipeline, until none is left.
func (c *Coalescer) run(l *lane) {
	if c.window > 0 {
		time.Sleep(c.window)
	}
	for {
		l.mu.Lock()
		batch := l.queue
		l.queue = nil
		if len(batch) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		pipe := c.rdb.Pipeline()
		for _, r := range batch {
			r.fill(pipe)
		}
		before := time.Now()
		_, _ = pipe.Exec(ctx) // each command holds its own error
		after := time.Now()
		cancel()
		for _, r := range batch {
			r.sent, r.took = before.Sub(r.queued), after.Sub(before)
			close(r.done)
		}
	}
}
