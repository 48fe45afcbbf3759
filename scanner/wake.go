package scanner

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// Instances, producers and Redis's keyspace events tell each other of
// news on the queue's wake channel. Messages come on a goroutine of their
// own and may be lost (they only save waiting for a poll), so they are
// kept here as notes the loop takes in on its next turn, apart from the
// loop's own state.

// wakeups is this instance's end of the queue's wake channel: what it
// hears, and the backlogs it tells of.
type wakeups struct {
	rdb     redis.UniversalClient
	keys    shard.Keys
	shards  int           // Options.Shards
	poll    time.Duration // Options.PollInterval
	cluster bool          // Redis Cluster: no keyspace events
	log     *slog.Logger
	lim     *logLimiter
	// onLayout is told of a "layout" message (Options.OnLayout).
	onLayout func()
	// hub, if set, is the instance's shared subscription (Options.WakeHub).
	hub *WakeHub

	ch    chan struct{} // wakes the loop
	notes notes

	busySent atomic.Bool // an announceBusy is on its way
	lastBusy time.Time   // last time this instance told the others of a backlog: owned by Run's goroutine
}

func newWakeups(rdb redis.UniversalClient, keys shard.Keys, shards int, poll time.Duration, cluster bool, log *slog.Logger, lim *logLimiter) *wakeups {
	return &wakeups{rdb: rdb, keys: keys, shards: shards, poll: poll, cluster: cluster, log: log, lim: lim, ch: make(chan struct{}, 1)}
}

// kick wakes the loop, unless a wake-up is waiting for it already.
func (w *wakeups) kick() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// announceBusy tells every instance that this one found a backlog, so they
// all claim (spread by the balancer) until it is gone. At most once per
// poll interval: helpers that ran dry go back to idle in between. It is
// sent on its own goroutine: the channel's primary may be the slow one.
func (w *wakeups) announceBusy(ctx context.Context) {
	if time.Since(w.lastBusy) < w.poll || !w.busySent.CompareAndSwap(false, true) {
		return
	}
	w.lastBusy = time.Now()
	go func() {
		defer w.busySent.Store(false)
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := w.rdb.Publish(pctx, w.keys.Wake(), shard.WakeBusy).Err(); err != nil && ctx.Err() == nil {
			w.lim.Warn("announce", "cannot tell other instances of the backlog", "err", err)
		}
	}()
}

// notes are wake-ups received since the loop last looked.
type notes struct {
	mu   sync.Mutex
	busy bool          // some instance found a backlog
	lead bool          // the sweeper role is free
	soon map[int]int64 // shard -> earliest due time a producer or keyspace event told of
}

func (n *notes) take() (busy, lead bool, soon map[int]int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	busy, lead, soon = n.busy, n.lead, n.soon
	n.busy, n.lead, n.soon = false, false, nil
	return
}

func (n *notes) due(i int, ms int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.soon == nil {
		n.soon = map[int]int64{}
	}
	if at, ok := n.soon[i]; !ok || ms < at {
		n.soon[i] = ms
	}
}

// listen receives wake-ups until ctx ends: the queue's wake channel (Go
// producers, other instances) and, where the server publishes keyspace
// events for sorted sets, every ZADD to a pending shard, so a task that
// any producer adds for now goes out without waiting for the next poll.
// Losing messages (e.g. while reconnecting) only falls back to polling.
// Over the instance's WakeHub it returns once subscribed, with the
// unsubscribe to call after ctx ends (nil if none): the hub's goroutine
// hands the messages over, and a goroutine per queue that only waited
// for its end was a fifth of an idle instance's.
func (w *wakeups) listen(ctx context.Context) (unsubscribe func()) {
	if w.hub != nil {
		return w.listenOn(ctx, w.hub)
	}
	ps := w.rdb.Subscribe(ctx, w.keys.Wake())
	defer ps.Close()
	// A refusal (an ACL without the channel: Redis 7 users get none by
	// default) is said once; the subscription is then given up, rather
	// than retried many times a second. A connection error is not a
	// refusal: Channel reconnects by itself.
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); isReply(err) {
		w.log.Warn("cannot subscribe to the wake channel; polling only, and other instances will not help drain a backlog (grant the channel in the ACL)",
			"channel", w.keys.Wake(), "err", err)
		return nil
	}
	if pattern := w.keyspacePattern(ctx); pattern != "" {
		if err := ps.PSubscribe(ctx, pattern); err != nil {
			w.log.Warn("cannot subscribe to keyspace events; polling only", "err", err)
		} else if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); isReply(err) {
			w.log.Warn("cannot subscribe to keyspace events; polling only", "pattern", pattern, "err", err)
			_ = ps.PUnsubscribe(ctx, pattern)
		} else {
			w.log.Info("Redis publishes sorted-set keyspace events: newly scheduled tasks wake this instance at once")
		}
	}
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-ch:
			if !ok {
				return nil
			}
			w.heard(m)
		}
	}
}

// listenOn is listen over the instance's shared subscription. A refusal
// is logged for this queue whenever Redis gives it (also after a
// reconnect), and the channel dropped.
func (w *wakeups) listenOn(ctx context.Context, hub *WakeHub) (unsubscribe func()) {
	ch := w.keys.Wake()
	err := hub.subscribe(ctx, ch, false, w.heard, func(err error) {
		w.log.Warn("cannot subscribe to the wake channel; polling only, and other instances will not help drain a backlog (grant the channel in the ACL)",
			"channel", ch, "err", err)
	})
	if err != nil {
		return nil // refused (logged), closed, or ctx ended
	}
	pattern := w.keyspacePattern(ctx)
	if pattern != "" {
		err := hub.subscribe(ctx, pattern, true, w.heard, func(err error) {
			w.log.Warn("cannot subscribe to keyspace events; polling only", "pattern", pattern, "err", err)
		})
		if err == nil {
			w.log.Info("Redis publishes sorted-set keyspace events: newly scheduled tasks wake this instance at once")
		} else {
			pattern = ""
		}
	}
	return func() {
		if pattern != "" {
			hub.unsubscribe(pattern, true)
		}
		hub.unsubscribe(ch, false)
	}
}

// heard takes in one message. Over a WakeHub it runs on the hub's
// goroutine, for every queue's messages: it must not wait.
func (w *wakeups) heard(m *redis.Message) {
	if m.Pattern != "" {
		// Keyspace event: channel __keyspace@<db>__:<pending key>, payload
		// the command. Only additions can bring a task due earlier.
		if m.Payload != "zadd" && m.Payload != "zincr" {
			return
		}
		i, ok := w.shardOfKey(m.Channel[strings.Index(m.Channel, "__:")+3:])
		if !ok {
			return
		}
		w.notes.due(i, 0) // look at the shard now
		w.kick()
		return
	}
	switch m.Payload {
	case shard.WakeBusy:
		w.notes.mu.Lock()
		w.notes.busy = true
		w.notes.mu.Unlock()
	case shard.WakeLead:
		w.notes.mu.Lock()
		w.notes.lead = true
		w.notes.mu.Unlock()
	case shard.WakeLayout:
		if w.onLayout != nil {
			w.onLayout()
		}
		return
	default:
		i, ms, ok := shard.ParseWakeDue(m.Payload)
		if !ok || i >= w.shards {
			return
		}
		w.notes.due(i, ms)
	}
	w.kick()
}

// shardOfKey returns i if key is the pending key of shard i of this queue.
func (w *wakeups) shardOfKey(key string) (int, bool) {
	head := w.keys.Prefix + ":{" + w.keys.Queue + ":"
	rest, ok := strings.CutPrefix(key, head)
	if !ok || !strings.HasSuffix(rest, "}") {
		return 0, false
	}
	i, err := strconv.Atoi(strings.TrimSuffix(rest, "}"))
	if err != nil || i < 0 || i >= w.shards {
		return 0, false
	}
	return i, true
}

// keyspacePattern returns the pattern of the queue's pending keys' keyspace
// events if the server publishes them for sorted sets ('K' with 'z' or 'A'
// in notify-keyspace-events). The dispatcher never turns them on itself:
// that is the operator's call (they cost Redis some CPU for every write).
//
// On Redis Cluster they are not used: a node publishes keyspace events only
// to its own subscribers, so one subscription would hear only the shards
// of one primary. Producers' wake-ups (plain PUBLISH, which the cluster
// passes to every node) and polling serve a cluster.
func (w *wakeups) keyspacePattern(ctx context.Context) string {
	if w.cluster {
		return ""
	}
	cfg, err := w.rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return "" // e.g. an ACL user without CONFIG: polling only
	}
	flags := cfg["notify-keyspace-events"]
	if !strings.Contains(flags, "K") || !strings.ContainsAny(flags, "zA") {
		return ""
	}
	db := 0
	if c, ok := w.rdb.(*redis.Client); ok {
		db = c.Options().DB
	}
	return "__keyspace@" + strconv.Itoa(db) + "__:" + redisconn.GlobEscape(w.keys.Prefix+":{"+w.keys.Queue+":") + "*}"
}
