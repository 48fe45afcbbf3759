package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/internal/redact"
	"github.com/dispatcher/dispatcher/shard"
)

// newTailCmd is `dispatcher tail`: a peek at a queue's tasks as they
// arrive at the broker, for trying things out and debugging. It binds a
// temporary queue of its own next to the consumers' queues, so it takes
// nothing from them.
func newTailCmd(s streams) *cobra.Command {
	var queue, exchange, routingKey string
	var count int
	var timeout time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "tail --queue Q --exchange X [--count N] [--timeout D]",
		Short: "print queue Q's tasks as they arrive at the broker",
		Long: `Binds a temporary, exclusive queue to exchange X with Q's routing key and
prints every task that arrives there: its message_id, due time (x-due-ms),
how late it came, its task id (x-task-id) if it has one, the message
properties it set (headers, content_type and the like), and its body. The
consumers' own queues lose nothing. A task whose properties give another
routing_key arrives only if --routing-key is that key.

The exchange and routing key default to DISPATCHER_QUEUE_<NAME>_EXCHANGE and
_ROUTING_KEY if set, the routing key otherwise to the queue name. The broker
is DISPATCHER_AMQP_URL (default amqp://guest:guest@localhost:5672/).

Only tasks published after tail has bound its queue reach it. A task
published when no queue at all is bound is unroutable: the dispatcher
retries it with backoff (DISPATCHER_RETRY_MIN, doubling), so it arrives at
its next retry after tail started.

Exit status: 0 done (--count tasks seen, or --timeout without --count),
1 broker failed or --timeout before --count tasks, 2 bad arguments or
settings.`,
		Example: `  dispatcher tail --queue default --exchange tasks
  dispatcher tail --queue default --exchange tasks --count 1 --timeout 1m`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unexpected argument %q", args[0])
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if queue == "" {
				return usageErrorf("--queue is required")
			}
			cfg, err := config.LoadTool(queue)
			if err != nil {
				return settingsError(err)
			}
			q, _ := cfg.Queue(queue)
			if !cmd.Flags().Changed("exchange") {
				exchange = q.Exchange
			}
			if !cmd.Flags().Changed("routing-key") {
				routingKey = q.RoutingKey
				if routingKey == "" {
					routingKey = queue
				}
			}
			if exchange == "" {
				return usageErrorf("--exchange: give the exchange queue %s's tasks are published to (its DISPATCHER_QUEUE_%s_EXCHANGE; the default exchange cannot be bound)",
					queue, config.EnvName(queue))
			}
			if count < 0 {
				return usageErrorf("--count %d: want 0 (no limit) or more", count)
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			return tail(ctx, s, cfg, tailOptions{exchange: exchange, routingKey: routingKey, count: count, json: asJSON, timeout: timeout})
		},
	}
	fs := cmd.Flags()
	queueFlag(fs, &queue)
	fs.StringVar(&exchange, "exchange", "", "the exchange `X` the queue's tasks are published to")
	fs.StringVar(&routingKey, "routing-key", "", "their routing `KEY` (default: the queue name)")
	fs.IntVar(&count, "count", 0, "stop after `N` tasks (0: no limit)")
	fs.DurationVar(&timeout, "timeout", 0, "stop after this `DURATION`, failing if --count is not met")
	jsonFlag(fs, &asJSON)
	return cmd
}

type tailOptions struct {
	exchange, routingKey string
	count                int
	json                 bool
	timeout              time.Duration
}

// tail binds a temporary queue and prints what arrives on it.
func tail(ctx context.Context, s streams, cfg *config.Settings, o tailOptions) error {
	conn, err := dialBroker(cfg, "dispatcher tail")
	if err != nil {
		return failure(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return failure(fmt.Errorf("open a channel: %w", err))
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return failure(fmt.Errorf("declare a temporary queue: %w", err))
	}
	if err := ch.QueueBind(q.Name, o.routingKey, o.exchange, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return failure(fmt.Errorf("exchange %q does not exist: the dispatcher declares it when it starts serving the queue (or check --exchange)", o.exchange))
		}
		return failure(fmt.Errorf("bind to exchange %q: %w", o.exchange, err))
	}
	deliveries, err := ch.Consume(q.Name, "dispatcher-tail", true, true, false, false, nil)
	if err != nil {
		return failure(fmt.Errorf("consume: %w", err))
	}
	fmt.Fprintf(s.stderr, "dispatcher tail: bound a temporary queue to exchange %q with routing key %q; waiting for tasks\n", o.exchange, o.routingKey)
	seen := 0
	for {
		select {
		case <-ctx.Done():
			if o.count > 0 {
				return failure(fmt.Errorf("%d of %d tasks arrived in %s", seen, o.count, o.timeout))
			}
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return failure(errors.New("the broker closed the channel"))
			}
			printDelivery(s.stdout, d, o.json)
			if seen++; o.count > 0 && seen >= o.count {
				return nil
			}
		}
	}
}

// printDelivery writes one task as it arrived: a line, or a JSON object
// on one line. A task scheduled with an id shows it (its x-task-id
// header); the message properties a task set show as the JSON object of
// its stored properties has them.
func printDelivery(w io.Writer, d amqp.Delivery, asJSON bool) {
	now := time.Now()
	due, _ := headerInt(d.Headers["x-due-ms"])
	late := now.Sub(time.UnixMilli(due))
	id, _ := d.Headers["x-task-id"].(string)
	props := deliveryProps(d)
	if asJSON {
		m := map[string]any{
			"message_id": d.MessageId, "due_ms": due, "received_ms": now.UnixMilli(), "late_ms": late.Milliseconds(),
			"exchange": d.Exchange, "routing_key": d.RoutingKey, "redelivered": d.Redelivered, "body": string(d.Body),
		}
		if id != "" {
			m["id"] = id
		}
		if len(props) > 0 {
			m["properties"] = props
		}
		b, _ := json.Marshal(m)
		fmt.Fprintf(w, "%s\n", b)
		return
	}
	extra := ""
	if id != "" {
		extra += fmt.Sprintf(" id=%q", id)
	}
	if len(props) > 0 {
		b, _ := json.Marshal(props)
		extra += " properties=" + string(b)
	}
	fmt.Fprintf(w, "%s message_id=%s x-due-ms=%d late=%s%s body=%q\n",
		now.UTC().Format("15:04:05.000"), d.MessageId, due, late.Round(time.Millisecond), extra, d.Body)
}

// deliveryProps are the message properties of a delivery a task can set,
// by their names in a task's properties (CONTRACT.md): the AMQP basic
// properties that are set, and the headers but the dispatcher's own.
// The routing key is shown on its own.
func deliveryProps(d amqp.Delivery) map[string]any {
	p := map[string]any{}
	for k, v := range map[string]string{"content_type": d.ContentType, "content_encoding": d.ContentEncoding,
		"correlation_id": d.CorrelationId, "reply_to": d.ReplyTo, "type": d.Type} {
		if v != "" {
			p[k] = v
		}
	}
	if d.Priority != 0 {
		p["priority"] = d.Priority
	}
	if n, err := strconv.ParseInt(d.Expiration, 10, 64); err == nil {
		p["expiration_ms"] = n
	}
	h := map[string]any{}
	for k, v := range d.Headers {
		if l := strings.ToLower(k); l == "x-published-us" || shard.ReservedHeader(l) {
			continue
		}
		h[k] = v
	}
	if len(h) > 0 {
		p["headers"] = h
	}
	return p
}

// headerInt reads an integer header, as AMQP tables carry it.
func headerInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int32:
		return int64(n), true
	case int:
		return int64(n), true
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		return i, err == nil
	}
	return 0, false
}

// dialBroker connects to the first node of DISPATCHER_AMQP_URL that
// answers, under the connection name given (shown in the management UI).
func dialBroker(cfg *config.Settings, name string) (*amqp.Connection, error) {
	var tlsConf *tls.Config
	if f := cfg.AMQPTLSFiles(); !f.Empty() {
		c, err := f.Config()
		if err != nil {
			return nil, fmt.Errorf("AMQP TLS: %w", err)
		}
		tlsConf = c
	}
	var errs []string
	for _, u := range cfg.AMQPURLs() {
		c := amqp.Config{Dial: amqp.DefaultDial(10 * time.Second), Properties: amqp.Table{"connection_name": name}}
		if strings.HasPrefix(strings.ToLower(u), "amqps://") {
			c.TLSClientConfig = tlsConf
		}
		conn, err := amqp.DialConfig(u, c)
		if err == nil {
			return conn, nil
		}
		errs = append(errs, fmt.Sprintf("%s: %v", redact.URL(u), redact.Error(err)))
	}
	return nil, errors.New(strings.Join(errs, "; "))
}
