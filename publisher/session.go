package publisher

import (
	"context"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// waiter is one publish waiting for its confirm.
type waiter struct {
	tag   uint64
	msgID string
	done  chan struct{}
	err   error
}

// session is one connection with one confirm-mode channel. It dies as a
// whole: on any close, every waiting publish fails and the Publisher
// builds a new session.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel

	pubMu sync.Mutex // serializes publishes so delivery tags match waiters

	mu       sync.Mutex
	pending  map[uint64]*waiter
	returned map[string][]*ReturnedError // message id -> returns not yet matched to a confirm
	dead     error                       // set once the session is closed

	done chan struct{} // closed when the confirm loop has finished
}

func newSession(conn *amqp.Connection, ch *amqp.Channel) *session {
	return &session{
		conn: conn, ch: ch,
		pending:  map[uint64]*waiter{},
		returned: map[string][]*ReturnedError{},
		done:     make(chan struct{}),
	}
}

// publish sends one message and returns its waiter; a waiter whose publish
// could not be sent is already resolved.
func (s *session) publish(ctx context.Context, exchange, key string, msg amqp.Publishing, msgID string) *waiter {
	w := &waiter{msgID: msgID, done: make(chan struct{})}
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.mu.Lock()
	if s.dead != nil {
		s.mu.Unlock()
		w.resolve(s.dead)
		return w
	}
	tag := s.ch.GetNextPublishSeqNo()
	w.tag = tag
	s.pending[tag] = w
	s.mu.Unlock()
	if err := s.ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
		s.mu.Lock()
		delete(s.pending, tag)
		s.mu.Unlock()
		w.resolve(&LostError{Reason: err.Error()})
	}
	return w
}

// forget drops a waiter that the caller stopped waiting for; a late
// confirm for it is then ignored.
func (s *session) forget(w *waiter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[w.tag] == w {
		delete(s.pending, w.tag)
	}
}

func (w *waiter) resolve(err error) {
	w.err = err
	close(w.done)
}

// confirmLoop matches confirms and returns to waiters until the channel
// or connection closes. Returns come on an unbuffered channel and are read
// here, in the same goroutine as confirms: the broker sends basic.return
// before the basic.ack of the same message, and the library hands the
// return over before it reads the ack, so a returned message is always
// known as such by the time its ack is seen.
func (s *session) confirmLoop(confirms chan amqp.Confirmation, returns chan amqp.Return, chClose, connClose chan *amqp.Error) {
	defer close(s.done)
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.mu.Lock()
			s.returned[r.MessageId] = append(s.returned[r.MessageId], &ReturnedError{Code: r.ReplyCode, Reason: r.ReplyText})
			s.mu.Unlock()
		case c, ok := <-confirms:
			if !ok {
				// The library sends the close reason (buffered) before it
				// closes the confirms channel: pick it up if it is there.
				select {
				case e := <-chClose:
					s.shutdown(s.channelClosed(e))
				default:
					s.shutdown(&LostError{Reason: "channel closed"})
				}
				return
			}
			s.confirm(c)
		case e := <-chClose:
			s.shutdown(s.channelClosed(e))
			return
		case e := <-connClose:
			reason := "connection closed"
			if e != nil {
				reason = e.Error()
			}
			s.shutdown(&LostError{Reason: reason})
			return
		}
	}
}

// channelClosed classifies a channel close. The library marks the
// connection closed before it closes its channels, so an open connection
// here means a channel-level exception: the broker refused something.
func (s *session) channelClosed(e *amqp.Error) error {
	switch {
	case e == nil:
		return &LostError{Reason: "channel closed"}
	case s.conn.IsClosed():
		return &LostError{Reason: e.Error()}
	default:
		return &LostError{Code: e.Code, Reason: e.Reason, Refused: e.Code == amqp.PreconditionFailed}
	}
}

func (s *session) confirm(c amqp.Confirmation) {
	s.mu.Lock()
	w := s.pending[c.DeliveryTag]
	delete(s.pending, c.DeliveryTag)
	if w == nil {
		s.mu.Unlock()
		return
	}
	var err error
	if rs := s.returned[w.msgID]; len(rs) > 0 {
		err = rs[0]
		if len(rs) == 1 {
			delete(s.returned, w.msgID)
		} else {
			s.returned[w.msgID] = rs[1:]
		}
	}
	if !c.Ack {
		err = ErrNacked
	}
	s.mu.Unlock()
	w.resolve(err)
}

// shutdown fails every waiting publish with err; later publishes fail at once.
func (s *session) shutdown(err error) {
	s.mu.Lock()
	if s.dead == nil {
		s.dead = err
	}
	pending := s.pending
	s.pending = map[uint64]*waiter{}
	s.mu.Unlock()
	for _, w := range pending {
		w.resolve(err)
	}
}

// close ends the session and waits for its confirm loop.
func (s *session) close() {
	s.shutdown(&LostError{Reason: "publisher closed"})
	_ = s.conn.Close()
	<-s.done
}
