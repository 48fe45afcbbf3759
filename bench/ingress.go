package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/ingress"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/shard"
)

// Ingress mode: producers that speak only AMQP publish with x-delay to
// the ingress exchange of a queue the instances serve, as they published
// to the delayed-message plugin (docs/migrating-from-delayed-plugin.md);
// the instances write each message into the queue's shards as a task with
// an id and publish it at its due time to the queue's exchange, where the
// bench's consumer gets it. Each message crosses the broker twice.

const (
	// followPerSec is about how many messages a second the poll follows
	// into Redis: one in sampleEvery(rate).
	followPerSec = 500
	// pollEvery is how often the poll looks for the messages it follows.
	pollEvery = time.Millisecond
	// ingressSetting is a setting only a dispatcher with the ingress knows.
	ingressSetting = "_INGRESS_EXCHANGE"
)

// IngressResult is an ingress point's own figures.
type IngressResult struct {
	// Max: published as fast as the broker confirmed, Window unconfirmed
	// at most (the largest -ceiling-window: with the ingress's and the
	// dispatch's traffic on the broker, confirms take longer than in the
	// ceiling's runs, and a small window held the publisher back); else
	// paced at the point's rate. Drain: all of them before
	// the instances started, so that the ingest is the drain of a backlog
	// in the ingress queue.
	Max       bool   `json:"max"`
	Drain     bool   `json:"drain,omitempty"`
	Window    int    `json:"window"`
	DelayMs   int64  `json:"delay_ms"`   // every message's x-delay
	Exchange  string `json:"exchange"`   // the ingress exchange
	QueueType string `json:"queue_type"` // of the ingress queue
	Prefetch  int    `json:"prefetch"`   // each instance's INGRESS_PREFETCH

	Published int   `json:"published"`
	Nacked    int64 `json:"nacked"`
	Returned  int64 `json:"returned"`
	// PublishPerSec is the publisher's confirms per second, first publish
	// to last confirm.
	PublishPerSec float64 `json:"publish_per_sec"`

	// IngestPerSec is tasks written to Redis per second over
	// IngestSeconds, from the first task's ingest to the last one's; a
	// task's ingest time is the Redis clock reading its instance took
	// before writing its batch: x-due-ms minus x-delay at the consumer.
	// 0 when the broker stamped timestamp_in_ms (BrokerStamped), which
	// the ingress then takes as the base instead.
	IngestSeconds float64 `json:"ingest_seconds"`
	IngestPerSec  float64 `json:"ingest_per_sec"`
	BrokerStamped int64   `json:"broker_stamped,omitempty"`

	// ToRedis is publish to the task seen in Redis, of every
	// SampleEvery-th message (paced points): the poll looks for each with
	// ZSCORE on its pending set every 1 ms; the time the poll that found
	// it was sent. Unseen counts messages followed that it never found
	// (claimed, or the run ended, first); PollErrors failed polls.
	ToRedis      *Dist `json:"to_redis"`
	SampleEvery  int   `json:"sample_every,omitempty"`
	Unseen       int   `json:"unseen,omitempty"`
	PollCommands int64 `json:"poll_commands,omitempty"`
	PollErrors   int64 `json:"poll_errors,omitempty"`
	// ToIngest is publish to the ingest time above, of every message
	// (Redis clock; the ingest time truncated to the ms): short of
	// ToRedis by the write's round trip.
	ToIngest *Dist `json:"to_ingest"`
}

// ingressQueueType is the ingress queue's type for the bench's -queue-type:
// the ingress queue is durable, so transient means classic.
func ingressQueueType(queueType string) string {
	if queueType == queueQuorum {
		return ingress.QuorumQueue
	}
	return ingress.ClassicQueue
}

// sampleEvery is k, the poll following one message in k: about
// followPerSec a second.
func sampleEvery(rate int) int {
	return max(1, (rate+followPerSec-1)/followPerSec)
}

// pacedAt is when message i of a paced point is published, from the
// start: rate a second, evenly.
func pacedAt(i, rate int) time.Duration {
	return time.Duration(int64(i) * int64(time.Second) / int64(rate))
}

// ingestFigures works out, from each task's publish time (pubUs, local
// clock, µs) and due time at the consumer (dueMs, Redis clock, 0 for one
// that did not arrive), each published with x-delay delayMs: publish to
// ingest of each task that arrived (µs, on Redis's clock: offsetUs is
// Redis's clock minus ours), and the first and last ingest times (ms).
func ingestFigures(pubUs, dueMs []int64, delayMs, offsetUs int64) (toIngest []int32, firstMs, lastMs int64) {
	firstMs, lastMs = math.MaxInt64, math.MinInt64
	for i, due := range dueMs {
		if due == 0 || i >= len(pubUs) || pubUs[i] == 0 {
			continue
		}
		base := due - delayMs
		firstMs, lastMs = min(firstMs, base), max(lastMs, base)
		toIngest = append(toIngest, clamp32(base*1000-(pubUs[i]+offsetUs), math.MinInt32))
	}
	if len(toIngest) == 0 {
		return nil, 0, 0
	}
	return toIngest, firstMs, lastMs
}

// runIngress: K ready dispatchers serving a queue with an ingress; a
// publisher publishes to its exchange with x-delay, paced at the point's
// rate for -duration, or (rate 0) -ingress-max messages as fast as the
// broker confirms them; the consumer gets them from the queue's exchange
// at their due time.
func (r *runner) runIngress(ctx context.Context, p Point) (*Result, error) {
	if !knowsSetting(ctx, r.opt.Dispatcher, ingressSetting) {
		return nil, fmt.Errorf("%s does not list DISPATCHER_QUEUE_<NAME>%s in its --help: it has no AMQP ingress to measure", r.opt.Dispatcher, ingressSetting)
	}
	c, err := r.ceiling(ctx, Point{Size: p.Size})
	if err != nil {
		return nil, err
	}
	total := p.Backlog
	if p.Rate > 0 {
		total = int(int64(p.Rate) * time.Duration(r.opt.Duration).Milliseconds() / 1000)
	}
	m, err := r.newMeasurement(p, total)
	if err != nil {
		return nil, err
	}
	defer m.close()
	g := m.ingress
	res := m.res
	ir := &IngressResult{Max: p.Rate == 0, Drain: p.Drain, Window: slices.Max(r.opt.CeilingWindows), DelayMs: m.rec.delayMs, Exchange: g.exchange,
		QueueType: g.queueType, Prefetch: g.prefetch}
	res.Ingress = ir
	pub := &ingressPublisher{r: r, exchange: g.exchange, key: m.queues[0], size: p.Size, delayMs: ir.DelayMs,
		rate: p.Rate, total: total, window: ir.Window}
	var poll *redisPoller
	var before redisSnap
	var cpu0 []float64
	var began time.Time
	if p.Drain {
		// The backlog first, in the ingress queue declared as the
		// instances declare it; the instances' CPU counts from their start.
		if err := declareIngress(m.sink.conn, m.queues[0], g); err != nil {
			return res, err
		}
		stop := r.prog.start(func() string {
			return fmt.Sprintf("%s: %s/%s published, %s confirmed", p, thousands(int(pub.published.Load())), thousands(total), thousands(int(pub.acked.Load())))
		})
		err := pub.run(ctx)
		stop()
		if err != nil {
			return res, err
		}
		if before, err = readCmdStats(ctx, r.rdb); err != nil {
			return res, err
		}
		began = time.Now()
		if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
			return res, err
		}
		if err := m.wait(ctx, nil); err != nil {
			return res, err
		}
	} else {
		if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
			return res, err
		}
		if err := m.fleet.waitReady(ctx); err != nil {
			return res, err
		}
		if !sleepCtx(ctx, warmUp) {
			return res, ctx.Err()
		}
		if cpu0, err = m.startUsage(); err != nil {
			return res, err
		}
		if before, err = readCmdStats(ctx, r.rdb); err != nil {
			return res, err
		}
		pollDone := make(chan struct{})
		stopPoll := make(chan struct{})
		if p.Rate > 0 {
			ir.SampleEvery = sampleEvery(p.Rate)
			poll = newRedisPoller(r.rdb, m.keys, p.Shards, ir.SampleEvery)
			pub.poll = poll
			go func() { defer close(pollDone); poll.run(ctx, stopPoll) }()
		} else {
			close(pollDone)
		}
		began = time.Now()
		done := make(chan error, 1)
		waitCtx, stopWaiting := context.WithCancel(ctx)
		defer stopWaiting()
		go func() {
			err := pub.run(ctx)
			if err != nil {
				stopWaiting() // what was not published will not come
			}
			done <- err
		}()
		waitErr := m.wait(waitCtx, func() string {
			return fmt.Sprintf(", %s published, %s confirmed", thousands(int(pub.published.Load())), thousands(int(pub.acked.Load())))
		})
		pubErr := <-done
		close(stopPoll)
		<-pollDone
		if pubErr != nil {
			return res, pubErr
		}
		if waitErr != nil {
			return res, waitErr
		}
	}
	var own []cmdStats
	if poll != nil {
		own = poll.commands()
	}
	if err := m.finish(ctx, before, own, cpu0, began); err != nil {
		return res, err
	}

	ir.Published, ir.Nacked, ir.Returned = total, pub.nacked.Load(), pub.returned.Load()
	ir.PublishPerSec = perSec(total, time.Duration(pub.lastConfirmNs.Load()-pub.firstNs))
	ir.BrokerStamped = m.rec.brokerStamped.Load()
	toIngest, firstMs, lastMs := ingestFigures(pub.pubUs, m.rec.dueByIndex, ir.DelayMs, r.rep.ClockOffsetUs)
	if ir.BrokerStamped == 0 && len(toIngest) > 0 {
		ir.IngestSeconds = float64(lastMs-firstMs) / 1000
		ir.IngestPerSec = perSec(len(toIngest), time.Duration(lastMs-firstMs)*time.Millisecond)
		ir.ToIngest = distOrNil(toIngest, false)
	}
	if poll != nil {
		ir.ToRedis = distOrNil(poll.samples, false)
		ir.Unseen, ir.PollErrors = poll.unseen, poll.errors
		for _, n := range poll.cmds {
			ir.PollCommands += n
		}
	}
	res.Ceiling = c.PerSec
	if c.PerSec > 0 {
		res.Ratio = ir.IngestPerSec / c.PerSec
	}
	if ir.Nacked > 0 || ir.Returned > 0 {
		res.Errors = append(res.Errors, fmt.Sprintf("publisher: %d nacked, %d returned by the broker", ir.Nacked, ir.Returned))
	}
	return res, nil
}

// ingressPublisher publishes a point's messages to the ingress exchange
// as a plugin user would: on a connection of its own, one confirm-mode
// channel, persistent, mandatory, message_id t<index>, header x-delay (an
// int32 in ms, as the Java client sends an Integer), the body the usual
// member of the point's size.
type ingressPublisher struct {
	r                *runner
	exchange, key    string
	size             int
	delayMs          int64
	rate, total      int // rate 0: as fast as confirms allow
	window           int // unconfirmed at most
	poll             *redisPoller
	published, acked atomic.Int64
	nacked, returned atomic.Int64
	firstNs          int64
	lastConfirmNs    atomic.Int64
	pubUs            []int64 // each message's publish time, local clock
}

func (p *ingressPublisher) run(ctx context.Context) error {
	p.pubUs = make([]int64, p.total)
	conn, err := amqp.DialConfig(p.r.opt.firstAMQP(), amqp.Config{
		Properties: amqp.Table{"connection_name": "dispatcher bench ingress publisher"},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return fmt.Errorf("ingress publisher: dial broker: %w", redact.Error(err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("ingress publisher: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("ingress publisher: confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, p.window+1))
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	slots := make(chan struct{}, p.window)
	go func() {
		for c := range confirms {
			if !c.Ack {
				p.nacked.Add(1)
			}
			p.lastConfirmNs.Store(time.Now().UnixNano())
			p.acked.Add(1)
			<-slots
		}
	}()
	go func() {
		for range returns {
			p.returned.Add(1)
		}
	}()

	delay := amqp.Table{"x-delay": int32(p.delayMs)}
	body := make([]byte, 0, p.size)
	var idBuf []byte
	begin := time.Now()
	p.firstNs = begin.UnixNano()
	for i := 0; i < p.total; i++ {
		if p.rate > 0 {
			if wait := time.Until(begin.Add(pacedAt(i, p.rate))); wait > 0 && !sleepCtx(ctx, wait) {
				return ctx.Err()
			}
		}
		select {
		case slots <- struct{}{}:
		case err := <-closed:
			return fmt.Errorf("ingress publisher: channel closed: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		}
		body = member(body, i, p.size)
		idBuf = taskID(idBuf, i)
		now := time.Now()
		err := ch.PublishWithContext(ctx, p.exchange, p.key, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    string(idBuf),
			Headers:      delay,
			Body:         body,
		})
		if err != nil {
			return fmt.Errorf("ingress publisher: publish: %w", err)
		}
		p.pubUs[i] = now.UnixMicro()
		p.published.Store(int64(i + 1))
		if p.poll != nil {
			p.poll.follow(i, now.UnixNano())
		}
	}
	err = p.r.waitFor(ctx, func() bool { return p.acked.Load() == int64(p.total) }, func() int64 { return p.acked.Load() })
	if err != nil {
		return fmt.Errorf("ingress publisher: waiting for confirms: %w", err)
	}
	return nil
}

// redisPoller follows one published message in every into Redis: every
// pollEvery it asks for the pending score of each followed message not
// seen yet (ZSCORE, pipelined), and takes the time from its publish to
// the poll that found it.
type redisPoller struct {
	rdb    redis.UniversalClient
	keys   shard.Keys
	shards int
	every  int

	mu    sync.Mutex
	fresh []followed // published, not yet polled for

	// The poll goroutine's own, read once it has stopped.
	samples []int32 // µs
	unseen  int
	errors  int64
	cmds    []int64 // ZSCOREs sent, by shard
}

type followed struct {
	id    string
	shard int
	pubNs int64
}

func newRedisPoller(rdb redis.UniversalClient, keys shard.Keys, shards, every int) *redisPoller {
	return &redisPoller{rdb: rdb, keys: keys, shards: shards, every: every, cmds: make([]int64, shards)}
}

// follow is called with each message published: one in every is followed.
func (p *redisPoller) follow(i int, pubNs int64) {
	if i%p.every != 0 {
		return
	}
	id := "t" + strconv.Itoa(i)
	f := followed{id: id, shard: shard.Index([]byte(id), p.shards), pubNs: pubNs}
	p.mu.Lock()
	p.fresh = append(p.fresh, f)
	p.mu.Unlock()
}

// run polls until stop is closed; what it follows and has not found then
// is unseen.
func (p *redisPoller) run(ctx context.Context, stop <-chan struct{}) {
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	var out []followed
	var cmds []*redis.FloatCmd
	for {
		select {
		case <-stop:
			p.mu.Lock()
			p.unseen = len(out) + len(p.fresh)
			p.mu.Unlock()
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p.mu.Lock()
		out = append(out, p.fresh...)
		p.fresh = p.fresh[:0]
		p.mu.Unlock()
		if len(out) == 0 {
			continue
		}
		pipe := p.rdb.Pipeline()
		cmds = cmds[:0]
		for _, f := range out {
			cmds = append(cmds, pipe.ZScore(ctx, p.keys.Pending(f.shard), f.id))
			p.cmds[f.shard]++
		}
		sent := time.Now().UnixNano()
		_, _ = pipe.Exec(ctx)
		kept := out[:0]
		failed := false
		for n, c := range cmds {
			switch err := c.Err(); {
			case err == nil:
				p.samples = append(p.samples, clamp32((sent-out[n].pubNs)/1000, math.MinInt32))
			case errors.Is(err, redis.Nil):
				kept = append(kept, out[n])
			default:
				failed = true
				kept = append(kept, out[n])
			}
		}
		if failed {
			p.errors++
		}
		out = kept
	}
}

// commands are the ZSCOREs sent to each shard, as the bench's own
// commands to take out of Redis's counts.
func (p *redisPoller) commands() []cmdStats {
	out := make([]cmdStats, len(p.cmds))
	for s, n := range p.cmds {
		out[s] = cmdStats{"zscore": n}
	}
	return out
}

// declareIngress declares queue NAME's ingress exchange and queue as its
// instances will (ingress.Declare).
func declareIngress(conn *amqp.Connection, queue string, g *ingressSpec) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("declare the ingress: %w", err)
	}
	defer ch.Close()
	return ingress.New(nil, nil, ingress.Options{Queue: queue, Exchange: g.exchange, QueueType: g.queueType}).Declare(ch)
}

// deleteIngress deletes queue NAME's ingress queue and exchange, once the
// instances that declared them are gone.
func deleteIngress(conn *amqp.Connection, queue, exchange string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	_, errQ := ch.QueueDelete(ingress.QueueName(queue), false, false, false)
	errX := ch.ExchangeDelete(exchange, false, false)
	return errors.Join(errQ, errX)
}

// ingressText is an ingress point's progress line.
func ingressText(res *Result) string {
	ir := res.Ingress
	if ir == nil {
		return ""
	}
	return fmt.Sprintf("  => ingest %s/s (%.2f of the ceiling %s/s), published %s/s; publish to Redis p50/p99/max %s ms (1 in %d), to ingest %s ms",
		thousands(int(ir.IngestPerSec)), res.Ratio, thousands(int(res.Ceiling)), thousands(int(ir.PublishPerSec)),
		latShort(ir.ToRedis), max(ir.SampleEvery, 1), latShort(ir.ToIngest))
}
