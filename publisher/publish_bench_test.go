package publisher

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// BenchmarkPublish measures Publish on the real broker: one op is one
// batch of 200-byte messages published with confirms, like one claimed
// batch of the dispatcher; concurrent batches at once, as with
// DISPATCHER_PIPELINE. The queue is exclusive and non-durable with a
// consumer draining it. Run it with
//
//	go test -run '^$' -bench Publish ./publisher/
func BenchmarkPublish(b *testing.B) {
	for _, c := range []struct{ batch, concurrent int }{{500, 1}, {500, 4}, {100, 4}} {
		b.Run(fmt.Sprintf("batch=%d/concurrent=%d", c.batch, c.concurrent), func(b *testing.B) {
			benchPublish(b, c.batch, c.concurrent)
		})
	}
}

func benchPublish(b *testing.B, batch, concurrent int) {
	conn := testenv.AMQP(b)
	ex := testenv.Name(b)
	deliveries := testenv.Consumer(b, conn, ex, "bound")
	var received atomic.Int64
	// Ends when the consumer's cleanup closes its channel.
	go func() {
		for range deliveries {
			received.Add(1)
		}
	}()

	p := New(Options{
		URLs: []string{testenv.AMQPURL(b)}, Exchanges: []string{ex}, ConfirmTimeout: 30 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	wait, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	if err := p.WaitReady(wait); err != nil {
		b.Fatalf("publisher not ready: %v", err)
	}

	msgs := make([]Message, batch)
	pad := strings.Repeat("x", 190)
	for i := range msgs {
		body := []byte(strconv.Itoa(i) + ":" + pad)
		msgs[i] = Message{Exchange: ex, RoutingKey: "bound", Body: body, MessageID: shard.MessageID(body, 1), DueMs: 1}
	}

	var next, failed atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for range concurrent {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				for _, err := range p.Publish(ctx, msgs) {
					if err != nil {
						failed.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d publishes failed", n)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "msgs/s")
	// Every confirmed message reaches the queue's consumer.
	deadline := time.Now().Add(30 * time.Second)
	for received.Load() < int64(b.N*batch) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := received.Load(); got != int64(b.N*batch) {
		b.Fatalf("consumer got %d of %d messages", got, b.N*batch)
	}
}
