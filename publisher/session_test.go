package publisher

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

// stallWriter is a log destination that stops taking writes once armed,
// as a stderr piped to a reader that stalled, until released.
type stallWriter struct {
	armed    atomic.Bool
	entered  chan struct{} // gets a value when a write starts to block
	released chan struct{}
	once     sync.Once
}

func newStallWriter() *stallWriter {
	return &stallWriter{entered: make(chan struct{}, 1), released: make(chan struct{})}
}

func (w *stallWriter) Write(b []byte) (int, error) {
	if w.armed.Load() {
		select {
		case w.entered <- struct{}{}:
		default:
		}
		<-w.released
	}
	return len(b), nil
}

func (w *stallWriter) release() { w.once.Do(func() { close(w.released) }) }

// A log write that stalls (here for the connection.blocked the broker sends
// on a memory alarm) must not cost a basic.return: the library gives up a
// notification that waits 5 s, and the ack that follows would then count
// an unroutable message as delivered.
func TestReturnNotLostWhileLogStalls(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	ex := testenv.Name(t) // no queue is bound: every message is unroutable
	w := newStallWriter()
	p := runPublisherWith(t, Options{
		URLs: []string{node.AMQPURL()}, Exchanges: []string{ex}, ConfirmTimeout: time.Minute,
		Logger: slog.New(slog.NewTextHandler(w, nil)),
	})
	t.Cleanup(w.release) // before the publisher stops: cleanups run last first

	w.armed.Store(true)
	if err := node.SetAlarm("memory"); err != nil {
		t.Fatal(err)
	}
	// The publish makes the broker block the connection (it tells a
	// connection so once it publishes during an alarm), which is logged;
	// when the alarm clears, the broker returns the messages.
	const n = 2
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Exchange: ex, RoutingKey: "nobody-listens", Body: []byte(fmt.Sprint(i)), MessageID: fmt.Sprint(i), DueMs: 1}
	}
	res := make(chan []error, 1)
	go func() { res <- p.Publish(context.Background(), msgs) }()
	select {
	case <-w.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("nothing logged in 30 s of a memory alarm")
	}
	if err := node.ClearAlarm("memory"); err != nil {
		t.Fatal(err)
	}
	var errs []error
	select {
	case errs = <-res:
		t.Log("publish settled while the log was stalled")
	case <-time.After(n*5*time.Second + 5*time.Second):
		// Long enough for the library to give up each return (5 s each).
		t.Log("publish still waiting while the log is stalled; releasing the log")
		w.release()
		errs = <-res
	}
	for i, err := range errs {
		if Kind(err) != "returned" {
			t.Errorf("unroutable message %d: %v (kind %s), want returned", i, err, Kind(err))
		}
	}
}

// Acks the broker sent before a close count: a close that comes while
// acks are buffered and not yet read must not turn those publishes into
// failures (they would be published again). The confirm loop is held up
// by holding the session's lock while the acks come in and the close
// follows; which of them it reads first is then up to it.
func TestAcksBufferedBeforeCloseCount(t *testing.T) {
	t.Run("channel", func(t *testing.T) {
		ex := testenv.Name(t)
		testenv.Consumer(t, testenv.AMQP(t), ex, "bound")
		p := runPublisherWith(t, Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{ex}, ConfirmTimeout: time.Minute})
		acksThenClose(t, p, ex, func(t *testing.T, s *session) {
			// A publish to a missing exchange: the broker closes the channel (404).
			if err := s.ch.PublishWithContext(context.Background(), ex+".missing", "k", false, false, amqp.Publishing{}); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("connection", func(t *testing.T) {
		node := testenv.PrivateRabbit(t)
		ex := testenv.Name(t)
		conn, err := node.Dial()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		testenv.Consumer(t, conn, ex, "bound")
		p := runPublisherWith(t, Options{URLs: []string{node.AMQPURL()}, Exchanges: []string{ex}, ConfirmTimeout: time.Minute})
		acksThenClose(t, p, ex, func(t *testing.T, s *session) {
			if _, err := node.Ctl("close_connection", connPid(t, node, s), "test closes it"); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// connPid is the broker's process id of the session's connection, found
// by its client port.
func connPid(t *testing.T, node *testenv.RabbitNode, s *session) string {
	t.Helper()
	out, err := node.Ctl("list_connections", "--no-table-headers", "pid", "peer_port")
	if err != nil {
		t.Fatal(err)
	}
	port := fmt.Sprint(s.conn.LocalAddr().(*net.TCPAddr).Port)
	for _, line := range strings.Split(out, "\n") {
		var pid, p string
		if _, err := fmt.Sscan(line, &pid, &p); err == nil && p == port {
			return pid
		}
	}
	t.Fatalf("no connection from port %s in %q", port, out)
	return ""
}

// acksThenClose publishes a batch, holds the confirm loop while the
// broker's acks for all of it come in, has closeIt close the channel or
// connection, lets the loop go on, and checks that every publish is
// confirmed.
func acksThenClose(t *testing.T, p *Publisher, ex string, closeIt func(*testing.T, *session)) {
	t.Helper()
	const n = 1000
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Exchange: ex, RoutingKey: "bound", Body: []byte(fmt.Sprint(i)), MessageID: fmt.Sprint(i), DueMs: 1}
	}
	errs, unsettled := publishLoopHeld(t, p, msgs, closeIt)
	if unsettled < 2 {
		// At most one ack in the loop's hands: nothing was left to choose.
		t.Skipf("only %d of %d acks were not yet settled when the loop was held; nothing to test", unsettled, n)
	}
	kinds := map[string]int{}
	for _, err := range errs {
		kinds[Kind(err)]++
	}
	if kinds["confirmed"] != n {
		t.Fatalf("%d acks buffered when the close came; outcomes %v, want all %d confirmed", unsettled, kinds, n)
	}
	t.Logf("%d acks buffered when the close came; all %d confirmed", unsettled, n)
}

// When the confirm loop falls behind, returns and acks pile up in its
// buffers, and it may find an ack ready next to the return sent before
// it: the return must still count.
func TestReturnsMatchedWhenLoopFallsBehind(t *testing.T) {
	ex := testenv.Name(t)
	testenv.Consumer(t, testenv.AMQP(t), ex, "bound")
	p := runPublisherWith(t, Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{ex}, ConfirmTimeout: time.Minute})
	const n = 1000
	msgs := make([]Message, n)
	for i := range msgs {
		key := "nobody-listens"
		if i%10 == 0 {
			key = "bound"
		}
		msgs[i] = Message{Exchange: ex, RoutingKey: key, Body: []byte(fmt.Sprint(i)), MessageID: "same-id", DueMs: 1}
	}
	errs, unsettled := publishLoopHeld(t, p, msgs, nil)
	if unsettled < 2 {
		t.Skipf("only %d of %d publishes unsettled when the loop was held; nothing to test", unsettled, n)
	}
	wrong := 0
	for i, err := range errs {
		want := "returned"
		if i%10 == 0 {
			want = "confirmed"
		}
		if Kind(err) != want {
			if wrong++; wrong <= 5 {
				t.Errorf("message %d: %v (kind %s), want %s", i, err, Kind(err), want)
			}
		}
	}
	t.Logf("%d publishes unsettled when the loop was held; %d of %d outcomes wrong", unsettled, wrong, n)
}

// publishLoopHeld publishes msgs and, once all are written, holds the
// session's confirm loop (by the session's lock, which it takes to settle
// anything) until the broker's answers to all of them have been handed to
// it, at most 20 s; whileHeld, if any, runs then. It returns Publish's
// outcome and how many publishes were not yet settled when the loop was
// held.
func publishLoopHeld(t *testing.T, p *Publisher, msgs []Message, whileHeld func(*testing.T, *session)) (errs []error, unsettled int) {
	t.Helper()
	n := uint64(len(msgs))
	s, _ := p.session()
	// A listener of the test's own on the session's channel gets each
	// answer right after the session's listener got it.
	seen := s.ch.NotifyPublish(make(chan amqp.Confirmation, n+1))
	res := make(chan []error, 1)
	go func() { res <- p.Publish(context.Background(), msgs) }()
	for s.ch.GetNextPublishSeqNo() <= n {
		time.Sleep(100 * time.Microsecond)
	}
	s.mu.Lock()
	unsettled = len(s.pending) // settled ones left pending under this lock
	limit := time.After(20 * time.Second)
	for k := uint64(0); k < n; k++ {
		select {
		case c, ok := <-seen:
			if !ok || !c.Ack {
				s.mu.Unlock()
				t.Fatalf("answer %d: %+v (open %v), want an ack", k+1, c, ok)
			}
		case <-limit:
			t.Logf("only %d of %d answers handed over in 20 s while the loop was held", k, n)
			k = n
		}
	}
	if whileHeld != nil {
		whileHeld(t, s)
		for range seen { // closed once the library has closed the channel
		}
	}
	s.mu.Unlock()
	return <-res, unsettled
}

// A session that the broker ended by refusing one message (406 on the
// shared channel) must not pass that refusal on to messages it is given
// afterwards: they never reached the broker, and counting the refusal
// against them dead-lettered healthy batch-mates of an oversized member
// (TestBrokerRefusedMemberDeadLettered, 16 of 40 lost once).
func TestDeadSessionBlamesNoLaterMessage(t *testing.T) {
	s := newSession(nil, nil)
	refused := &LostError{Code: 406, Reason: "PRECONDITION_FAILED - message size 1500000 is larger than configured max size 1048576", Refused: true}
	s.shutdown(refused)
	_, err := s.publishAlone(context.Background(), time.Second, "ex", "key", amqp.Publishing{}, nil)
	if k := Kind(err); k != "lost" {
		t.Errorf("publishAlone on the ended session: %v (%s), want lost", err, k)
	}
	// A slot free: acquire gives it, and the publish finds the end.
	if _, err := s.acquire(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	w := s.publish(context.Background(), "ex", "key", amqp.Publishing{})
	<-w.done
	if k := Kind(w.err); k != "lost" {
		t.Errorf("publish on the ended session: %v (%s), want lost", w.err, k)
	}
	for range maxOutstanding {
		s.slots <- struct{}{} // no slot free: acquire waits for the end
	}
	if _, err := s.acquire(context.Background(), time.Second); Kind(err) != "lost" {
		k := Kind(err)
		t.Errorf("acquire on the ended session: %s, want lost", k)
	}
}
