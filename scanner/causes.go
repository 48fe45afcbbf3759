package scanner

import (
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dispatcher/dispatcher/publisher"
)

// causes remembers why this instance's publishes of one queue failed
// lately, by kind, so that the log, /readyz and the stall report name the
// cause (no queue bound for the routing key, a nack, a refusal) instead of
// a count that looks like noise. A retried task is retried for as long as
// its cause lasts, so the cause is what an operator has to fix.
type causes struct {
	exchange, routingKey string
	log                  *slog.Logger
	logEvery             time.Duration // one log line per kind per this
	// window: a kind not seen for this long is over. A retried task is
	// tried again at least every RETRY_MAX, so a cause that lasts shows
	// up at least that often.
	window time.Duration

	mu     sync.Mutex
	byKind map[string]*cause
}

type cause struct {
	text        string // the latest one's
	first, last time.Time
	total       int // failed publishes since first
	unlogged    int // failed publishes since the last log line
	loggedAt    time.Time
}

func newCauses(exchange, routingKey string, log *slog.Logger, window time.Duration) *causes {
	return &causes{exchange: exchange, routingKey: routingKey, log: log, logEvery: 10 * time.Second,
		window: window, byKind: map[string]*cause{}}
}

// queueWide kinds come from the broker's view of the exchange or the
// channel, not of one message: a confirmed publish after them means they
// are over. A refusal is of one message (too large) and stays until it
// stops recurring.
var queueWide = map[string]bool{"returned": true, "nack": true, "timeout": true, "channel": true}

// published notes the outcome of one publish: how many were confirmed and
// the failures that are retried (or dead-lettered after MAX_ATTEMPTS). It
// logs each kind at most once per logEvery, naming the exchange, the
// routing key, the cause and how many publishes failed since the last line.
func (c *causes) published(now time.Time, confirmed int, failed []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if confirmed > 0 {
		for _, kind := range sortedKinds(c.byKind) {
			if k := c.byKind[kind]; queueWide[kind] {
				c.log.Info("publishes confirmed again", "exchange", c.exchange, "routing_key", c.routingKey,
					"after", k.text, "failed_publishes", k.total, "failing_for", now.Sub(k.first).Round(time.Second))
				delete(c.byKind, kind)
			}
		}
	}
	for _, err := range failed {
		kind := publisher.Kind(err)
		k := c.byKind[kind]
		if k == nil {
			k = &cause{first: now}
			c.byKind[kind] = k
		}
		k.text, k.last = c.describe(kind, err), now
		k.total++
		k.unlogged++
	}
	for _, kind := range sortedKinds(c.byKind) {
		k := c.byKind[kind]
		if k.unlogged == 0 || (!k.loggedAt.IsZero() && now.Sub(k.loggedAt) < c.logEvery) {
			continue
		}
		c.log.Warn("publish failed; tasks kept for retry", "exchange", c.exchange, "routing_key", c.routingKey,
			"cause", k.text, "kind", kind, "tasks", k.unlogged, "failing_for", now.Sub(k.first).Round(time.Second))
		k.unlogged, k.loggedAt = 0, now
	}
}

// active describes the causes seen within the window, one line each:
// `unroutable: exchange "x" has no queue bound for routing key "y" (12
// failed publishes over 1m3s, the latest 2s ago)`.
func (c *causes) active(now time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, kind := range sortedKinds(c.byKind) {
		k := c.byKind[kind]
		if now.Sub(k.last) > c.window {
			delete(c.byKind, kind)
			continue
		}
		out = append(out, fmt.Sprintf("%s (%d failed publishes over %s, the latest %s ago)", k.text, k.total,
			k.last.Sub(k.first).Round(time.Second), now.Sub(k.last).Round(time.Second)))
	}
	return out
}

// describe names the cause of a failed publish in the operator's terms.
func (c *causes) describe(kind string, err error) string {
	where := fmt.Sprintf("exchange %s, routing key %s", exchangeName(c.exchange), strconv.Quote(c.routingKey))
	var re *publisher.ReturnedError
	var le *publisher.LostError
	switch {
	case errors.As(err, &re):
		return fmt.Sprintf("unroutable: exchange %s has no queue bound for routing key %s (%d %s)",
			exchangeName(c.exchange), strconv.Quote(c.routingKey), re.Code, re.Reason)
	case kind == "nack":
		return "nacked by the broker (" + where + ")"
	case kind == "refused" && errors.As(err, &le):
		if strings.Contains(le.Reason, "size") {
			return fmt.Sprintf("refused as too large: %d %s (%s)", le.Code, le.Reason, where)
		}
		return fmt.Sprintf("refused by the broker: %d %s (%s)", le.Code, le.Reason, where)
	case kind == "timeout":
		return "no confirm within DISPATCHER_CONFIRM_TIMEOUT (" + where + ")"
	}
	return err.Error() + " (" + where + ")"
}

func exchangeName(x string) string {
	if x == "" {
		return `"" (the default exchange)`
	}
	return strconv.Quote(x)
}

func sortedKinds(m map[string]*cause) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
