package liveness

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// freezer is a TCP proxy to Redis that can freeze the connections open
// so far (nothing passes, nothing is closed: a connection dead without an
// error) while new ones work.
type freezer struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen []chan struct{} // closed: that connection stops passing data
	conns  []net.Conn
	closed chan struct{}
	pipes  sync.WaitGroup
}

func newFreezer(t *testing.T, target string) *freezer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, closed: make(chan struct{})}
	t.Cleanup(func() {
		ln.Close()
		close(f.closed)
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.pipes.Wait()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			stop := make(chan struct{})
			f.mu.Lock()
			f.frozen = append(f.frozen, stop)
			f.conns = append(f.conns, c, s)
			f.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				defer f.pipes.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					select {
					case <-stop:
						<-f.closed // frozen until the test ends
						return
					default:
					}
					if n > 0 {
						if _, werr := dst.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						if err != io.EOF {
							dst.Close()
						}
						return
					}
				}
			}
			f.pipes.Add(2)
			go pipe(s, c)
			go pipe(c, s)
		}
	}()
	return f
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.frozen {
		close(s)
	}
	f.frozen = nil
}

// TestStuckSubscriptionOpenedAgain: a subscription whose connection
// stops passing data without an error answers no ping; while heartbeats
// work (on new connections) it is opened again, so that the instance is
// not left without one for others to find.
func TestStuckSubscriptionOpenedAgain(t *testing.T) {
	base := testenv.Redis(t)
	prefix := testenv.Name(t)
	testenv.CleanRedis(t, base, prefix)
	f := newFreezer(t, base.Options().Addr)
	opt := *base.Options()
	opt.Addr = f.ln.Addr().String()
	rdb := redis.NewClient(&opt)
	defer rdb.Close()
	ctx, cancel := context.WithCancel(context.Background())
	const timeout = 400 * time.Millisecond
	l := New(rdb, Options{Prefix: prefix, ID: "s", Timeout: timeout})
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	defer func() { cancel(); <-done }()
	ok := func() bool { ok, _ := l.Check(l.ID()); return ok }
	waitFor(t, "live", 3*time.Second, ok)
	time.Sleep(timeout) // a few pings answered

	frozenAt := time.Now()
	f.freeze()
	reopened := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.subAt.After(frozenAt) && !l.pongAt.Before(l.subAt)
	}
	waitFor(t, "the subscription opened again and answering pings", 8*timeout+3*time.Second, reopened)
	t.Logf("opened again %s after its connection froze", time.Since(frozenAt).Round(time.Millisecond))
	waitFor(t, "live", 3*time.Second, ok)
}
