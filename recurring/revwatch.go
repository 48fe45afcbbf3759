package recurring

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// A materialiser notices changed definitions by the queue's revision
// counter. Read by each queue's materialiser once a RevPoll, a thousand
// queues cost a thousand wake-ups and GETs a second, the largest part of
// an idle instance's CPU after the queue-state reads; so on one Redis the
// instance's RevWatch reads every swept queue's counter in one MGET per
// RevPoll and wakes only the materialisers whose counter changed.

// revWatchChunk bounds one MGET, so that a thousand queues' read does not
// hold Redis in one command.
const revWatchChunk = 1000

// RevWatch reads the revision counters of the queues whose materialisers
// work (this instance sweeps them) on one Redis, one MGET per interval.
// Start it with NewRevWatch and Run, and pass it to the materialisers
// (Options.RevWatch). Nil on Redis Cluster (the counters live on many
// primaries): each materialiser reads its own.
type RevWatch struct {
	rdb    redis.UniversalClient
	every  time.Duration
	log    *slog.Logger
	logged string // the last read error logged (each kind once in a row)

	mu   sync.Mutex
	subs map[*revSub]struct{}
}

// revSub is one materialiser's watch of its revision counter.
type revSub struct {
	key  string
	ch   chan struct{} // told when the counter changed, or could not be read
	last string        // the value last told of (MGET's nil: "")
	seen bool          // last is a read value: the first read always tells
}

// NewRevWatch returns the RevWatch of rdb's queues, read every interval
// (RevPoll's default when 0), logging to log (slog's default when nil).
// Nil for a cluster client.
func NewRevWatch(rdb redis.UniversalClient, every time.Duration, log *slog.Logger) *RevWatch {
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		return nil
	}
	if every <= 0 {
		every = time.Second
	}
	if log == nil {
		log = slog.Default()
	}
	return &RevWatch{rdb: rdb, every: every, log: log, subs: map[*revSub]struct{}{}}
}

// Run reads the watched counters on the interval's grid until ctx ends.
func (w *RevWatch) Run(ctx context.Context) {
	for {
		t := time.NewTimer(time.Until(time.Now().Truncate(w.every).Add(w.every)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		w.look(ctx)
	}
}

// watch starts watching key; the first read tells of it.
func (w *RevWatch) watch(key string) *revSub {
	s := &revSub{key: key, ch: make(chan struct{}, 1)}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.subs[s] = struct{}{}
	return s
}

// unwatch stops watching s.
func (w *RevWatch) unwatch(s *revSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.subs, s)
}

func (s *revSub) tell() {
	select {
	case s.ch <- struct{}{}:
	default:
	}
}

// look reads every watched counter and tells those that changed. A chunk
// that cannot be read tells all its watchers, which read for themselves
// (and report why it failed). A counter that is not a string reads as
// absent here; its materialiser's own read, once a minute, reports it.
func (w *RevWatch) look(ctx context.Context) {
	w.mu.Lock()
	subs := make([]*revSub, 0, len(w.subs))
	for s := range w.subs {
		subs = append(subs, s)
	}
	w.mu.Unlock()
	if len(subs) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, w.every)
	defer cancel()
	pipe := w.rdb.Pipeline()
	var cmds []*redis.SliceCmd
	for i := 0; i < len(subs); i += revWatchChunk {
		chunk := subs[i:min(i+revWatchChunk, len(subs))]
		keys := make([]string, len(chunk))
		for n, s := range chunk {
			keys[n] = s.key
		}
		cmds = append(cmds, pipe.MGet(rctx, keys...))
	}
	_, _ = pipe.Exec(rctx) // each chunk's own error is read below
	w.mu.Lock()
	defer w.mu.Unlock()
	failed := ""
	for c, cmd := range cmds {
		chunk := subs[c*revWatchChunk : min((c+1)*revWatchChunk, len(subs))]
		vals, err := cmd.Result()
		if err != nil && ctx.Err() == nil {
			failed = err.Error()
		}
		for n, s := range chunk {
			if err != nil || n >= len(vals) {
				s.tell()
				continue
			}
			v, _ := vals[n].(string)
			if !s.seen || v != s.last {
				s.last, s.seen = v, true
				s.tell()
			}
		}
	}
	if failed != "" && failed != w.logged {
		// Each materialiser then reads its own counter every RevPoll:
		// schedules still work, at a GET a queue a second.
		args := []any{"err", failed}
		if strings.Contains(failed, "NOPERM") {
			args = append(args, "hint", "the Redis ACL user needs +mget (docs/how-it-works.md#redis-acls)")
		}
		w.log.Warn("cannot read the recurring schedules' revisions together; each queue reads its own", args...)
	}
	w.logged = failed
}
