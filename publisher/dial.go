package publisher

import (
	"context"
	"net"
	"sync"
	"time"
)

// writeChunk is the most one socket write may carry under one deadline,
// so a large message on a slow but live link is not mistaken for a dead
// one: only a chunk that makes no progress within the timeout fails.
const writeChunk = 64 << 10

// dialer returns the Dial function of one connection attempt, and a
// function to call once the attempt is over (set up or failed).
//
// Every socket write is bounded by writeTimeout. amqp091-go sets no write
// deadline of its own: when the broker or the path to it stops reading (a
// stall, a half-open connection with full buffers), a publish blocks in
// the socket forever while holding the channel's and the connection's
// locks. Even the heartbeat's read timeout cannot end that connection,
// because closing it waits for the same channel lock; the publishing
// goroutine, and with it a pipeline slot and a clean shutdown, would hang
// until the peer reads again. With the deadline the write fails, the
// library closes the connection, and every publish on it counts as lost.
//
// Until done is called, ctx ending closes the socket: the AMQP handshake
// and the set-up calls after it do not watch a context, and stopping must
// not wait for a broker that accepted the connection but never answers.
func dialer(ctx context.Context, connectTimeout, writeTimeout time.Duration) (dial func(network, addr string) (net.Conn, error), done func()) {
	var stops []func() bool
	dial = func(network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: connectTimeout}
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		// As amqp.DefaultDial: bound the handshake; the library clears
		// the deadline once the connection is open.
		if err := conn.SetDeadline(time.Now().Add(connectTimeout)); err != nil {
			conn.Close()
			return nil, err
		}
		stops = append(stops, context.AfterFunc(ctx, func() { conn.Close() }))
		return newCorkConn(&deadlineConn{Conn: conn, timeout: writeTimeout}), nil
	}
	done = func() {
		for _, stop := range stops {
			stop()
		}
	}
	return dial, done
}

// deadlineConn gives each write a deadline of timeout from its start,
// unless a deadline set explicitly (the handshake's, CloseDeadline's)
// comes earlier.
type deadlineConn struct {
	net.Conn
	timeout time.Duration

	mu       sync.Mutex
	explicit time.Time // last write deadline set through SetDeadline or SetWriteDeadline
}

func (c *deadlineConn) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		chunk := b[:min(len(b), writeChunk)]
		deadline := time.Now().Add(c.timeout)
		c.mu.Lock()
		if !c.explicit.IsZero() && c.explicit.Before(deadline) {
			deadline = c.explicit
		}
		err := c.Conn.SetWriteDeadline(deadline)
		c.mu.Unlock()
		if err != nil {
			return written, err
		}
		n, err := c.Conn.Write(chunk)
		written += n
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

func (c *deadlineConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.explicit = t
	return c.Conn.SetDeadline(t)
}

func (c *deadlineConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.explicit = t
	return c.Conn.SetWriteDeadline(t)
}
