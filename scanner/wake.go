package scanner

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

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
func (s *Scanner) listen(ctx context.Context) {
	ps := s.rdb.Subscribe(ctx, s.keys.Wake())
	defer ps.Close()
	// A refusal (an ACL without the channel: Redis 7 users get none by
	// default) is said once; the subscription is then given up, rather
	// than retried many times a second. A connection error is not a
	// refusal: Channel reconnects by itself.
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); isReply(err) {
		s.log.Warn("cannot subscribe to the wake channel; polling only, and other instances will not help drain a backlog (grant the channel in the ACL)",
			"channel", s.keys.Wake(), "err", err)
		return
	}
	if pattern := s.keyspacePattern(ctx); pattern != "" {
		if err := ps.PSubscribe(ctx, pattern); err != nil {
			s.log.Warn("cannot subscribe to keyspace events; polling only", "err", err)
		} else if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); isReply(err) {
			s.log.Warn("cannot subscribe to keyspace events; polling only", "pattern", pattern, "err", err)
			_ = ps.PUnsubscribe(ctx, pattern)
		} else {
			s.log.Info("Redis publishes sorted-set keyspace events: newly scheduled tasks wake this instance at once")
		}
	}
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return
		case m, ok := <-ch:
			if !ok {
				return
			}
			s.heard(m)
		}
	}
}

func (s *Scanner) heard(m *redis.Message) {
	if m.Pattern != "" {
		// Keyspace event: channel __keyspace@<db>__:<pending key>, payload
		// the command. Only additions can bring a task due earlier.
		if m.Payload != "zadd" && m.Payload != "zincr" {
			return
		}
		i, ok := s.shardOfKey(m.Channel[strings.Index(m.Channel, "__:")+3:])
		if !ok {
			return
		}
		s.notes.due(i, 0) // look at the shard now
		s.Wake()
		return
	}
	switch m.Payload {
	case shard.WakeBusy:
		s.notes.mu.Lock()
		s.notes.busy = true
		s.notes.mu.Unlock()
	case shard.WakeLead:
		s.notes.mu.Lock()
		s.notes.lead = true
		s.notes.mu.Unlock()
	default:
		i, ms, ok := shard.ParseWakeDue(m.Payload)
		if !ok || i >= s.opt.Shards {
			return
		}
		s.notes.due(i, ms)
	}
	s.Wake()
}

// shardOfKey returns i if key is the pending key of shard i of this queue.
func (s *Scanner) shardOfKey(key string) (int, bool) {
	head := s.keys.Prefix + ":{" + s.keys.Queue + ":"
	rest, ok := strings.CutPrefix(key, head)
	if !ok || !strings.HasSuffix(rest, "}") {
		return 0, false
	}
	i, err := strconv.Atoi(strings.TrimSuffix(rest, "}"))
	if err != nil || i < 0 || i >= s.opt.Shards {
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
func (s *Scanner) keyspacePattern(ctx context.Context) string {
	if s.cluster {
		return ""
	}
	cfg, err := s.rdb.ConfigGet(ctx, "notify-keyspace-events").Result()
	if err != nil {
		return "" // e.g. an ACL user without CONFIG: polling only
	}
	flags := cfg["notify-keyspace-events"]
	if !strings.Contains(flags, "K") || !strings.ContainsAny(flags, "zA") {
		return ""
	}
	db := 0
	if c, ok := s.rdb.(*redis.Client); ok {
		db = c.Options().DB
	}
	return "__keyspace@" + strconv.Itoa(db) + "__:" + globEscape(s.keys.Prefix+":{"+s.keys.Queue+":") + "*}"
}

// globEscape escapes the characters Redis's pattern matching treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
