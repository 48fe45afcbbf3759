package publisher

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// peer listens on 127.0.0.1 and hands each accepted connection to serve;
// everything closes when the test ends.
func peer(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			serve(c)
			t.Cleanup(func() { c.Close() })
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}

func dialPeer(t *testing.T, ctx context.Context, addr string, writeTimeout time.Duration) (net.Conn, func()) {
	t.Helper()
	dial, done := dialer(ctx, 5*time.Second, writeTimeout)
	c, err := dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// As the amqp library does once the connection is open.
	if err := c.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	return c, done
}

// writeUntilError writes chunks until a write fails, for at most 10 s:
// writes are corked, so a socket error shows on a later write.
func writeUntilError(t *testing.T, c net.Conn, chunk int) (int, error) {
	t.Helper()
	total := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		n, err := c.Write(make([]byte, chunk))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// A peer that stops reading makes writes fail at the deadline instead of
// blocking forever.
func TestWriteToPeerThatStopsReadingFails(t *testing.T) {
	addr := peer(t, func(net.Conn) {}) // accepts, never reads
	c, done := dialPeer(t, context.Background(), addr, 200*time.Millisecond)
	defer done()
	// More than the socket buffers of both ends can hold.
	n, err := writeUntilError(t, c, 1<<20)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writes to a peer that does not read: %d bytes, err %v; want a deadline error", n, err)
	}
	t.Logf("writes stopped after %d bytes: %v", n, err)
}

// A peer that reads slowly but steadily is not taken for a dead one, even
// when the whole write takes far longer than the timeout: the deadline
// bounds each chunk, not the write.
func TestWriteToSlowPeerSucceeds(t *testing.T) {
	const size = 8 << 20
	got := make(chan int64, 1)
	addr := peer(t, func(c net.Conn) {
		go func() {
			var n int64
			buf := make([]byte, writeChunk)
			for n < size {
				time.Sleep(5 * time.Millisecond)
				m, err := c.Read(buf)
				n += int64(m)
				if err != nil {
					break
				}
			}
			got <- n
		}()
	})
	c, done := dialPeer(t, context.Background(), addr, 300*time.Millisecond)
	defer done()
	began := time.Now()
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatalf("write to a slow but live peer: %v", err)
	}
	if n := <-got; n != size {
		t.Fatalf("peer read %d bytes, want %d", n, size)
	}
	t.Logf("wrote %d MiB in %s with a %s write timeout", size>>20, time.Since(began).Round(time.Millisecond), 300*time.Millisecond)
}

// A deadline set by the library (its handshake's, CloseDeadline's) still
// holds when it is earlier than the write timeout; once a socket write has
// failed, the connection is done (part of a frame may be on the wire).
func TestExplicitWriteDeadlineWins(t *testing.T) {
	addr := peer(t, func(c net.Conn) { go io.Copy(io.Discard, c) })
	c, done := dialPeer(t, context.Background(), addr, time.Hour)
	defer done()
	if err := c.SetWriteDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := writeUntilError(t, c, 1); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writes after a past deadline: %v; want a deadline error", err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write on a connection whose socket write failed: no error")
	}
}

// Corked writes reach the peer whole and in order, and Close writes out
// what is still buffered.
func TestCorkedWritesArriveInOrder(t *testing.T) {
	got := make(chan []byte, 1)
	addr := peer(t, func(c net.Conn) {
		go func() { b, _ := io.ReadAll(c); got <- b }()
	})
	c, done := dialPeer(t, context.Background(), addr, time.Second)
	defer done()
	var want []byte
	for i := 0; i < 20000; i++ {
		p := []byte{byte(i), byte(i >> 8), byte(i >> 16)}
		want = append(want, p...)
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if b := <-got; !bytes.Equal(b, want) {
		t.Fatalf("peer got %d bytes, want %d (equal: %v)", len(b), len(want), bytes.Equal(b, want))
	}
}

// Stopping while a connection is being set up closes its socket, so a
// broker that accepted the connection but never answers cannot hold up a
// shutdown; once set up, the connection no longer depends on ctx.
func TestDialAbortedWhenStopping(t *testing.T) {
	addr := peer(t, func(c net.Conn) { go io.Copy(io.Discard, c) }) // never answers
	ctx, cancel := context.WithCancel(context.Background())
	c, done := dialPeer(t, ctx, addr, time.Second)
	defer done()
	read := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 1)); read <- err }()
	cancel()
	select {
	case err := <-read:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read during set-up after stop: %v; want the socket closed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("stopping did not end a set-up that waits for the broker")
	}

	ctx, cancel = context.WithCancel(context.Background())
	c, done = dialPeer(t, ctx, addr, time.Second)
	done() // set up
	cancel()
	if _, err := c.Write([]byte("still open")); err != nil {
		t.Fatalf("write on a set-up connection after stop: %v", err)
	}
}
