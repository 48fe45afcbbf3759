package publisher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// seqHeader carries each publish's delivery tag, so that a returned message
// is matched to its own publish even when two queues publish the same
// message_id (same member, same due time) on the one channel.
const seqHeader = "x-dispatcher-seq"

// maxOutstanding bounds the publishes of a session that the broker has not
// yet answered (ack or nack). amqp091-go drops a notification that its
// listener does not take within 5 s; with this bound, the confirm and
// return buffers hold every answer that can be outstanding, so the library
// never waits on them, however long the confirm loop is held up. Nothing
// else bounds it: batch size × pipeline × queues runs to hundreds of
// thousands, the cork limits bytes not yet written rather than answers,
// and a publish whose caller gave up still awaits its answer.
const maxOutstanding = 4096

// drainWait bounds how long a closing session waits for the library to
// hand over the last answers: it closes the confirms channel right after
// it signals the close, unless a publish blocked in a socket write holds
// the channel's lock.
const drainWait = time.Second

// waiter is one publish waiting for its confirm.
type waiter struct {
	tag  uint64
	sent time.Time // when the message was handed to the connection
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
	// onBlocked hears connection.blocked and connection.unblocked, the
	// latest one only when it falls behind; it may block (it logs).
	onBlocked func(amqp.Blocking)
	blockNote chan amqp.Blocking // the latest one onBlocked has not heard yet

	gaveUp   atomic.Pointer[LostError] // why giveUp ended the session, if it did
	slots    chan struct{}             // one per publish sent and not yet answered
	answered atomic.Int64              // when the latest answer came, as time since started
	acked    atomic.Int64              // when the latest ack came (0: none yet), likewise
	// waiting is when the channel began to wait for a confirm after its
	// latest ack: when the first publish since that ack was written while
	// none was unanswered (likewise as time since started).
	waiting atomic.Int64

	pubMu sync.Mutex // serializes publishes so delivery tags match waiters

	mu         sync.Mutex
	pending    map[uint64]*waiter
	unanswered int                       // publishes written and not yet acked or nacked
	returned   map[uint64]*ReturnedError // delivery tag -> return not yet matched to its confirm
	dead       error                     // set once the session is closed
	closing    chan struct{}             // closed when dead is set

	done    chan struct{}  // closed when the confirm loop has finished
	helpers sync.WaitGroup // goroutines that close waits for
}

func newSession(conn *amqp.Connection, ch *amqp.Channel) *session {
	return &session{
		conn: conn, ch: ch, started: time.Now(),
		blockNote: make(chan amqp.Blocking, 1),
		slots:     make(chan struct{}, maxOutstanding),
		pending:   map[uint64]*waiter{},
		returned:  map[uint64]*ReturnedError{},
		closing:   make(chan struct{}),
		done:      make(chan struct{}),
	}
}

// start registers the session's listeners on its channel and connection
// and starts its goroutines.
func (s *session) start() {
	confirms := s.ch.NotifyPublish(make(chan amqp.Confirmation, maxOutstanding))
	returns := s.ch.NotifyReturn(make(chan amqp.Return, maxOutstanding))
	chClose := s.ch.NotifyClose(make(chan *amqp.Error, 1))
	connClose := s.conn.NotifyClose(make(chan *amqp.Error, 1))
	blocked := s.conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	s.helpers.Add(1)
	go s.tellBlocked()
	go s.confirmLoop(confirms, returns, chClose, connClose, blocked)
}

// acquire takes a slot for one publish, waiting at most timeout for an
// answer to free one up.
func (s *session) acquire(ctx context.Context, timeout time.Duration) (waited bool, err error) {
	select {
	case s.slots <- struct{}{}:
		return false, nil
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return true, nil
	case <-t.C:
		return true, ErrTimeout
	case <-ctx.Done():
		return true, ErrStopped
	case <-s.closing:
		return true, s.deadErr()
	}
}

func (s *session) release() {
	select {
	case <-s.slots:
	default:
	}
}

// publish sends one message, on a slot taken with acquire, and returns its
// waiter; a waiter whose publish could not be sent is already resolved.
func (s *session) publish(ctx context.Context, exchange, key string, msg amqp.Publishing) *waiter {
	w := newWaiter()
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	s.mu.Lock()
	if s.dead != nil {
		err := afterEnd(s.dead)
		s.mu.Unlock()
		s.release()
		w.resolve(err)
		return w
	}
	w.tag = s.ch.GetNextPublishSeqNo()
	s.pending[w.tag] = w
	if s.unanswered == 0 && s.waiting.Load() <= s.acked.Load() {
		s.waiting.Store(int64(time.Since(s.started)))
	}
	s.unanswered++
	s.mu.Unlock()
	msg.Headers[seqHeader] = int64(w.tag)
	err := s.ch.PublishWithContext(ctx, exchange, key, true, false, msg)
	w.sent = time.Now()
	if err != nil {
		// The library took no delivery tag for it: no answer will come.
		s.mu.Lock()
		s.unanswered--
		s.mu.Unlock()
		s.forget(w)
		s.release()
		w.resolve(&LostError{Reason: err.Error()})
	}
	return w
}

// confirmDeadline is when w counts as timed out: timeout after it was
// written, or after the latest answer on the channel if that is later.
// Written is not sent: the kernel takes megabytes at once, which a slow
// link then needs seconds to carry. Answers come in publish order (the
// library puts them in order), so while they keep coming the broker is
// working through what was sent before w; when they stop for the timeout,
// w is given up.
func (s *session) confirmDeadline(w *waiter, timeout time.Duration) time.Time {
	from := w.sent
	if a := s.started.Add(time.Duration(s.answered.Load())); a.After(from) {
		from = a
	}
	return from.Add(timeout)
}

// alone is a confirm-mode channel opened for one message.
type alone struct {
	ch       *amqp.Channel
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closed   chan *amqp.Error
}

// publishAlone opens a confirm-mode channel of its own and publishes msg
// on it (mandatory), giving up after timeout: a broker that blocks the
// connection (a memory or disk alarm) answers no RPC on it for as long as
// the alarm lasts. The RPCs then finish in the background, at the latest
// when the session ends. A channel it returns, with or without an error,
// is the caller's to close.
//
// With the channel open, and right before msg is written, it asks still
// (nil: nothing to ask): what the caller checked before calling may no
// longer hold after that wait. If still returns an error, msg is not
// written and that is the error. still runs on the caller's goroutine,
// and only while the caller still waits.
func (s *session) publishAlone(ctx context.Context, timeout time.Duration, exchange, key string, msg amqp.Publishing, still func() error) (*alone, error) {
	type result struct {
		a   *alone
		err error
	}
	res := make(chan result)
	abandoned := make(chan struct{})
	ask, answer := make(chan struct{}), make(chan error, 1) // still, asked of the caller
	if !s.spawn(func() {
		var r result
		if ch, err := s.conn.Channel(); err != nil {
			r.err = &LostError{Reason: err.Error()}
		} else if err := ch.Confirm(false); err != nil {
			r.a, r.err = &alone{ch: ch}, &LostError{Reason: err.Error()}
		} else {
			r.a = &alone{
				ch:       ch,
				confirms: ch.NotifyPublish(make(chan amqp.Confirmation, 1)),
				returns:  ch.NotifyReturn(make(chan amqp.Return, 1)),
				closed:   ch.NotifyClose(make(chan *amqp.Error, 1)),
			}
			if still != nil {
				select {
				case ask <- struct{}{}:
					r.err = <-answer
				case <-abandoned:
					ch.Close()
					return
				}
			}
			if r.err == nil {
				if err := ch.PublishWithContext(ctx, exchange, key, true, false, msg); err != nil {
					r.err = &LostError{Reason: err.Error()}
				}
			}
		}
		select {
		case res <- r:
		case <-abandoned:
			if r.a != nil {
				r.a.ch.Close()
			}
		}
	}) {
		return nil, s.deadErr()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case <-ask:
			answer <- still()
		case r := <-res:
			return r.a, r.err
		case <-t.C:
			close(abandoned)
			return nil, fmt.Errorf("open a channel of its own: the broker did not answer: %w", ErrTimeout)
		case <-ctx.Done():
			close(abandoned)
			return nil, ErrStopped
		case <-s.closing:
			close(abandoned)
			return nil, s.deadErr()
		}
	}
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

// spawn runs f in a goroutine that close waits for; it reports false,
// running nothing, once the session is closed.
func (s *session) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead != nil {
		return false
	}
	s.helpers.Add(1)
	go func() {
		defer s.helpers.Done()
		f()
	}()
	return true
}

// confirmLoop matches confirms and returns to waiters until the channel
// or connection closes. It never blocks on anything but its inputs, so
// the library never has to wait for it (see maxOutstanding).
//
// The broker sends basic.return before the basic.ack of the same message,
// and the library hands the return over before it reads the ack; but from
// two buffered channels a select may take the ack first. So before each
// confirm the returns already handed over are taken: its own is among
// them.
func (s *session) confirmLoop(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, chClose, connClose <-chan *amqp.Error, blocked <-chan amqp.Blocking) {
	defer close(s.done)
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			s.noteReturn(r)
		case c, ok := <-confirms:
			if !ok {
				// The library sends the close reason (buffered) before it
				// closes the confirms channel: pick it up if it is there.
				select {
				case e := <-chClose:
					s.shutdown(s.end(s.channelClosed(e)))
				default:
					s.shutdown(s.end(&LostError{Reason: "channel closed"}))
				}
				return
			}
			s.takeReturns(returns)
			s.confirm(c)
		case e := <-chClose:
			s.drain(confirms, returns)
			s.shutdown(s.end(s.channelClosed(e)))
			return
		case e := <-connClose:
			s.drain(confirms, returns)
			reason := "connection closed"
			if e != nil {
				reason = e.Error()
			}
			s.shutdown(s.end(&LostError{Reason: reason}))
			return
		case b, ok := <-blocked:
			if !ok {
				blocked = nil
				continue
			}
			s.blocked.Store(b.Active)
			// Replace what tellBlocked has not taken yet; as the only
			// sender, this send finds room.
			select {
			case <-s.blockNote:
			default:
			}
			s.blockNote <- b
		}
	}
}

// tellBlocked passes blocked and unblocked notes on to onBlocked, away
// from the confirm loop: a log write may stall.
func (s *session) tellBlocked() {
	defer s.helpers.Done()
	for {
		select {
		case b := <-s.blockNote:
			if s.onBlocked != nil {
				s.onBlocked(b)
			}
		case <-s.done:
			return
		}
	}
}

// drain settles the publishes whose answers the library handed over
// before a close: the broker has them, and failing them would publish them
// again. The library closes the confirms channel once it has closed the
// channel; if that takes too long, what is buffered by then is taken.
func (s *session) drain(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return) {
	t := time.NewTimer(drainWait)
	defer t.Stop()
	late := false
	for {
		var c amqp.Confirmation
		ok := false
		if late {
			select {
			case c, ok = <-confirms:
			default:
				return
			}
		} else {
			select {
			case c, ok = <-confirms:
			case <-t.C:
				late = true
				continue
			}
		}
		if !ok {
			return
		}
		s.takeReturns(returns)
		s.confirm(c)
	}
}

// takeReturns notes every return already handed over, without waiting.
func (s *session) takeReturns(returns <-chan amqp.Return) {
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				return
			}
			s.noteReturn(r)
		default:
			return
		}
	}
}

func (s *session) noteReturn(r amqp.Return) {
	if tag, ok := r.Headers[seqHeader].(int64); ok {
		s.mu.Lock()
		s.returned[uint64(tag)] = &ReturnedError{Code: r.ReplyCode, Reason: r.ReplyText}
		s.mu.Unlock()
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
	s.answered.Store(int64(time.Since(s.started)))
	if c.Ack {
		s.acked.Store(int64(time.Since(s.started)))
	}
	s.release()
	s.mu.Lock()
	if s.unanswered > 0 {
		s.unanswered--
	}
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

// giveUp ends the session from outside its confirm loop: closing the
// connection ends the loop, which settles what was answered meanwhile
// (drain) and fails the rest with err; the publisher then connects anew.
func (s *session) giveUp(err *LostError) {
	s.gaveUp.CompareAndSwap(nil, err)
	s.spawn(func() { _ = s.conn.CloseDeadline(time.Now().Add(time.Second)) })
}

// unconfirmedFor is how long the channel has confirmed nothing while it
// had something to confirm: since its latest ack, or since it began to
// wait for a confirm after that ack if that is later. Counting from the
// ack alone counted an idle spell too, so the first nack after a quiet
// while (a full reject-publish queue) gave up a healthy channel and failed
// every other publish in flight on it. A channel that only nacks, or never
// answers, still reaches the timeout: nacks do not restart the count, nor
// do the pauses between its publishes.
func (s *session) unconfirmedFor() time.Duration {
	from := max(s.acked.Load(), s.waiting.Load())
	return time.Since(s.started.Add(time.Duration(from)))
}

// end is err, unless giveUp ended the session: then its reason.
func (s *session) end(err error) error {
	if g := s.gaveUp.Load(); g != nil {
		return g
	}
	return err
}

// shutdown fails every waiting publish with err; later publishes fail at once.
func (s *session) shutdown(err error) {
	s.mu.Lock()
	if s.dead == nil {
		s.dead = err
		close(s.closing)
	}
	pending := s.pending
	s.pending = map[uint64]*waiter{}
	s.mu.Unlock()
	for _, w := range pending {
		w.resolve(err)
	}
}

// deadErr is why the session ended, as given to work that comes after
// the end: that work never reached the broker, so a channel closed over
// another message (a 406 refusal of it) is only a lost connection to it.
// The publishes that were on the channel get the real reason (shutdown).
func (s *session) deadErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return afterEnd(s.dead)
}

// afterEnd is the session's end err as given to a publish that came after it.
func afterEnd(err error) error {
	var le *LostError
	if errors.As(err, &le) && le.Code != 0 {
		return &LostError{Reason: "the session ended before this publish: " + le.Error()}
	}
	return err
}

// close ends the session and waits for its goroutines. Closing the
// connection ends any RPC still waiting on it.
func (s *session) close() {
	s.shutdown(&LostError{Reason: "publisher closed"})
	// The close handshake is a courtesy to the broker: a healthy one
	// answers within milliseconds, and waiting longer for a stalled one
	// would only stretch the daemon's shutdown past its timeout.
	_ = s.conn.CloseDeadline(time.Now().Add(time.Second))
	<-s.done
	s.helpers.Wait()
}
