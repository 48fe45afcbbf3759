package publisher

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// seqHeader carries each publish's delivery tag, so that a returned message
// is matched to its own publish even when two queues publish the same
// message_id (same member, same due time) on the one channel.
const seqHeader = "x-dispatcher-seq"

// waiter is one publish waiting for its confirm.
type waiter struct {
	tag  uint64
	done chan struct{}
	once sync.Once
	err  error
}

func newWaiter() *waiter { return &waiter{done: make(chan struct{})} }

// resolve settles the waiter; only the first call counts, since a closing
// channel and a failing publish may both try.
func (w *waiter) resolve(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
	})
}

// session is one connection with one confirm-mode channel. It dies as a
// whole: on any close, every waiting publish fails and the Publisher
// builds a new session.
type session struct {
	conn    *amqp.Connection
	ch      *amqp.Channel
	started time.Time
	blocked atomic.Bool // connection.blocked: the broker is not reading
	// onBlocked hears every connection.blocked and connection.unblocked.
	onBlocked func(amqp.Blocking)

	pubMu sync.Mutex // serializes publishes so delivery tags match waiters

	mu       sync.Mutex
	pending  map[uint64]*waiter
	returned map[uint64]*ReturnedError // delivery tag -> return not yet matched to its confirm
	dead     error                     // set once the session is closed

	done chan struct{} // closed when the confirm loop has finished
}

func newSession(conn *amqp.Connection, ch *amqp.Channel) *session {
	return &session{
		conn: conn, ch: ch, started: time.Now(),
		pending:  map[uint64]*waiter{},
		returned: map[uint64]*ReturnedError{},
		done:     make(chan struct{}),
	}
}

// publish sends one message and returns its waiter; a waiter whose publish
// could not be sent is already resolved.
func (s *session) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) *waiter {
	w := newWaiter()
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.mu.Lock()
	if s.dead != nil {
		s.mu.Unlock()
		w.resolve(s.dead)
		return w
	}
	w.tag = s.ch.GetNextPublishSeqNo()
	s.pending[w.tag] = w
	s.mu.Unlock()
	msg.Headers[seqHeader] = int64(w.tag)
	if err := s.ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
		s.forget(w)
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

// confirmLoop matches confirms and returns to waiters until the channel
// or connection closes. Returns come on an unbuffered channel and are read
// here, in the same goroutine as confirms: the broker sends basic.return
// before the basic.ack of the same message, and the library hands the
// return over before it reads the ack, so a returned message is always
// known as such by the time its ack is seen.
func (s *session) confirmLoop(confirms chan amqp.Confirmation, returns chan amqp.Return, chClose, connClose chan *amqp.Error, blocked chan amqp.Blocking) {
	defer close(s.done)
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			if tag, ok := r.Headers[seqHeader].(int64); ok {
				s.mu.Lock()
				s.returned[uint64(tag)] = &ReturnedError{Code: r.ReplyCode, Reason: r.ReplyText}
				s.mu.Unlock()
			}
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
		case b, ok := <-blocked:
			if !ok {
				blocked = nil
				continue
			}
			s.blocked.Store(b.Active)
			if s.onBlocked != nil {
				s.onBlocked(b)
			}
		}
	}
}

// channelClosed classifies a channel close. The library marks the
// connection closed before it closes its channels, so an open connection
// here means a channel-level exception: the broker refused something.
func (s *session) channelClosed(e *amqp.Error) error {
	if e != nil && s.conn.IsClosed() {
		return &LostError{Reason: e.Error()}
	}
	return channelError(s.conn, e)
}

func (s *session) confirm(c amqp.Confirmation) {
	s.mu.Lock()
	w := s.pending[c.DeliveryTag]
	delete(s.pending, c.DeliveryTag)
	ret := s.returned[c.DeliveryTag]
	delete(s.returned, c.DeliveryTag)
	s.mu.Unlock()
	if w == nil {
		return
	}
	switch {
	case !c.Ack:
		w.resolve(ErrNacked)
	case ret != nil:
		w.resolve(ret)
	default:
		w.resolve(nil)
	}
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
	// The close handshake is a courtesy to the broker: a healthy one
	// answers within milliseconds, and waiting longer for a stalled one
	// would only stretch the daemon's shutdown past its timeout.
	_ = s.conn.CloseDeadline(time.Now().Add(time.Second))
	<-s.done
}
