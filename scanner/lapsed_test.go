package scanner

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/publisher"
	"github.com/dispatcher/dispatcher/shard"
)

// lapsing is a liveness that lets publishes through for a while after its
// first check, then says the instance was declared dead (fenced): its
// claims are another instance's now.
type lapsing struct {
	mu    sync.Mutex
	first time.Time
	for_  time.Duration
}

func (l *lapsing) ID() string { return "old#0" }

func (l *lapsing) Check(string) (ok, fenced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.first.IsZero() {
		l.first = time.Now()
	}
	live := time.Since(l.first) < l.for_
	return live, !live
}

func (l *lapsing) Members(string) []string { return nil }

// slowProxy forwards TCP to a server, holding what the server sends back
// for delay (set at any time): confirms come late, and the publish window
// fills.
type slowProxy struct {
	ln    net.Listener
	delay atomic.Int64 // ns
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newSlowProxy(t *testing.T, server string) *slowProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &slowProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(s, c); s.Close() }()
			go func() { defer p.wg.Done(); p.late(c, s) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// late copies from server to client, each chunk delay after it came.
func (p *slowProxy) late(c, s net.Conn) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	q := make(chan chunk, 1<<16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			time.Sleep(time.Until(ch.at))
			if _, err := c.Write(ch.b); err != nil {
				s.Close()
				for range q {
				}
				return
			}
		}
	}()
	for {
		b := make([]byte, 32<<10)
		n, err := s.Read(b)
		if n > 0 {
			q <- chunk{time.Now().Add(time.Duration(p.delay.Load())), b[:n]}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
	c.Close()
}

// TestNoPublishAfterLivenessLapsedInTheWait: the liveness gate passes,
// then the publish waits for room among the unconfirmed publishes (up to
// CONFIRM_TIMEOUT); if the instance was declared dead meanwhile, its
// claims were handed to another instance, which publishes them: this one
// must not publish them too. The broker's confirms are held up 1.5 s, so
// the publishes past the window of 4096 wait for them; the liveness lapses
// 300 ms after the gate.
func TestNoPublishAfterLivenessLapsedInTheWait(t *testing.T) {
	rdb := testenv.Redis(t)
	k := shard.Keys{Prefix: testenv.Name(t), Queue: "q"}
	testenv.CleanRedis(t, rdb, k.Prefix)
	conn := testenv.AMQP(t)
	exchange := k.Prefix + ".q"
	got := testenv.Consumer(t, conn, exchange, "q")

	pub, proxy, ctx := slowPublisher(t, exchange)
	proxy.delay.Store(int64(1500 * time.Millisecond))

	const n = 4096 + 300
	zs := make([]redis.Z, n)
	now := time.Now().UnixMilli()
	for i := range zs {
		zs[i] = redis.Z{Score: float64(now - 1000), Member: "t" + strconv.Itoa(i)}
	}
	if err := rdb.ZAdd(ctx, k.Pending(0), zs...).Err(); err != nil {
		t.Fatal(err)
	}
	s := New(rdb, pub, Options{Queue: "q", Shards: 1, Exchange: exchange, RoutingKey: "q", KeyPrefix: k.Prefix,
		BatchSize: n, Pipeline: 1, PollInterval: 50 * time.Millisecond, Lease: 30 * time.Second,
		ShutdownTimeout: time.Second, MaxMessageBytes: 1 << 20, MaxAttempts: 5,
		RetryMin: time.Second, RetryMax: time.Minute, Liveness: &lapsing{for_: 300 * time.Millisecond}})
	run, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(1)
	go func() { defer wg.Done(); _ = s.Run(run) }()

	delivered := 0
	quiet := time.NewTimer(6 * time.Second)
	defer quiet.Stop()
count:
	for {
		select {
		case <-got:
			delivered++
		case <-quiet.C:
			break count
		}
	}
	if delivered > 4096 {
		t.Fatalf("%d of %d tasks published, %d after the liveness lapsed while waiting for room (window 4096)", delivered, n, delivered-4096)
	}
	if delivered == 0 {
		t.Fatal("nothing published: the test did not fill the window")
	}
	t.Logf("%d of %d published, the rest not after the lapse", delivered, n)
}

// TestIsolateRefusedAsksTheGateAfterOpeningItsChannel: a message the
// broker refused on the shared channel is published again on a channel of
// its own. The liveness gate, which held when isolateRefused checked it,
// may lapse while the broker opens that channel (up to CONFIRM_TIMEOUT):
// then the message must not be written. The broker's answers are held up
// 1 s, so the channel takes 2 s to open; the gate holds for one check.
func TestIsolateRefusedAsksTheGateAfterOpeningItsChannel(t *testing.T) {
	conn := testenv.AMQP(t)
	exchange := testenv.Name(t)
	got := testenv.Consumer(t, conn, exchange, "q")
	pub, proxy, ctx := slowPublisher(t, exchange)
	proxy.delay.Store(int64(time.Second))

	s := &Scanner{pub: pub}
	msgs := []publisher.Message{{Exchange: exchange, RoutingKey: "q", Body: []byte("refused on the shared channel")}}
	errs := []error{&publisher.LostError{Code: 406, Reason: "PRECONDITION_FAILED", Refused: true}}
	var checks atomic.Int32
	s.isolateRefused(ctx, msgs, errs, func(int) error {
		if checks.Add(1) > 1 {
			return errLapsed
		}
		return nil
	})
	select {
	case d := <-got:
		t.Fatalf("%q published after the gate lapsed (isolateRefused: %v, gate checked %d times)", d.Body, errs[0], checks.Load())
	case <-time.After(2 * time.Second):
	}
	if errs[0] != errLapsed {
		t.Fatalf("isolateRefused: %v (gate checked %d times), want %v", errs[0], checks.Load(), errLapsed)
	}
}

// slowPublisher starts a publisher to exchange through a slowProxy in front
// of the broker, connected and ready; ctx ends, and the publisher with it,
// when the test does.
func slowPublisher(t *testing.T, exchange string) (*publisher.Publisher, *slowProxy, context.Context) {
	t.Helper()
	proxy := newSlowProxy(t, testenv.HostPort(testenv.AMQPURL(t)))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	pub := publisher.New(publisher.Options{URLs: []string{"amqp://guest:guest@" + proxy.ln.Addr().String() + "/"},
		Exchanges: []string{exchange}, ConfirmTimeout: 10 * time.Second})
	wg.Add(1)
	go func() { defer wg.Done(); _ = pub.Run(ctx) }()
	ready, cancelReady := context.WithTimeout(ctx, 10*time.Second)
	defer cancelReady()
	if err := pub.WaitReady(ready); err != nil {
		t.Fatal(err)
	}
	return pub, proxy, ctx
}
