// Package publisher publishes tasks to RabbitMQ with publisher confirms
// and mandatory routing, over one connection that heals itself, to one of
// the nodes of a cluster.
package publisher

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/internal/wait"
)

// Message is one task to publish.
type Message struct {
	Exchange   string
	RoutingKey string
	Body       []byte
	MessageID  string
	DueMs      int64
	// PublishedUs, when not 0, goes out as header x-published-us.
	PublishedUs int64
	// TaskID, when not empty, goes out as header x-task-id.
	TaskID string
	// Headers are added to the message's headers (values: string, int64,
	// bool); the dispatcher's own (x-due-ms, x-task-id, ...) win.
	Headers map[string]any
	// The AMQP basic properties of those names; empty: not set.
	ContentType     string
	ContentEncoding string
	CorrelationID   string
	ReplyTo         string
	Type            string
	Priority        uint8
	Expiration      string // per-message TTL in ms, as AMQP writes it
}

// Options configure a Publisher.
type Options struct {
	// URLs are the nodes of one cluster (or a single broker), in the order
	// they are tried: amqp:// or amqps://, mixed if need be; never logged.
	URLs           []string
	TLS            *tls.Config   // for amqps:// nodes: CA and client certificate; nil uses the system's CAs
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
	opt   Options
	log   *slog.Logger
	nodes []node

	mu      sync.Mutex
	cur     *session
	curNode string        // the node of cur
	changed chan struct{} // closed and replaced whenever cur changes
}

// node is one broker node: its URL and how logs and metrics name it.
type node struct {
	url  string
	addr string // host:port, without user or password
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
	p := &Publisher{opt: opt, log: opt.Logger, changed: make(chan struct{})}
	for _, u := range opt.URLs {
		p.nodes = append(p.nodes, node{url: u, addr: nodeAddr(u)})
	}
	opt.Metrics.nodes(p.nodes)
	return p
}

// nodeAddr names a node by host and port: never by its URL, which holds
// the password.
func nodeAddr(u string) string {
	uri, err := amqp.ParseURI(u)
	if err != nil {
		return "unparsable URL" // the settings check them before
	}
	return net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
}

// Shuffled returns urls in a random order, so that the instances of a
// cluster's dispatchers spread over its nodes.
func Shuffled(urls []string) []string {
	out := slices.Clone(urls)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// Run connects, and reconnects with backoff whenever the connection or
// channel is lost, until ctx ends. It returns nil when ctx ends.
//
// The nodes are tried in turn, starting with the first: a refused or
// failed connect moves on to the next node at once, and only when every
// node has failed in a row does it wait (with backoff) before the next
// round. A lost connection moves on to the next node too, since its node
// is the likeliest to be down; with one node that is the same node.
func (p *Publisher) Run(ctx context.Context) error {
	if len(p.nodes) == 0 {
		return errors.New("publisher: no broker URL given")
	}
	// The longest wait is also how late tasks may go out after the broker
	// is back (an outage of seconds reaches it): keep it short, since a
	// refused connect costs the broker next to nothing.
	const minBackoff, maxBackoff = 50 * time.Millisecond, 2 * time.Second
	backoff := minBackoff
	// Each distinct failure is logged once per outage, not once per try,
	// even when failures alternate (a TLS refusal may read as an alert or
	// as a reset, depending on timing).
	logged := map[string]bool{}
	var lastLostLog time.Time
	connectedBefore := false
	next, failedInARow := 0, 0
	lastNode := ""
	for {
		n := p.nodes[next%len(p.nodes)]
		next++
		s, err := p.connect(ctx, n)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			p.opt.Metrics.connectError()
			if msg := n.addr + err.Error(); !logged[msg] && len(logged) < 32 {
				what := "broker connect failed; retrying"
				if len(p.nodes) > 1 {
					what = "broker connect failed; trying the next node"
				}
				p.log.Warn(what, "node", n.addr, "err", err)
				logged[msg] = true
			}
			if failedInARow++; failedInARow%len(p.nodes) != 0 {
				continue // the next node, at once
			}
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		}
		failedInARow = 0
		attrs := []any{"node", n.addr}
		if lastNode != "" && lastNode != n.addr {
			attrs = append(attrs, "previous_node", lastNode)
			p.opt.Metrics.switched()
		}
		switch {
		case !connectedBefore && len(logged) == 0:
			p.log.Info("broker connected", attrs...)
		case len(logged) > 0 || time.Since(lastLostLog) < 10*time.Second:
			p.log.Info("broker connected again", attrs...)
		}
		connectedBefore = true
		lastNode = n.addr
		clear(logged)
		p.opt.Metrics.connected(true, n.addr)
		p.set(s, n.addr)
		select {
		case <-s.done:
		case <-ctx.Done():
		}
		p.set(nil, "")
		p.opt.Metrics.connected(false, n.addr)
		s.close()
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(lastLostLog) > 10*time.Second {
			p.log.Warn("broker connection lost; reconnecting", "node", n.addr, "err", s.dead)
			lastLostLog = time.Now()
		}
		// A session that dies soon after it started (e.g. the broker
		// refuses every publish on it) must not turn into a reconnect storm.
		if time.Since(s.started) < 2*time.Second {
			if !sleep(ctx, backoff) {
				return nil
			}
			backoff = min(backoff*2, maxBackoff)
		} else {
			backoff = minBackoff
		}
	}
}

func (p *Publisher) set(s *session, node string) {
	p.mu.Lock()
	p.cur, p.curNode = s, node
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *Publisher) session() (*session, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur, p.changed
}

// State is the broker connection at one moment.
type State struct {
	Node      string // host:port of the node in use; "" when not connected
	Connected bool
	Blocked   bool // connection.blocked: a memory or disk alarm
}

// State returns the connection's state, read at once, so that a report
// never says "connected" and names no node.
func (p *Publisher) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return State{Node: p.curNode, Connected: p.cur != nil, Blocked: p.cur != nil && p.cur.blocked.Load()}
}

// Nodes are the nodes (host:port) in the order they are tried.
func (p *Publisher) Nodes() []string {
	out := make([]string, len(p.nodes))
	for i, n := range p.nodes {
		out[i] = n.addr
	}
	return out
}

// Ready reports whether a connection is up and the broker is not blocking
// it (connection.blocked, a memory or disk alarm).
func (p *Publisher) Ready() bool {
	st := p.State()
	return st.Connected && !st.Blocked
}

// Blocked reports whether the broker blocks the connection
// (connection.blocked: a memory or disk alarm).
func (p *Publisher) Blocked() bool { return p.State().Blocked }

// blockChanged tells the operator why dispatching stalls: a blocked
// connection is up, yet nothing can be published on it.
func (p *Publisher) blockChanged(b amqp.Blocking) {
	p.opt.Metrics.blocked(b.Active)
	if b.Active {
		p.log.Warn("broker blocks publishing (memory or disk alarm); claiming paused until it unblocks", "reason", b.Reason)
	} else {
		p.log.Info("broker unblocked publishing; claiming resumes")
	}
}

// WaitReady blocks until Ready or ctx ends.
func (p *Publisher) WaitReady(ctx context.Context) error {
	for {
		s, changed := p.session()
		if s != nil && !s.blocked.Load() {
			return nil
		}
		poll := time.NewTimer(time.Hour)
		if s != nil { // blocked: look again shortly
			poll.Reset(50 * time.Millisecond)
		}
		select {
		case <-changed:
		case <-poll.C:
		case <-ctx.Done():
			poll.Stop()
			return ctx.Err()
		}
		poll.Stop()
	}
}

func (p *Publisher) connect(ctx context.Context, n node) (*session, error) {
	// A write stuck longer than a confirm may take ends the connection,
	// and stopping aborts the set-up (see dialer).
	dial, dialDone := dialer(ctx, 10*time.Second, p.opt.ConfirmTimeout)
	defer dialDone()
	cfg := amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: amqp.Table{"connection_name": p.opt.ConnectionName},
		Dial:       dial,
	}
	if p.opt.TLS != nil {
		// Cloned per dial: the amqp library sets ServerName on it.
		cfg.TLSClientConfig = p.opt.TLS.Clone()
	}
	conn, err := amqp.DialConfig(n.url, cfg)
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
	s.onBlocked = p.blockChanged
	s.start()
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
// or until ctx ends. A message times out when the confirm timeout has
// passed both since it was written and since the broker last answered on
// the channel (see confirmDeadline). errs[i] is nil only when the broker
// confirmed msgs[i] and did not return it.
func (p *Publisher) Publish(ctx context.Context, msgs []Message) []error {
	return p.PublishGated(ctx, msgs, nil)
}

// PublishGated is Publish, asking still(i) before msgs[i] is written
// whenever it had to wait for room among the unconfirmed publishes (up to
// the confirm timeout): what the caller checked before calling may no
// longer hold. If still returns an error, msgs[i] and the rest are not
// written and fail with it. still may be nil.
func (p *Publisher) PublishGated(ctx context.Context, msgs []Message, still func(i int) error) []error {
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
	var unsent error // once no slot frees up, the rest is not tried
	for i, m := range msgs {
		if unsent == nil {
			var waited bool
			waited, unsent = s.acquire(ctx, p.opt.ConfirmTimeout)
			if unsent == nil && waited && still != nil {
				if err := still(i); err != nil {
					s.release()
					unsent = err
				}
			}
		}
		if unsent != nil {
			ws[i] = newWaiter()
			ws[i].resolve(unsent)
			continue
		}
		ws[i] = s.publish(ctx, m.Exchange, m.RoutingKey, publishing(m, now))
	}
	// Collect what is settled; give up on each at its timeout, on all at a stop.
	timeout := time.NewTimer(p.opt.ConfirmTimeout)
	defer timeout.Stop()
	stopped, failed := false, false
	for i, w := range ws {
	wait:
		for !stopped {
			d := time.Until(s.confirmDeadline(w, p.opt.ConfirmTimeout))
			if d <= 0 {
				break
			}
			timeout.Reset(d)
			select {
			case <-w.done:
				break wait
			case <-timeout.C: // an answer meanwhile may have moved the deadline
			case <-ctx.Done():
				stopped = true
			}
		}
		select {
		case <-w.done:
			errs[i] = w.err
			failed = failed || w.err == ErrNacked
		default:
			errs[i] = ErrTimeout
			if stopped {
				errs[i] = ErrStopped
			} else {
				failed = true // its confirm deadline passed: no answer for the timeout
			}
			s.forget(w)
		}
	}
	// A channel that confirmed nothing for a whole confirm timeout while
	// it had publishes to confirm (an idle spell does not count: see
	// unconfirmedFor), its publishes timing out or nacked, is given up
	// unless the broker said it blocks us (an alarm): a connection can
	// look alive (heartbeats flow) while its channel never confirms again. The cluster tests
	// found one: a channel opened on a surviving node while a quorum
	// queue elected a new leader kept talking to the old, dead one; its
	// publishes were nacked, or never answered, for minutes. A new
	// connection finds the new leader. (A slot not freed within the
	// timeout is no such sign: answers may still be coming, only slowly.)
	for _, err := range errs {
		if err == nil {
			p.opt.Metrics.batch()
			break
		}
	}
	if failed && !s.blocked.Load() && s.unconfirmedFor() >= p.opt.ConfirmTimeout {
		s.giveUp(&LostError{Reason: fmt.Sprintf("the channel confirmed nothing for %s (publishes nacked or unanswered): replacing the connection", p.opt.ConfirmTimeout)})
	}
	return errs
}

func publishing(m Message, now time.Time) amqp.Publishing {
	h := make(amqp.Table, len(m.Headers)+3)
	for k, v := range m.Headers {
		h[k] = v
	}
	h["x-due-ms"] = m.DueMs
	if m.PublishedUs != 0 {
		h["x-published-us"] = m.PublishedUs
	}
	if m.TaskID != "" {
		h["x-task-id"] = m.TaskID
	}
	return amqp.Publishing{
		DeliveryMode:    amqp.Persistent,
		MessageId:       m.MessageID,
		Timestamp:       now,
		Headers:         h,
		Body:            m.Body,
		ContentType:     m.ContentType,
		ContentEncoding: m.ContentEncoding,
		CorrelationId:   m.CorrelationID,
		ReplyTo:         m.ReplyTo,
		Type:            m.Type,
		Priority:        m.Priority,
		Expiration:      m.Expiration,
	}
}

// PublishAlone publishes one message on a channel of its own and waits for
// the outcome. A message the broker refuses closes only that channel, so
// the refusal is surely this message's and no other publish suffers.
// Opening the channel and writing the message may take the confirm
// timeout, and the confirm the confirm timeout after that. With the
// channel open, right before the message is written, it asks still (which
// may be nil): what the caller checked before calling may no longer hold
// after that wait. If still returns an error, the message is not written
// and fails with it.
func (p *Publisher) PublishAlone(ctx context.Context, m Message, still func() error) error {
	s, _ := p.session()
	if s == nil {
		return ErrNotConnected
	}
	r, err := s.publishAlone(ctx, p.opt.ConfirmTimeout, m.Exchange, m.RoutingKey, publishing(m, time.Now()), still)
	if r != nil {
		// Nobody waits for the close-ok. A session that is over closes
		// its connection, and the channel with it.
		defer s.spawn(func() { r.ch.Close() })
	}
	if err != nil {
		return err
	}
	timeout := time.NewTimer(p.opt.ConfirmTimeout)
	defer timeout.Stop()
	select {
	case c, ok := <-r.confirms:
		if !ok {
			return channelError(s.conn, <-r.closed)
		}
		if !c.Ack {
			return ErrNacked
		}
		// A return is sent before the ack and buffered, so it is here now.
		select {
		case ret := <-r.returns:
			return &ReturnedError{Code: ret.ReplyCode, Reason: ret.ReplyText}
		default:
			p.opt.Metrics.batch()
			return nil
		}
	case e := <-r.closed:
		return channelError(s.conn, e)
	case <-timeout.C:
		return ErrTimeout
	case <-ctx.Done():
		return ErrStopped
	}
}

func channelError(conn *amqp.Connection, e *amqp.Error) error {
	if e == nil || conn.IsClosed() {
		return &LostError{Reason: "channel closed"}
	}
	return &LostError{Code: e.Code, Reason: e.Reason, Refused: e.Code == amqp.PreconditionFailed}
}

func sleep(ctx context.Context, d time.Duration) bool { return wait.For(ctx, d) }
