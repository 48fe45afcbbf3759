package publisher

import (
	"net"
	"sync"
)

// corkLimit is how many bytes may wait for the socket before a Write blocks.
const corkLimit = 1 << 20

// corkConn gathers the writes of many publishes into few socket writes.
// amqp091-go flushes its buffer after every message, one syscall each; a
// dispatcher publishing batches would spend much of its CPU, and make the
// broker spend some of its own, on small TCP writes. Write copies into a
// buffer that one goroutine writes out whole, so a burst of publishes
// leaves in one write while a lone one leaves at once. A failed socket
// write fails every later Write and closes the connection, so the library
// sees the connection end and every unconfirmed publish counts as lost.
type corkConn struct {
	net.Conn

	mu      sync.Mutex
	wake    *sync.Cond // the flusher waits for data, writers for room
	buf     []byte
	err     error
	closed  bool
	flusher sync.WaitGroup
}

func newCorkConn(c net.Conn) *corkConn {
	cc := &corkConn{Conn: c}
	cc.wake = sync.NewCond(&cc.mu)
	cc.flusher.Add(1)
	go cc.flush()
	return cc
}

func (c *corkConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && !c.closed && len(c.buf) > 0 && len(c.buf)+len(b) > corkLimit {
		c.wake.Wait()
	}
	if c.err != nil {
		return 0, c.err
	}
	if c.closed {
		return 0, net.ErrClosed
	}
	c.buf = append(c.buf, b...)
	c.wake.Broadcast()
	return len(b), nil
}

func (c *corkConn) flush() {
	defer c.flusher.Done()
	var out []byte
	for {
		c.mu.Lock()
		for len(c.buf) == 0 && !c.closed && c.err == nil {
			c.wake.Wait()
		}
		if len(c.buf) == 0 || c.err != nil {
			c.mu.Unlock()
			return
		}
		out, c.buf = c.buf, out[:0]
		c.wake.Broadcast() // room for blocked writers
		c.mu.Unlock()

		if _, err := c.Conn.Write(out); err != nil {
			c.mu.Lock()
			c.err = err
			c.wake.Broadcast()
			c.mu.Unlock()
			c.Conn.Close()
			return
		}
	}
}

// Close writes out what is buffered (bounded by the write deadline) and
// closes the socket.
func (c *corkConn) Close() error {
	c.mu.Lock()
	c.closed = true
	c.wake.Broadcast()
	c.mu.Unlock()
	c.flusher.Wait()
	return c.Conn.Close()
}
