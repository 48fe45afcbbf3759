package publisher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.StopPrivateRabbit() // its process watcher would count as a leak
	if err := goleak.Find(proxyLeaks...); err != nil && code == 0 {
		fmt.Fprintln(os.Stderr, "goroutine leak:", err)
		code = 1
	}
	os.Exit(code)
}

func runPublisher(t *testing.T, exchanges ...string) *Publisher {
	t.Helper()
	return runPublisherWith(t, Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: exchanges, ConfirmTimeout: 5 * time.Second})
}

// runPublisherWith runs a Publisher with opt (logging nowhere unless
// opt.Logger is set) until the test ends, and waits until it is ready.
func runPublisherWith(t *testing.T, opt Options) *Publisher {
	t.Helper()
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	p := New(opt)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	wait, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := p.WaitReady(wait); err != nil {
		t.Fatalf("publisher not ready: %v", err)
	}
	return p
}

func TestConfirmedAndReturned(t *testing.T) {
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	got := testenv.Consumer(t, conn, ex, "bound")
	p := runPublisher(t, ex)

	var msgs []Message
	for i := 0; i < 100; i++ {
		key := "bound"
		if i%10 == 0 {
			key = "nobody-listens" // unroutable: the broker returns it
		}
		// One message_id for all: two queues may well publish the same
		// member due at the same time, and returns must still be told apart.
		msgs = append(msgs, Message{Exchange: ex, RoutingKey: key, Body: []byte(fmt.Sprint(i)), MessageID: "same-id", DueMs: 1})
		if i%2 == 1 {
			msgs[i].PublishedUs = int64(1000 + i) // the stamp goes out only when set
		}
	}
	errs := p.Publish(context.Background(), msgs)
	for i, err := range errs {
		var re *ReturnedError
		if i%10 == 0 {
			if !errors.As(err, &re) || Kind(err) != "returned" {
				t.Fatalf("message %d: %v, want returned", i, err)
			}
		} else if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	for n := 0; n < 90; n++ {
		select {
		case d := <-got:
			if d.DeliveryMode != 2 || d.Headers["x-due-ms"] != int64(1) {
				t.Fatalf("delivery %+v", d)
			}
			i, _ := strconv.Atoi(string(d.Body))
			stamp, stamped := d.Headers["x-published-us"]
			if want := i%2 == 1; stamped != want || (want && stamp != int64(1000+i)) {
				t.Fatalf("message %d: x-published-us %v (present %v), want present %v", i, stamp, stamped, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("got %d deliveries, want 90", n)
		}
	}
}

func TestDeclaresMissingExchangeAndKeepsExisting(t *testing.T) {
	conn := testenv.AMQP(t)
	missing, existing := testenv.Name(t)+".new", testenv.Name(t)+".topic"
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	// A consumer declared it as a topic exchange: the publisher must use it as it is.
	if err := ch.ExchangeDeclare(existing, "topic", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ch.ExchangeDelete(existing, false, false); ch.ExchangeDelete(missing, false, false) })
	runPublisher(t, missing, existing)
	if err := ch.ExchangeDeclarePassive(missing, "direct", true, false, false, false, nil); err != nil {
		t.Fatalf("missing exchange not declared: %v", err)
	}
}

func TestPublishAlone(t *testing.T) {
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	testenv.Consumer(t, conn, ex, "bound")
	p := runPublisher(t, ex)
	if err := p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "bound", Body: []byte("x")}, nil); err != nil {
		t.Fatalf("routable: %v", err)
	}
	if err := p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "nobody", Body: []byte("x")}, nil); Kind(err) != "returned" {
		t.Fatalf("unroutable: %v", err)
	}
	if !p.Ready() {
		t.Fatal("the shared channel suffered")
	}
}

// TestNoPublishAloneAfterGateLapsedInTheWait: the caller checked its
// liveness gate, then PublishAlone waits for the broker to open a channel
// of its own (up to the confirm timeout). If the gate lapsed meanwhile
// (the instance was declared dead, its claims handed to another), the
// message must not be written. The broker's answers are held up 1 s, so
// channel.open and confirm.select take 2 s; the gate lapses 300 ms in.
func TestNoPublishAloneAfterGateLapsedInTheWait(t *testing.T) {
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	got := testenv.Consumer(t, conn, ex, "bound")
	proxy := newNetProxy(t, testenv.HostPort(testenv.AMQPURL(t)))
	p := runPublisherWith(t, Options{URLs: []string{proxy.url(testenv.AMQPURL(t))}, Exchanges: []string{ex}, ConfirmTimeout: 10 * time.Second})
	proxy.toxic("latency", "downstream", map[string]int64{"latency": 1000})

	lapsed := errors.New("the gate lapsed")
	began := time.Now()
	err := p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "bound", Body: []byte("late")}, func() error {
		if time.Since(began) >= 300*time.Millisecond {
			return lapsed
		}
		return nil
	})
	took := time.Since(began).Round(time.Millisecond)
	select {
	case d := <-got:
		t.Fatalf("%q published after the gate lapsed (PublishAlone: %v after %s)", d.Body, err, took)
	case <-time.After(2 * time.Second):
	}
	if err != lapsed {
		t.Fatalf("PublishAlone: %v after %s, want the gate's error", err, took)
	}
	t.Logf("not published: %v after %s", err, took)

	// A gate that holds lets it through, slow answers or not.
	if err := p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "bound", Body: []byte("live")}, func() error { return nil }); err != nil {
		t.Fatalf("gate holding: %v", err)
	}
	select {
	case d := <-got:
		if string(d.Body) != "live" {
			t.Fatalf("delivered %q, want \"live\"", d.Body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("gate holding: confirmed but not delivered")
	}
}

func TestNotConnected(t *testing.T) {
	p := New(Options{URLs: []string{"amqp://guest:guest@127.0.0.1:1/"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	errs := p.Publish(context.Background(), []Message{{Exchange: "x", Body: []byte("b")}})
	if !errors.Is(errs[0], ErrNotConnected) || Kind(errs[0]) != "not_connected" {
		t.Fatalf("%v", errs[0])
	}
	if p.Ready() {
		t.Fatal("ready without a connection")
	}
}

func TestKind(t *testing.T) {
	for err, want := range map[error]string{
		nil: "confirmed", ErrNacked: "nack", ErrTimeout: "timeout", ErrStopped: "stopped",
		&ReturnedError{Code: 312}:                      "returned",
		&LostError{Reason: "x"}:                        "lost",
		fmt.Errorf("w: %w", &LostError{Refused: true}): "refused",
		errors.New("?"):                                "other",
	} {
		if got := Kind(err); got != want {
			t.Errorf("Kind(%v) = %s, want %s", err, got, want)
		}
	}
}

// On a slow link, large messages wait their turn for the wire; a message
// counts as timed out only when its confirm is late after it was written,
// not after the batch began. (A timeout from the batch's start failed
// about 40 of these on every try, although the broker took them all.)
func TestSlowLinkLargeMessagesConfirmed(t *testing.T) {
	const n, size = 100, 64 << 10
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	got := testenv.Consumer(t, conn, ex, "bound")
	proxy := newNetProxy(t, testenv.HostPort(testenv.AMQPURL(t)))
	proxy.toxic("bandwidth", "upstream", map[string]int64{"rate": 2048}) // KB/s
	p := runPublisherWith(t, Options{URLs: []string{proxy.url(testenv.AMQPURL(t))}, Exchanges: []string{ex}, ConfirmTimeout: 2 * time.Second})

	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{Exchange: ex, RoutingKey: "bound", Body: make([]byte, size), MessageID: fmt.Sprint(i), DueMs: 1}
	}
	began := time.Now()
	errs := p.Publish(context.Background(), msgs)
	kinds := map[string]int{}
	for _, err := range errs {
		kinds[Kind(err)]++
	}
	t.Logf("%d × %d KiB over a 2 MB/s link in %s: %v", n, size>>10, time.Since(began).Round(time.Millisecond), kinds)
	if kinds["confirmed"] != n {
		t.Fatalf("outcomes %v, want all %d confirmed", kinds, n)
	}
	for k := 0; k < n; k++ {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Fatalf("consumer got %d of %d messages", k, n)
		}
	}
}

// Under a memory alarm the broker stops reading from a connection once it
// publishes on it, so every RPC on it (channel.open, confirm.select,
// channel.close) hangs for as long as the alarm lasts. PublishAlone must
// give up within its timeout instead, the first time (its publish blocks
// the connection) as the second (its channel.open is never read).
func TestPublishAloneBoundedUnderAlarm(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	ex := testenv.Name(t)
	const timeout = time.Second
	p := runPublisherWith(t, Options{URLs: []string{node.AMQPURL()}, Exchanges: []string{ex}, ConfirmTimeout: timeout})
	if err := node.SetAlarm("memory"); err != nil {
		t.Fatal(err)
	}
	// The alarm lasts until the test is done with it; anything still
	// hanging then gets its answer and can end.
	cleared := false
	clear := func() {
		if !cleared {
			cleared = true
			if err := node.ClearAlarm("memory"); err != nil {
				t.Error(err)
			}
		}
	}
	defer clear()

	for try := 1; try <= 2; try++ {
		res := make(chan error, 1)
		began := time.Now()
		go func() {
			res <- p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "k", Body: []byte("x")}, nil)
		}()
		select {
		case err := <-res:
			t.Logf("try %d under the alarm: %v after %s", try, err, time.Since(began).Round(time.Millisecond))
			if Kind(err) != "timeout" {
				t.Fatalf("try %d under the alarm: %v (kind %s), want a timeout", try, err, Kind(err))
			}
		case <-time.After(10 * timeout):
			clear()
			err := <-res
			t.Fatalf("try %d: PublishAlone still waiting %s into the alarm (confirm timeout %s); it returned %v only once the alarm cleared",
				try, 10*timeout, timeout, err)
		}
	}
	clear()
	// Once the alarm is over, the shared connection works again.
	waitFor(t, 30*time.Second, "the publisher to be ready", p.Ready)
}

// waitFor polls cond every 20 ms until it holds, failing the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", limit, what)
		}
	}
}

// A batch larger than the window of unanswered publishes goes out as
// answers free up room, and returns still match their own messages.
func TestBatchLargerThanWindow(t *testing.T) {
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	got := testenv.Consumer(t, conn, ex, "bound")
	go func() {
		for range got { // ends when the consumer's cleanup closes its channel
		}
	}()
	p := runPublisherWith(t, Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{ex}, ConfirmTimeout: 10 * time.Second})
	n := 3*maxOutstanding + 7
	msgs := make([]Message, n)
	for i := range msgs {
		key := "bound"
		if i%100 == 0 {
			key = "nobody-listens"
		}
		msgs[i] = Message{Exchange: ex, RoutingKey: key, Body: []byte(fmt.Sprint(i)), MessageID: "same-id", DueMs: 1}
	}
	errs := p.Publish(context.Background(), msgs)
	for i, err := range errs {
		want := "confirmed"
		if i%100 == 0 {
			want = "returned"
		}
		if Kind(err) != want {
			t.Fatalf("message %d of %d: %v (kind %s), want %s", i, n, err, Kind(err), want)
		}
	}
}

// A broker that stops answering (it blocks the connection during a memory
// alarm) still makes every publish time out: waiting on while answers
// come in does not mean waiting forever when none do.
func TestPublishTimesOutWhenBrokerStopsAnswering(t *testing.T) {
	node := testenv.PrivateRabbit(t)
	ex := testenv.Name(t)
	const timeout = time.Second
	p := runPublisherWith(t, Options{URLs: []string{node.AMQPURL()}, Exchanges: []string{ex}, ConfirmTimeout: timeout})
	if err := node.SetAlarm("memory"); err != nil {
		t.Fatal(err)
	}
	msgs := make([]Message, 50)
	for i := range msgs {
		msgs[i] = Message{Exchange: ex, RoutingKey: "k", Body: []byte(fmt.Sprint(i)), MessageID: fmt.Sprint(i), DueMs: 1}
	}
	before, _ := p.session()
	res := make(chan []error, 1)
	go func() { res <- p.Publish(context.Background(), msgs) }()
	select {
	case errs := <-res:
		for i, err := range errs {
			if Kind(err) != "timeout" {
				t.Errorf("message %d under the alarm: %v (kind %s), want a timeout", i, err, Kind(err))
			}
		}
		// The broker said why it does not answer: the connection is kept
		// (a new one would be blocked all the same).
		time.Sleep(200 * time.Millisecond)
		if after, _ := p.session(); after != before {
			t.Error("the connection was replaced under the alarm")
		}
	case <-time.After(10 * timeout):
		if err := node.ClearAlarm("memory"); err != nil {
			t.Error(err)
		}
		<-res
		t.Fatalf("Publish still waiting %s into the alarm (confirm timeout %s)", 10*timeout, timeout)
	}
}

// The batch counter counts publish calls with a message confirmed: one
// per call however many messages it carries; a call of nothing but
// unroutable messages, and an empty one, count nothing.
func TestPublishBatchesCounted(t *testing.T) {
	conn := testenv.AMQP(t)
	ex := testenv.Name(t)
	testenv.Consumer(t, conn, ex, "bound")
	reg := prometheus.NewRegistry()
	met := NewMetrics(reg)
	p := runPublisherWith(t, Options{URLs: []string{testenv.AMQPURL(t)}, Exchanges: []string{ex}, ConfirmTimeout: 5 * time.Second, Metrics: met})
	msg := func(key string) Message {
		return Message{Exchange: ex, RoutingKey: key, Body: []byte("x"), MessageID: "id", DueMs: 1}
	}
	for _, batch := range [][]Message{
		{msg("bound"), msg("bound"), msg("bound")},
		{msg("bound"), msg("nobody-listens")},
		{msg("nobody-listens")},
		nil,
	} {
		p.Publish(context.Background(), batch)
	}
	if err := p.PublishAlone(context.Background(), msg("bound"), nil); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(met.batches); got != 3 {
		t.Errorf("dispatcher_broker_publish_batches_total = %v, want 3", got)
	}
}
