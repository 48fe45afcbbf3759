package bench

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
)

// routingKey is the bench queue's routing key: the dispatcher's default,
// the queue name (each queue's own name for the others).
const routingKey = benchQueue

// sink is the measuring consumer: an exchange of its own with one queue of
// the chosen type bound to it, consumed on its own connection, every
// delivery handed to a recorder. By default it consumes like a worker:
// with a QoS prefetch, acking each delivery on its own right after it is
// recorded; with -autoack, the broker counts a message done once sent.
type sink struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	queue    string
	autoAck  bool
	prefetch int
	done     chan struct{}
	// rec gets every delivery; use swaps it (the floor's own after a
	// point's tasks).
	rec atomic.Pointer[recorder]
	// ackFailed counts acks that could not be sent (the channel had
	// closed); the first error is kept in ackErr, read after stop.
	ackFailed atomic.Int64
	ackErr    error
}

const consumerTag = "dispatcher-bench"

// openSink declares exchange name (durable direct, as the dispatcher
// would) and a queue name of the options' queue type bound to it with
// each of keys (none: routingKey), and starts consuming as the options
// say.
func openSink(opt *Options, name string, keys []string, rec *recorder) (*sink, error) {
	conn, err := amqp.DialConfig(opt.firstAMQP(), amqp.Config{
		Properties: amqp.Table{"connection_name": "dispatcher bench consumer"},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: dial broker: %w", redact.Error(err))
	}
	s := &sink{conn: conn, exchange: name, queue: name, autoAck: opt.AutoAck, prefetch: opt.Prefetch, done: make(chan struct{})}
	s.rec.Store(rec)
	if len(keys) == 0 {
		keys = []string{routingKey}
	}
	if err := s.declare(opt.QueueType, keys); err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

func (s *sink) declare(queueType string, keys []string) error {
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("consumer: open channel: %w", err)
	}
	s.ch = ch
	if err := ch.ExchangeDeclare(s.exchange, "direct", true, false, false, false, nil); err != nil {
		return fmt.Errorf("consumer: declare exchange %s: %w", s.exchange, err)
	}
	durable, autoDelete, exclusive := true, false, false
	var args amqp.Table
	switch queueType {
	case queueQuorum:
		args = amqp.Table{"x-queue-type": "quorum"}
	case queueTransient:
		durable, autoDelete, exclusive = false, true, true
	}
	if _, err := ch.QueueDeclare(s.queue, durable, autoDelete, exclusive, false, args); err != nil {
		return fmt.Errorf("consumer: declare %s queue %s: %w", queueType, s.queue, err)
	}
	for _, key := range keys {
		if err := ch.QueueBind(s.queue, key, s.exchange, false, nil); err != nil {
			return fmt.Errorf("consumer: bind queue %s with %s: %w", s.queue, key, err)
		}
	}
	if !s.autoAck {
		// Per consumer (global false): RabbitMQ's usual meaning.
		if err := ch.Qos(s.prefetch, 0, false); err != nil {
			return fmt.Errorf("consumer: prefetch %d: %w", s.prefetch, err)
		}
	}
	deliveries, err := ch.Consume(s.queue, consumerTag, s.autoAck, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consumer: consume %s: %w", s.queue, err)
	}
	go func() {
		defer close(s.done)
		for d := range deliveries {
			s.handle(&d, s.rec.Load())
		}
	}()
	return nil
}

// handle takes one delivery as a worker would: the receipt time first,
// then the recording, then (unless auto-ack) the ack, so that the ack's
// cost is never part of the lateness.
func (s *sink) handle(d *amqp.Delivery, rec *recorder) {
	now := time.Now()
	rec.record(d, now)
	if s.autoAck {
		return
	}
	if err := d.Ack(false); err != nil {
		if s.ackFailed.Add(1) == 1 {
			s.ackErr = err
		}
	}
}

// use hands every later delivery to rec instead.
func (s *sink) use(rec *recorder) { s.rec.Store(rec) }

// ackError describes the acks that failed, or is nil; call after stop.
func (s *sink) ackError() error {
	if n := s.ackFailed.Load(); n > 0 {
		return fmt.Errorf("consumer: %d acks failed, the first: %w", n, s.ackErr)
	}
	return nil
}

// stop ends consuming; once it returns the recorder is no longer written.
func (s *sink) stop() {
	if s.ch != nil {
		_ = s.ch.Cancel(consumerTag, false)
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		// Closing the connection closes the deliveries channel for sure.
		s.conn.Close()
		<-s.done
	}
}

// close stops consuming and deletes the queue and the exchange.
func (s *sink) close() error {
	s.stop()
	defer s.conn.Close()
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("consumer: delete %s: %w", s.queue, err)
	}
	defer ch.Close()
	_, errQ := ch.QueueDelete(s.queue, false, false, false)
	errX := ch.ExchangeDelete(s.exchange, false, false)
	return errors.Join(errQ, errX)
}
