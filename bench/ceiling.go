package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/shard"
)

// Ceiling is the raw broker's pace: confirmed publishes of messages like
// the dispatcher's (same size and properties, persistent, mandatory) to a
// queue of the same type, with the same consumer consuming meanwhile. It
// is the fastest of the runs with the windows tried.
//
// Tasks with ids carry an x-task-id header, and the bench's properties a
// traceparent: the broker's work per message grows with its headers, so
// the ceiling of such tasks is measured with those headers too, not
// against plain messages the dispatcher never publishes for them.
type Ceiling struct {
	Size      int     `json:"size"`
	IDs       bool    `json:"ids,omitempty"`   // with the x-task-id header of -ids
	Props     bool    `json:"props,omitempty"` // with the traceparent header of -props
	QueueType string  `json:"queue_type"`
	Window    int     `json:"window"`
	PerSec    float64 `json:"per_sec"`
	// Latency is consumer receipt minus publish time of the fastest run.
	Latency Dist          `json:"latency"`
	Tried   []*CeilingRun `json:"tried"`
}

// CeilingRun is one raw publishing run.
type CeilingRun struct {
	Window   int `json:"window"`
	Messages int `json:"messages"`
	// PerSec is received messages per second at the consumer, first to
	// last receipt: measured like the dispatcher's figure.
	PerSec float64 `json:"per_sec"`
	// ConfirmedPerSec is confirms per second at the publisher, first
	// publish to last confirm.
	ConfirmedPerSec float64 `json:"confirmed_per_sec"`
	Nacked          int64   `json:"nacked"`
	Returned        int64   `json:"returned"`
	Missing         int     `json:"missing"`
	Duplicates      int64   `json:"duplicates"`
	// BadHeaders counts deliveries whose message_id or, with ids,
	// x-task-id (and traceparent) were not their message's.
	BadHeaders int64 `json:"bad_headers,omitempty"`
	Latency    Dist  `json:"latency"`
}

// measureCeiling runs the raw publisher once per window and keeps the
// fastest.
func (r *runner) measureCeiling(ctx context.Context, k ceilingKey) (*Ceiling, error) {
	c := &Ceiling{Size: k.size, IDs: k.ids, Props: k.props, QueueType: r.opt.QueueType}
	for _, w := range r.opt.CeilingWindows {
		run, err := r.rawPublish(ctx, k, w)
		if err != nil {
			return nil, err
		}
		c.Tried = append(c.Tried, run)
		if run.PerSec > c.PerSec {
			c.PerSec, c.Window, c.Latency = run.PerSec, w, run.Latency
		}
	}
	return c, nil
}

// form is the point form whose messages the ceiling's are like.
func (c *Ceiling) form() Point { return Point{IDs: c.IDs, Props: c.Props} }

// ceilingKey is what a ceiling's messages are like: their size, and the
// headers of tasks with ids (and properties).
type ceilingKey struct {
	size       int
	ids, props bool
}

// rawPublish publishes count messages like k on one confirm-mode channel,
// keeping up to window unconfirmed: pipelined publishing is the fastest a
// single publisher gets confirmed publishes.
func (r *runner) rawPublish(ctx context.Context, k ceilingKey, window int) (*CeilingRun, error) {
	size := k.size
	count := r.opt.CeilingCount
	name := r.name("ceiling")
	rec := newRecorder(count, 1, r.earlyUs)
	if k.ids {
		rec.expectIDs(k.props)
	}
	sk, err := openSink(r.opt, name, nil, rec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := sk.close(); err != nil {
			r.warnf("ceiling: clean up: %v", err)
		}
	}()

	conn, err := amqp.DialConfig(r.opt.firstAMQP(), amqp.Config{
		Properties: amqp.Table{"connection_name": "dispatcher bench raw publisher"},
		Dial:       amqp.DefaultDial(10 * time.Second),
	})
	if err != nil {
		return nil, fmt.Errorf("ceiling: dial broker: %w", redact.Error(err))
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("ceiling: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("ceiling: confirm mode: %w", err)
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, window+1))
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	slots := make(chan struct{}, window)
	var acked, nacked, returned atomic.Int64
	var lastConfirm atomic.Int64
	confirmDone := make(chan struct{})
	go func() {
		defer close(confirmDone)
		for c := range confirms {
			if !c.Ack {
				nacked.Add(1)
			}
			lastConfirm.Store(time.Now().UnixNano())
			acked.Add(1)
			<-slots
		}
	}()
	go func() {
		for range returns {
			returned.Add(1)
		}
	}()

	stopProg := r.prog.start(func() string {
		return fmt.Sprintf("ceiling size=%d%s window=%d: %s/%s confirmed, %s received", size, Point{IDs: k.ids, Props: k.props}.formText(), window,
			thousands(int(acked.Load())), thousands(count), thousands(int(rec.unique.Load())))
	})
	defer stopProg()

	body := make([]byte, 0, size)
	var id, props []byte
	begin := time.Now()
	for i := 0; i < count; i++ {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		body = member(body, i, size)
		now := time.Now()
		due := now.UnixMilli()
		// The same headers as the dispatcher's messages.
		headers := amqp.Table{"x-due-ms": due, "x-dispatcher-seq": int64(i + 1)}
		mid := body
		if k.ids {
			id = taskID(id, i)
			headers["x-task-id"] = string(id)
			mid = id
		}
		if k.props {
			props = taskProps(props, i)
			headers["traceparent"] = string(props[len(`{"headers":{"traceparent":"`) : len(props)-len(`"}}`)])
		}
		err := ch.PublishWithContext(ctx, name, routingKey, true, false, amqp.Publishing{
			DeliveryMode: amqp.Persistent,
			MessageId:    shard.MessageID(mid, due),
			Timestamp:    now,
			Headers:      headers,
			Body:         body,
		})
		if err != nil {
			return nil, fmt.Errorf("ceiling: publish: %w", err)
		}
	}
	activity := func() int64 { return acked.Load() + received(rec)() }
	if err := r.waitFor(ctx, func() bool { return acked.Load() == int64(count) }, activity); err != nil {
		return nil, fmt.Errorf("ceiling: waiting for confirms: %w", err)
	}
	confirmedIn := time.Duration(lastConfirm.Load() - begin.UnixNano())
	if err := r.waitFor(ctx, func() bool { return rec.missing() == 0 }, activity); err != nil {
		r.warnf("ceiling: %v; %d messages did not arrive", err, rec.missing())
	}
	stopProg()
	sk.stop()
	if err := sk.ackError(); err != nil {
		r.warnf("ceiling size=%d window=%d: %v", size, window, err)
	}
	c := &CeilingRun{
		Window: window, Messages: count,
		PerSec:          perSec(int(rec.unique.Load()), rec.span()),
		ConfirmedPerSec: perSec(count, confirmedIn),
		Nacked:          nacked.Load(), Returned: returned.Load(),
		Missing: rec.missing(), Duplicates: rec.dups.Load(), BadHeaders: rec.badID.Load() + rec.badTaskID.Load(),
		Latency: distOf(rec.late),
	}
	return c, nil
}

// perSec is n events over d, counting the intervals between them.
func perSec(n int, d time.Duration) float64 {
	if n < 2 || d <= 0 {
		return 0
	}
	return float64(n-1) / d.Seconds()
}
