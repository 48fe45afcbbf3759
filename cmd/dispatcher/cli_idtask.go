package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dispatcher/dispatcher/config"
	"github.com/dispatcher/dispatcher/shard"
)

// idHelp says what --id does, for schedule, cancel and reschedule.
const idHelp = `With --id, the task has an id (1 to 1024 bytes) of its own: the id
is what is pending, the body and the message properties are kept beside
it, and cancel, reschedule and show take the id. Scheduling a pending id
again replaces its body, properties and due time.`

// propFlags are schedule's message properties of a task with an id.
type propFlags struct {
	headers                                 []string
	routingKey, deadline, contentType, corr string
	expiration                              string
	priority                                int
}

func (f *propFlags) add(fs *pflag.FlagSet) {
	fs.StringArrayVar(&f.headers, "header", nil, "with --id: a message header `K=V` (repeatable): V true/false is a boolean, an integer an integer, anything else a string")
	fs.StringVar(&f.routingKey, "routing-key", "", "with --id: publish with this routing `KEY` instead of the queue's")
	fs.StringVar(&f.deadline, "deadline", "", "with --id: not published by this `TIME` ("+timeHelp+"): dead-lettered instead")
	fs.IntVar(&f.priority, "priority", 0, "with --id: the message's AMQP priority `N`, 0 to 255")
	fs.StringVar(&f.contentType, "content-type", "", "with --id: the message's content `TYPE`")
	fs.StringVar(&f.corr, "correlation-id", "", "with --id: the message's correlation `ID`")
	fs.StringVar(&f.expiration, "expiration", "", "with --id: the message's TTL in the broker, a `DURATION` (90s, 10m)")
}

// given names the first property flag given, or "".
func (f *propFlags) given(cmd *cobra.Command) string {
	for _, n := range []string{"header", "routing-key", "deadline", "priority", "content-type", "correlation-id", "expiration"} {
		if cmd.Flags().Changed(n) {
			return n
		}
	}
	return ""
}

// props reads the flags as properties, checked as the dispatcher checks
// them (nil: none given).
func (f *propFlags) props(cmd *cobra.Command, now time.Time) (*shard.Properties, error) {
	if f.given(cmd) == "" {
		return nil, nil
	}
	p := &shard.Properties{RoutingKey: f.routingKey, ContentType: f.contentType, CorrelationID: f.corr}
	if len(f.headers) > 0 {
		p.Headers = map[string]any{}
		if err := addHeaders(p.Headers, f.headers); err != nil {
			return nil, err
		}
	}
	if cmd.Flags().Changed("priority") {
		if f.priority < 0 || f.priority > 255 {
			return nil, usageErrorf("--priority %d: want 0 to 255", f.priority)
		}
		p.Priority = &f.priority
	}
	if f.deadline != "" {
		ms, err := parseTime("deadline", f.deadline, now)
		if err != nil {
			return nil, err
		}
		p.DeadlineMs = &ms
	}
	if f.expiration != "" {
		d, err := time.ParseDuration(f.expiration)
		if err != nil || d < 0 {
			return nil, usageErrorf("--expiration %q: want a duration of 0 or more (Go syntax such as 90s, 10m, 2h)", f.expiration)
		}
		ms := d.Milliseconds()
		p.ExpirationMs = &ms
	}
	if err := p.Validate(); err != nil {
		return nil, usageErrorf("%v", err)
	}
	return p, nil
}

// headerValue reads a --header value: true/false a boolean, an integer
// an integer, anything else a string.
// addHeaders adds --header flags, NAME=VALUE each, to h (see
// headerValue); a name given twice, or already in h, is refused.
func addHeaders(h map[string]any, flags []string) error {
	for _, kv := range flags {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return usageErrorf("--header %q: want NAME=VALUE", kv)
		}
		if _, dup := h[k]; dup {
			return usageErrorf("--header %q: header %q given twice", kv, k)
		}
		h[k] = headerValue(v)
	}
	return nil
}

func headerValue(v string) any {
	switch v {
	case "true":
		return true
	case "false":
		return false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return n
	}
	return v
}

// checkID is --id's value checked as the contract has it.
func checkID(id string) error {
	if err := shard.ValidID([]byte(id)); err != nil {
		return usageErrorf("--id: %v", err)
	}
	return nil
}

// idTask is what cancel and reschedule by id work with.
type idTask struct {
	se  *session
	q   config.Queue
	ctx context.Context
	p   *shard.Producer
}

// openIDTask opens queue Q for a command on a task by id (checked
// first); done closes the session.
func openIDTask(cmd *cobra.Command, s streams, asJSON bool, queue, id string) (*idTask, func(), error) {
	if err := checkID(id); err != nil {
		return nil, nil, err
	}
	se, q, ctx, done, err := openQueue(cmd, s, asJSON, queue, 10*time.Second)
	if err != nil {
		return nil, nil, err
	}
	p, err := shard.NewProducer(se.rdb, se.cfg.KeyPrefix, q.Name, q.Shards)
	if err != nil {
		done()
		return nil, nil, failure(err)
	}
	return &idTask{se: se, q: q, ctx: ctx, p: p}, done, nil
}

// notPendingID is the error of cancel and reschedule of an id that is
// not pending.
func notPendingID(q config.Queue, id string) error {
	return failure(fmt.Errorf("id %.80q is not pending on %s (never scheduled, cancelled, or already claimed: `dispatcher show` tells which): nothing changed", id, q.Name))
}
