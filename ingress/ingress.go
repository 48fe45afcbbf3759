// Package ingress takes messages published to an AMQP exchange with the
// delayed-message plugin's x-delay header and writes each one into the
// queue's Redis shards as a task with an id, so that producers that only
// speak AMQP need no change but the exchange's name
// (docs/migrating-from-delayed-plugin.md).
package ingress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/amqptable"
	"github.com/dispatcher/dispatcher/shard"
)

// Queue types of the ingress queue.
const (
	QuorumQueue  = "quorum"
	ClassicQueue = "classic"
)

// Options configure one queue's ingress.
type Options struct {
	Queue    string // the dispatcher's queue NAME
	Exchange string // E, the exchange producers publish to
	// Prefetch bounds the deliveries held unacked, and so the batch written
	// to Redis in one round trip.
	Prefetch  int
	QueueType string        // QuorumQueue or ClassicQueue
	MaxDelay  time.Duration // a due time further than this from the base is refused
	// MaxBodyBytes refuses larger bodies (0: no limit).
	MaxBodyBytes int
	// OnDeadLetters, if set, is told how many refused messages a batch
	// stored as dead letters (dispatcher_tasks_dead_lettered_total).
	OnDeadLetters func(n int)
	Dial          func() (*amqp.Connection, error)
	Logger        *slog.Logger
	Metrics       *Metrics
	// ReadEvery is how often the ingress queue's depth is read (0: 5s).
	ReadEvery time.Duration
	Now       func() time.Time // the clock of the status (nil: time.Now)
}

// QueueName is the durable queue the ingress of queue NAME consumes.
func QueueName(queue string) string { return "dispatcher.ingress." + queue }

// Ingress consumes one queue's ingress queue.
type Ingress struct {
	opt  Options
	rdb  redis.UniversalClient
	prod *shard.Producer
	log  *slog.Logger
	obs  *observer
	// clock: the last Redis clock reading; only the consuming goroutine
	// uses it.
	clock redisClock
}

// New makes the ingress of one queue; rdb and prod are the queue's Redis
// and producer.
func New(rdb redis.UniversalClient, prod *shard.Producer, opt Options) *Ingress {
	if opt.Prefetch <= 0 {
		opt.Prefetch = 256
	}
	if opt.QueueType == "" {
		opt.QueueType = QuorumQueue
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.ReadEvery <= 0 {
		opt.ReadEvery = 5 * time.Second
	}
	g := &Ingress{opt: opt, rdb: rdb, prod: prod, log: opt.Logger.With("queue", opt.Queue, "ingress_exchange", opt.Exchange), obs: newObserver(opt.Queue, opt.Now)}
	opt.Metrics.watch(g)
	return g
}

// ErrSetup is a declaration the broker refused: retrying does not help.
var ErrSetup = errors.New("ingress setup refused")

// Declare declares E (durable topic if missing), the ingress queue and
// the binding `#`. A refusal by the broker (E of another type, the queue
// declared with other arguments) is an ErrSetup naming the thing.
func (g *Ingress) Declare(ch *amqp.Channel) error {
	if err := ch.ExchangeDeclare(g.opt.Exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("%w: declaring ingress exchange %q as a durable topic exchange (an exchange of another type, such as x-delayed-message, cannot be bound with #: delete it or set another DISPATCHER_QUEUE_%s_INGRESS_EXCHANGE): %v",
			ErrSetup, g.opt.Exchange, envName(g.opt.Queue), err)
	}
	args := amqp.Table{}
	if g.opt.QueueType == QuorumQueue {
		args["x-queue-type"] = QuorumQueue
	}
	q := QueueName(g.opt.Queue)
	if _, err := ch.QueueDeclare(q, true, false, false, false, args); err != nil {
		return fmt.Errorf("%w: declaring ingress queue %q (type %s; DISPATCHER_QUEUE_%s_INGRESS_QUEUE_TYPE must match an existing queue's type, and a broker without quorum queues needs classic): %v",
			ErrSetup, q, g.opt.QueueType, envName(g.opt.Queue), err)
	}
	if err := ch.QueueBind(q, "#", g.opt.Exchange, false, nil); err != nil {
		return fmt.Errorf("%w: binding ingress queue %q to %q with #: %v", ErrSetup, q, g.opt.Exchange, err)
	}
	return nil
}

func envName(queue string) string {
	b := []byte(strings.ToUpper(queue))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// Setup connects once and declares; a broker that cannot be reached is no
// error (Run keeps trying), a refused declaration is.
func (g *Ingress) Setup() error {
	conn, err := g.opt.Dial()
	if err != nil {
		g.log.Warn("ingress: broker not reachable at start; retrying", "err", err)
		return nil
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil
	}
	return g.Declare(ch)
}

// Run consumes until ctx ends, reconnecting after a lost connection.
func (g *Ingress) Run(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := g.session(ctx)
		g.obs.stopped(err)
		if ctx.Err() != nil {
			return
		}
		g.log.Warn("ingress: consuming stopped; reconnecting", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func (g *Ingress) session(ctx context.Context) error {
	conn, err := g.opt.Dial()
	if err != nil {
		return fmt.Errorf("connecting: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("opening a channel: %w", err)
	}
	if err := g.Declare(ch); err != nil {
		return err
	}
	if err := ch.Qos(g.opt.Prefetch, 0, false); err != nil {
		return fmt.Errorf("setting prefetch %d: %w", g.opt.Prefetch, err)
	}
	ds, err := ch.Consume(QueueName(g.opt.Queue), "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("consuming %q: %w", QueueName(g.opt.Queue), err)
	}
	g.log.Info("ingress: consuming", "ingress_queue", QueueName(g.opt.Queue), "prefetch", g.opt.Prefetch)
	g.obs.consumingNow()
	stop := g.sample(ctx, conn)
	defer func() { _ = conn.Close(); stop() }() // closed first: a read waiting on a dead broker returns
	// amqp091 hands deliveries over one at a time on an unbuffered
	// channel: a receive that does not wait gets at most the one its
	// goroutine is offering at that instant, so batches stayed at one or
	// two while hundreds of deliveries waited (bench -mode ingress). This
	// goroutine moves them into a buffer of the prefetch's size while a
	// batch is written, and the next batch takes all it holds.
	buf := make(chan amqp.Delivery, g.opt.Prefetch)
	quit := make(chan struct{})
	defer close(quit) // before conn.Close (deferred above), which ends ds
	go func() {
		defer close(buf)
		for d := range ds {
			select {
			case buf <- d:
			case <-quit:
				return
			}
		}
	}()
	var batch []amqp.Delivery
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-buf:
			if !ok {
				return errors.New("delivery channel closed")
			}
			batch = append(batch, d)
		}
		// What has arrived meanwhile goes in the same round trip.
	more:
		for len(batch) < g.opt.Prefetch {
			select {
			case d, ok := <-buf:
				if !ok {
					break more
				}
				batch = append(batch, d)
			default:
				break more
			}
		}
		if err := g.handle(ctx, ch, batch); err != nil {
			return err
		}
	}
}

// item is one delivery's outcome.
type item struct {
	d      amqp.Delivery
	task   *shard.IDTask
	cancel []byte // an id to cancel
	reason string // refused: why
	cause  string
	// dead is a refused task's dead letter; nil for a refused cancel,
	// which is rejected to the ingress queue's dead-letter exchange.
	dead *deadLetter
}

// handle writes one batch to Redis and then settles it: refused tasks
// become dead letters of the queue (deadletter.go), and are acked with the
// rest in one multiple ack once Redis has them; what cannot be stored so
// is rejected (to the ingress queue's dead-letter exchange, if any). While
// Redis cannot be reached nothing is acked and, the prefetch window being
// full, consuming pauses.
func (g *Ingress) handle(ctx context.Context, ch *amqp.Channel, batch []amqp.Delivery) error {
	g.obs.take(batch)
	nowMs, err := g.redisNow(ctx)
	for err != nil {
		if ctx.Err() != nil {
			return nil // unacked: the broker gives them to another instance
		}
		g.failed("redis", len(batch))
		g.log.Warn("ingress: Redis unavailable; nothing acked, consuming paused", "err", err)
		sleep(ctx, time.Second)
		nowMs, err = g.redisNow(ctx)
	}
	items := make([]item, len(batch))
	for n, d := range batch {
		items[n] = g.convert(d, nowMs)
	}
	// The cancel marks of every task of the batch are read after its last
	// write, and the Redis clock with them (for the next batch): in that
	// write's round trip on one Redis (ScheduleIDsThen).
	marks := g.markCheck(items)
	// Schedules and cancels in delivery order: a cancel after its task's
	// scheduling in the same batch must win.
	var run []shard.IDTask
	flush := func(then func(redis.Pipeliner)) error {
		for len(run) > 0 {
			err := g.prod.ScheduleIDsThen(ctx, run, then)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			g.failed("redis", len(run))
			g.log.Warn("ingress: writing tasks to Redis failed; nothing acked, retrying", "tasks", len(run), "err", err)
			sleep(ctx, time.Second)
		}
		run = run[:0]
		return nil
	}
	for _, it := range items {
		switch {
		case it.reason != "": // a dead letter, written after the tasks (storeDead)
		case it.task != nil:
			run = append(run, *it.task)
		case it.cancel != nil:
			if err := flush(nil); err != nil {
				return nil
			}
			for {
				// The mark first, then the cancel: a task ingested
				// meanwhile elsewhere either is pending for the cancel or
				// finds the mark after its own write (cancelMarked).
				err := g.rdb.Set(ctx, g.cancelKey(it.cancel), "1", CancelWindow).Err()
				if err == nil {
					_, err = g.prod.CancelID(ctx, it.cancel)
				}
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return nil
				}
				g.log.Warn("ingress: cancel failed; retrying", "id", string(it.cancel), "err", err)
				sleep(ctx, time.Second)
			}
		}
	}
	if err := flush(marks.add); err != nil {
		return nil
	}
	if err := g.cancelMarked(ctx, marks); err != nil {
		return nil
	}
	for {
		err := g.storeDead(ctx, items)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		g.failed("redis", 1)
		g.log.Warn("ingress: writing dead letters to Redis failed; nothing acked, retrying", "err", err)
		sleep(ctx, time.Second)
	}
	// Refusals first, then one ack for all the rest: an ack with multiple
	// settles every earlier tag still outstanding, which are ours.
	var last uint64
	ingested, dead := 0, 0
	for _, it := range items {
		if it.reason != "" {
			g.failed(it.cause, 1)
			if it.dead != nil && it.dead.entry != "" {
				g.log.Error("ingress: message refused, stored as a dead letter (dispatcher dead list)", "reason", it.reason,
					"message_id", it.d.MessageId, "routing_key", it.d.RoutingKey, "shard", it.dead.shard, "entry", it.dead.entry)
				last = it.d.DeliveryTag
				dead++
				continue
			}
			attrs := []any{"reason", it.reason, "message_id", it.d.MessageId, "routing_key", it.d.RoutingKey}
			if it.dead != nil {
				g.failed("unstored", 1)
				attrs = append(attrs, "not_stored", it.dead.err)
			}
			g.log.Error("ingress: message refused, rejected to the ingress queue's dead-letter exchange", attrs...)
			if err := ch.Nack(it.d.DeliveryTag, false, false); err != nil {
				return fmt.Errorf("rejecting: %w", err)
			}
			continue
		}
		last = it.d.DeliveryTag
		if it.task != nil {
			ingested++
		}
	}
	if last != 0 {
		if err := ch.Ack(last, true); err != nil {
			return fmt.Errorf("acking: %w", err)
		}
	}
	g.obs.settled(batch)
	g.ingestedN(ingested)
	if dead > 0 && g.opt.OnDeadLetters != nil {
		g.opt.OnDeadLetters(dead)
	}
	return nil
}

// CancelWindow is how long a cancel over AMQP also cancels a task of its
// id ingested after it (on another instance, from a backlog).
const CancelWindow = 10 * time.Minute

func (g *Ingress) cancelKey(id []byte) string {
	k := g.prod.Keys()
	return k.Prefix + ":{" + k.Queue + "}:ingress-cancelled:" + string(id)
}

// marks is a batch's check of cancel marks, and of the Redis clock.
type marks struct {
	g    *Ingress
	ids  [][]byte
	keys []string
	// sent: add's commands went after the batch's last write; their
	// replies are in get and clock.
	sent        bool
	get         *redis.SliceCmd
	clock       *redis.TimeCmd
	clockSentAt time.Time
}

// markCheck prepares the check of items' tasks.
func (g *Ingress) markCheck(items []item) *marks {
	m := &marks{g: g}
	for _, it := range items {
		if it.task != nil {
			m.ids, m.keys = append(m.ids, it.task.ID), append(m.keys, g.cancelKey(it.task.ID))
		}
	}
	return m
}

// add puts the check into a write's pipeline, after the write.
func (m *marks) add(pipe redis.Pipeliner) {
	m.sent = true
	m.get = nil
	if len(m.keys) > 0 {
		m.get = pipe.MGet(context.Background(), m.keys...)
	}
	m.clockSentAt = time.Now()
	m.clock = pipe.Time(context.Background())
}

// cancelMarked cancels the tasks just written whose id a cancel marked
// within CancelWindow: one MGET (one slot, the {Q} tag) per batch, the
// one sent with the batch's last write when it was, else its own. It
// retries until Redis answers; the batch is not acked before.
func (g *Ingress) cancelMarked(ctx context.Context, m *marks) error {
	if m.sent && m.clock != nil {
		if t, err := m.clock.Result(); err == nil {
			g.clock.set(t, m.clockSentAt)
		}
	}
	if len(m.keys) == 0 {
		return nil
	}
	var vs []any
	var err error
	if m.sent && m.get != nil {
		vs, err = m.get.Result()
	} else {
		vs, err = g.rdb.MGet(ctx, m.keys...).Result()
	}
	for {
		for n := 0; err == nil && n < len(vs); n++ {
			if vs[n] != nil {
				if _, err = g.prod.CancelID(ctx, m.ids[n]); err == nil {
					g.log.Info("ingress: task cancelled by a cancel ingested before it", "id", string(m.ids[n]))
				}
			}
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		g.log.Warn("ingress: checking cancels failed; nothing acked, retrying", "err", err)
		sleep(ctx, time.Second)
		vs, err = g.rdb.MGet(ctx, m.keys...).Result()
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (g *Ingress) redisNow(ctx context.Context) (int64, error) {
	if ms, ok := g.clock.now(); ok {
		return ms, nil
	}
	sent := time.Now()
	t, err := g.rdb.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("reading the Redis clock: %w", err)
	}
	g.clock.set(t, sent)
	return t.UnixMilli(), nil
}

// ClockFresh is how long a reading of the Redis clock serves the ingress:
// later batches take it forward by this process's monotonic clock. Under
// steady traffic each batch's write brings a new one, so no batch waits
// for a TIME round trip of its own; short, so that a step of the Redis
// host's clock (or a failover to a primary whose clock differs) is seen
// within it.
const ClockFresh = 100 * time.Millisecond

// redisClock is the last reading of the Redis clock and when its command
// was sent: the reading is no earlier than that instant on the Redis
// clock, so an estimate taken forward from it errs late by at most that
// command's round trip, never early (clock rates differ by parts per
// million: microseconds over ClockFresh).
type redisClock struct {
	read time.Time // the reading (whole microseconds: no truncation to ms before it is taken forward)
	at   time.Time // when its command was sent, by this process's clock
}

func (c *redisClock) set(t time.Time, sent time.Time) { c.read, c.at = t, sent }

// now is the estimate, if the reading is fresh. The wall clock's age must
// agree with the monotonic one: Go's monotonic clock stops while the host
// is suspended (a paused VM), and an estimate taken forward by it would
// then be early.
func (c *redisClock) now() (int64, bool) {
	if c.at.IsZero() {
		return 0, false
	}
	now := time.Now()
	age := now.Sub(c.at)
	wall := now.Round(0).Sub(c.at.Round(0))
	if age < 0 || age >= ClockFresh || wall-age > time.Millisecond || age-wall > time.Millisecond {
		return 0, false
	}
	return c.read.Add(age).UnixMilli(), true
}

// Headers the ingress reads.
const (
	HeaderDelay    = "x-delay"
	HeaderDueMs    = "x-due-ms"
	HeaderCancel   = "x-dispatcher-cancel"
	HeaderReceived = "timestamp_in_ms"
)

// convert turns one delivery into a task, a cancel or a refusal.
func (g *Ingress) convert(d amqp.Delivery, nowMs int64) item {
	it := item{d: d}
	// A refused cancel is no task: rejected to the DLX.
	refuseCancel := func(format string, a ...any) item {
		it.cause, it.reason = "bad_header", fmt.Sprintf(format, a...)
		return it
	}
	if c, ok := d.Headers[HeaderCancel]; ok {
		if b, ok := c.(bool); !ok || !b {
			return refuseCancel("header %s is %v (%T): want the boolean true", HeaderCancel, c, c)
		}
		if d.MessageId == "" {
			return refuseCancel("header %s without a message_id: nothing names the task to cancel", HeaderCancel)
		}
		it.cancel = []byte(d.MessageId)
		return it
	}
	base := nowMs
	if v, ok := d.Headers[HeaderReceived]; ok {
		if ms, ok := integer(v); ok && ms > 0 {
			base = ms
		}
	}
	// A refused task becomes a dead letter due at its base time.
	refuse := func(cause, format string, a ...any) item {
		it.cause, it.reason = cause, fmt.Sprintf(format, a...)
		var notes []string
		it.dead, notes = deadLetterOf(d, base)
		if len(notes) > 0 {
			it.reason += " (stored with the " + strings.Join(notes, ", ") + ")"
		}
		return it
	}
	if g.opt.MaxBodyBytes > 0 && len(d.Body) > g.opt.MaxBodyBytes {
		return refuse("too_large", "body is %d bytes, over DISPATCHER_MAX_MESSAGE_BYTES=%d", len(d.Body), g.opt.MaxBodyBytes)
	}
	due, asked := base, ""
	if v, ok := d.Headers[HeaderDueMs]; ok {
		ms, ok := integer(v)
		if !ok {
			return refuse("bad_header", "header %s is %v (%T): not an integer", HeaderDueMs, v, v)
		}
		if ms > base {
			due = ms
		}
		asked = fmt.Sprintf("header %s is %d", HeaderDueMs, ms)
	} else if v, ok := d.Headers[HeaderDelay]; ok {
		ms, ok := integer(v)
		if !ok {
			return refuse("bad_header", "header %s is %v (%T): not an integer", HeaderDelay, v, v)
		}
		if ms > 0 {
			due = base + ms
		}
		asked = fmt.Sprintf("header %s is %d", HeaderDelay, ms)
	}
	if g.opt.MaxDelay > 0 && due-base > g.opt.MaxDelay.Milliseconds() {
		return refuse("too_late", "%s: due time %d is %d ms after %d, beyond DISPATCHER_QUEUE_%s_INGRESS_MAX_DELAY=%s",
			asked, due, due-base, base, envName(g.opt.Queue), g.opt.MaxDelay)
	}
	props, err := properties(d)
	if err != nil {
		return refuse("bad_header", "%v", err)
	}
	id := []byte(d.MessageId)
	if len(id) == 0 {
		// No id to keep a redelivery to one task: a fresh one, so a
		// message redelivered after a crash before its ack may become a
		// second task (documented).
		id = newID()
	}
	if err := shard.ValidID(id); err != nil {
		return refuse("bad_header", "message_id: %v", err)
	}
	it.task = &shard.IDTask{ID: id, Body: d.Body, Props: props, Due: time.UnixMilli(due)}
	return it
}

// integer reads an AMQP integer of any width, as the plugin reads x-delay.
func integer(v any) (int64, bool) {
	switch v := v.(type) {
	case int8:
		return int64(v), true
	case int16:
		return int64(v), true
	case int32:
		return int64(v), true
	case int64:
		return v, true
	case int:
		return int64(v), true
	case uint8:
		return int64(v), true
	case uint16:
		return int64(v), true
	case uint32:
		return int64(v), true
	case uint64:
		if v > math.MaxInt64 {
			return 0, false
		}
		return int64(v), true
	}
	return 0, false
}

// properties are the delivery's properties as the task stores them.
func properties(d amqp.Delivery) (*shard.Properties, error) {
	p := &shard.Properties{
		RoutingKey: d.RoutingKey, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding,
		CorrelationID: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type,
	}
	// An empty routing key is stored as none: the queue's own key is used.
	if d.Priority != 0 {
		pr := int(d.Priority)
		p.Priority = &pr
	}
	if d.Expiration != "" {
		ms, err := strconv.ParseInt(d.Expiration, 10, 64)
		if err != nil || ms < 0 {
			return nil, fmt.Errorf("expiration %q: not a whole number of ms", d.Expiration)
		}
		p.ExpirationMs = &ms
	}
	// Headers keep their AMQP types in amqp_headers (CONTRACT.md), all but
	// the dispatcher's own: x-due-ms is set again at the due time.
	h := amqp.Table{}
	for k, v := range d.Headers {
		// A quorum ingress queue adds x-delivery-count to a message it
		// delivers again (an instance killed before its ack): the
		// ingress queue's, not the producer's.
		if d.Redelivered && k == "x-delivery-count" {
			continue
		}
		if !shard.ReservedHeader(k) {
			h[k] = v
		}
	}
	if len(h) > 0 {
		b, err := amqptable.Encode(h)
		if err != nil {
			return nil, err
		}
		p.AMQPHeaders = b
	}
	p.MessageID = d.MessageId
	// Marshal checks what ScheduleIDs will: a task it would refuse must be
	// refused here, alone, not fail its whole batch again and again.
	if _, err := p.Marshal(); err != nil {
		if why := largestHeader(d); why != "" && strings.Contains(err.Error(), "bytes, over") {
			return nil, fmt.Errorf("%w: %s", err, why)
		}
		return nil, err
	}
	return p, nil
}

// Metrics count what the ingress does.
type Metrics struct {
	in     *prometheus.CounterVec
	errs   *prometheus.CounterVec
	gauges *gauges
}

// NewMetrics registers the ingress metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		in: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatcher_ingress_ingested_total",
			Help: "Messages taken from a queue's ingress queue and written to Redis as tasks."}, []string{"queue"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dispatcher_ingress_errors_total",
			Help: "Ingress messages refused (bad_header, too_large, too_late: stored as dead letters of the queue, or else rejected to the ingress queue's dead-letter exchange, counted once more as unstored) or Redis failures while ingesting (redis), by cause."}, []string{"queue", "cause"}),
		gauges: newGauges(),
	}
	reg.MustRegister(m.in, m.errs, m.gauges)
	return m
}

func (m *Metrics) ingested(queue string, n int) {
	if m != nil && n > 0 {
		m.in.WithLabelValues(queue).Add(float64(n))
	}
}

func (m *Metrics) errors(queue, cause string, n int) {
	if m != nil && n > 0 {
		m.errs.WithLabelValues(queue, cause).Add(float64(n))
	}
}
