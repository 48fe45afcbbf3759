// Package publisher publishes tasks to RabbitMQ with publisher confirms
// and mandatory routing, over one connection that heals itself.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
)

// Message is one task to publish.
type Message struct {
	Exchange   string
	RoutingKey string
	Body       []byte
	MessageID  string
	DueMs      int64
}

// Options configure a Publisher.
type Options struct {
	URL            string        // amqp:// or amqps://; never logged
	Exchanges      []string      // declared durable direct if missing, used as they are otherwise
	ConfirmTimeout time.Duration // how long one publish may wait for its confirm
	Logger         *slog.Logger
	Metrics        *Metrics // optional
	// ConnectionName shows in the broker's connection list.
	ConnectionName string
}

// Publisher keeps one AMQP connection with a confirm-mode channel and
// publishes over it. Run keeps it connected; Publish may be called from
// many goroutines.
type Publisher struct {
	opt Options
	log *slog.Logger

	mu      sync.Mutex
	cur     *session
	changed chan struct{} // closed and replaced whenever cur changes
}

// New returns a Publisher; call Run to connect.
func New(opt Options) *Publisher {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if opt.ConfirmTimeout <= 0 {
		opt.ConfirmTimeout = 10 * time.Second
	}
	if opt.ConnectionName == "" {
		host, _ := os.Hostname()
		opt.ConnectionName = fmt.Sprintf("dispatcher %s pid %d", host, os.Getpid())
	}
	return &Publisher{opt: opt, log: opt.Logger, changed: make(chan struct{})}
}

// Run connects, and reconnects with backoff whenever the connection or
// channel is lost, until ctx ends. It returns nil when ctx ends.
func (p *Publisher) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	var lastErr string
	for {
		s, err := p.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.opt.Metrics.connectError()
			// Log each distinct failure once, not once per try.
			if msg := err.Error(); msg != lastErr {
				p.log.Warn("broker connect failed; retrying", "err", err, "retry_in", backoff)
				lastErr = msg
			}
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, 5*time.Second)
			continue
		}
		if lastErr != "" {
			p.log.Info("broker connected again")
		} else {
			p.log.Info("broker connected")
		}
		lastErr, backoff = "", 50*time.Millisecond
		p.opt.Metrics.connected(true)
		p.set(s)
		select {
		case <-s.done:
		case <-ctx.Done():
		}
		p.set(nil)
		p.opt.Metrics.connected(false)
		s.close()
		if ctx.Err() != nil {
			return nil
		}
		p.log.Warn("broker connection lost; reconnecting", "err", s.dead)
		lastErr = "lost"
	}
}

func (p *Publisher) set(s *session) {
	p.mu.Lock()
	p.cur = s
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *Publisher) session() (*session, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur, p.changed
}

// Ready reports whether a connection is up.
func (p *Publisher) Ready() bool {
	s, _ := p.session()
	return s != nil
}

// WaitReady blocks until a connection is up or ctx ends.
func (p *Publisher) WaitReady(ctx context.Context) error {
	for {
		s, changed := p.session()
		if s != nil {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (p *Publisher) connect(ctx context.Context) (*session, error) {
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": p.opt.ConnectionName},
		Dial:       amqp.DefaultDial(10 * time.Second),
	}
	conn, err := amqp.DialConfig(p.opt.URL, cfg)
	if err != nil {
		return nil, fmt.Errorf("dial broker: %w", redact.Error(err))
	}
	if err := p.declare(conn); err != nil {
		conn.Close()
		return nil, err
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		conn.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	s := newSession(conn, ch)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	returns := ch.NotifyReturn(make(chan amqp.Return))
	chClose := ch.NotifyClose(make(chan *amqp.Error, 1))
	connClose := conn.NotifyClose(make(chan *amqp.Error, 1))
	go s.confirmLoop(confirms, returns, chClose, connClose)
	return s, nil
}

// declare makes sure every exchange exists: one that exists is used as it
// is (whatever its type), a missing one is declared durable direct.
func (p *Publisher) declare(conn *amqp.Connection) error {
	for _, ex := range p.opt.Exchanges {
		if ex == "" {
			continue // the default exchange always exists
		}
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		err = ch.ExchangeDeclarePassive(ex, "direct", true, false, false, false, nil)
		if err == nil {
			ch.Close()
			continue
		}
		var ae *amqp.Error
		if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
			return fmt.Errorf("check exchange %q: %w", ex, err)
		}
		// The passive check closed that channel; declare on a new one.
		if ch, err = conn.Channel(); err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		if err := ch.ExchangeDeclare(ex, "direct", true, false, false, false, nil); err != nil {
			return fmt.Errorf("declare exchange %q: %w", ex, err)
		}
		ch.Close()
		p.log.Info("declared missing exchange", "exchange", ex, "type", "direct", "durable", true)
	}
	return nil
}

// Publish publishes msgs and waits until each is confirmed or has failed,
// at most the confirm timeout, or until ctx ends. errs[i] is nil only
// when the broker confirmed msgs[i] and did not return it.
func (p *Publisher) Publish(ctx context.Context, msgs []Message) []error {
	errs := make([]error, len(msgs))
	s, _ := p.session()
	if s == nil {
		for i := range errs {
			errs[i] = ErrNotConnected
		}
		return errs
	}
	now := time.Now()
	ws := make([]*waiter, len(msgs))
	for i, m := range msgs {
		ws[i] = s.publish(ctx, m.Exchange, m.RoutingKey, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    m.MessageID,
			Timestamp:    now,
			Headers:      amqp.Table{"x-due-ms": m.DueMs},
			Body:         m.Body,
		}, m.MessageID)
	}
	timeout := time.NewTimer(p.opt.ConfirmTimeout)
	defer timeout.Stop()
	for i, w := range ws {
		select {
		case <-w.done:
			errs[i] = w.err
			continue
		default:
		}
		select {
		case <-w.done:
			errs[i] = w.err
		case <-timeout.C:
			errs[i] = ErrTimeout
			s.forget(w)
			for j := i + 1; j < len(ws); j++ {
				select {
				case <-ws[j].done:
					errs[j] = ws[j].err
				default:
					errs[j] = ErrTimeout
					s.forget(ws[j])
				}
			}
			return errs
		case <-ctx.Done():
			for j := i; j < len(ws); j++ {
				select {
				case <-ws[j].done:
					errs[j] = ws[j].err
				default:
					errs[j] = ErrStopped
					s.forget(ws[j])
				}
			}
			return errs
		}
	}
	return errs
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
