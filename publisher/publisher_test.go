package publisher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dispatcher/dispatcher/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func runPublisher(t *testing.T, exchanges ...string) *Publisher {
	t.Helper()
	p := New(Options{
		URL: testenv.AMQPURL(t), Exchanges: exchanges, ConfirmTimeout: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
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
	if err := p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "bound", Body: []byte("x")}); err != nil {
		t.Fatalf("routable: %v", err)
	}
	if err := p.PublishAlone(context.Background(), Message{Exchange: ex, RoutingKey: "nobody", Body: []byte("x")}); Kind(err) != "returned" {
		t.Fatalf("unroutable: %v", err)
	}
	if !p.Ready() {
		t.Fatal("the shared channel suffered")
	}
}

func TestNotConnected(t *testing.T) {
	p := New(Options{URL: "amqp://guest:guest@127.0.0.1:1/", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
