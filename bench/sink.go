package bench

import (
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
)

// routingKey is the bench queue's routing key: the dispatcher's default,
// the queue name.
const routingKey = benchQueue

// sink is the measuring consumer: an exchange of its own with one queue of
// the chosen type bound to it, consumed with auto-ack on its own
// connection, every delivery handed to a recorder.
type sink struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	exchange string
	queue    string
	done     chan struct{}
}

const consumerTag = "dispatcher-bench"

// openSink declares exchange name (durable direct, as the dispatcher
// would) and queue name of queueType bound to it, and starts consuming.
func openSink(url, name, queueType string, rec *recorder) (*sink, error) {
	conn, err := amqp.DialConfig(url, amqp.Config{
		Properties: amqp.Table{"connection_name": "dispatcher bench consumer"},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("consumer: dial broker: %w", redact.Error(err))
	}
	s := &sink{conn: conn, exchange: name, queue: name, done: make(chan struct{})}
	if err := s.declare(queueType, rec); err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

func (s *sink) declare(queueType string, rec *recorder) error {
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
	if err := ch.QueueBind(s.queue, routingKey, s.exchange, false, nil); err != nil {
		return fmt.Errorf("consumer: bind queue %s: %w", s.queue, err)
	}
	deliveries, err := ch.Consume(s.queue, consumerTag, true, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consumer: consume %s: %w", s.queue, err)
	}
	go func() {
		defer close(s.done)
		for d := range deliveries {
			rec.record(&d, time.Now())
		}
	}()
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
