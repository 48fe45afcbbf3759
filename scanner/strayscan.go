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

// The walk of the indexes beyond a queue's served ones (strays.go) looks
// at some 4,000 keys a minute per queue: for a thousand queues, 68,000
// keys a second written by the instance and looked up by Redis, about a
// third of what an idle instance and its Redis cost. Where the whole
// keyspace is much smaller than that, one SCAN of it every half StrayCycle
// finds the same keys for every queue of the instance at once; while it
// does, the queues do not walk. Where it is not (a Redis shared with a
// large cache), or SCAN or DBSIZE is refused, or a scan fails, the queues
// walk as before.

// strayScanWalkPerKey is how many keys of a walk a key of a scan is worth
// in Redis's time: a SCAN matching a pattern costs Redis about 0.65 µs a
// key of the keyspace, an EXISTS about 0.08 µs a key it is given (Redis
// 7.0, one core, before parsing, which adds to the EXISTS). The scan runs
// twice a cycle: it is taken only while that costs at most the walk's
// cost over the cycle, far less for a thousand queues on a keyspace of
// tens of thousands of keys. (A SCAN's cost follows the table's buckets,
// which a keyspace emptied by mass deletes leaves sparse for a while.)
const strayScanWalkPerKey = 16

// strayScanTimeout is the least time a scan is given.
const strayScanTimeout = 5 * time.Second

// strayScanCount is SCAN's COUNT: a call visits about this many slots of
// the keyspace, about 0.3 ms of Redis's time.
const strayScanCount = 500

// StrayScan looks for the keys producers write beyond the served shards
// of an instance's queues by one SCAN of the keyspace (see above). Start
// it with NewStrayScan, pass it to the queues (Options.StrayScan) and
// Close it once they have stopped.
type StrayScan struct {
	rdb    redis.UniversalClient
	every  time.Duration
	prefix string // the keys' prefix, with ":{": all pending keys start with it
	log    *slog.Logger
	ctx    context.Context // ends with Close, so that a scan under way does not hold it up
	cancel context.CancelFunc

	mu     sync.Mutex
	queues map[string]*Queue // by their pending keys' head, "P:{Q:"

	// covered is when the last scan started, zero while the last scan was
	// not taken or failed.
	covered atomic.Pointer[time.Time]

	stop, stopped chan struct{}
}

// NewStrayScan starts the StrayScan of the queues of key prefix prefix,
// scanning every every (StrayCycle/2). Nil for a cluster client: a
// cluster's keyspace is split over its nodes, and there the queues walk.
func NewStrayScan(rdb redis.UniversalClient, prefix string, every time.Duration, log *slog.Logger) *StrayScan {
	if _, cluster := rdb.(*redis.ClusterClient); cluster || every <= 0 {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	s := &StrayScan{rdb: rdb, every: every, prefix: prefix + ":{", log: log, queues: map[string]*Queue{},
		stop: make(chan struct{}), stopped: make(chan struct{})}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run()
	return s
}

// Close stops the StrayScan.
func (s *StrayScan) Close() {
	if s == nil {
		return
	}
	close(s.stop)
	s.cancel()
	<-s.stopped
}

// add registers q; false if its keys do not have the scan's prefix (the
// queue then walks: the scan would not see its keys).
func (s *StrayScan) add(q *Queue) bool {
	h := pendingHead(q.keys)
	if !strings.HasPrefix(h, s.prefix) {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queues[h] = q
	return true
}

func (s *StrayScan) remove(q *Queue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := pendingHead(q.keys); s.queues[h] == q {
		delete(s.queues, h)
	}
}

// pendingHead is what every pending key of the queue starts with, its
// index and "}" following.
func pendingHead(k shard.Keys) string { return k.Prefix + ":{" + k.Queue + ":" }

// covers tells whether the scan stands in for the queues' walk now: its
// last scan was taken, succeeded and started less than StrayCycle ago.
func (s *StrayScan) covers() bool {
	if s == nil {
		return false
	}
	at := s.covered.Load()
	return at != nil && time.Since(*at) < StrayCycle
}

func (s *StrayScan) run() {
	defer close(s.stopped)
	// The first scan soon after the start (the queues walk until then),
	// once the queues have read their layouts.
	t := time.NewTimer(min(LayoutPoll, s.every))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		s.scan()
		t.Reset(s.every)
	}
}

// scan scans the keyspace once, if that is cheaper than the walks it
// stands in for, and hands each sweeping queue the indexes beyond its
// served ones that hold a key.
func (s *StrayScan) scan() {
	// At least strayScanTimeout: a slow reply must not end the coverage
	// of a short interval.
	ctx, cancel := context.WithTimeout(s.ctx, max(s.every, strayScanTimeout))
	defer cancel()
	s.mu.Lock()
	walk := 0
	for _, q := range s.queues {
		if q.Sweeping() {
			l := q.Layout()
			walk += shard.MaxShards - strayFrom(l)
		}
	}
	s.mu.Unlock()
	if walk == 0 { // no queue sweeps here: nothing to look for
		s.uncover("no queue sweeps here")
		return
	}
	start := time.Now()
	size, err := s.rdb.DBSize(ctx).Result()
	if err != nil {
		s.uncover("cannot read the size of the keyspace", "err", err)
		return
	}
	if size*strayScanWalkPerKey > int64(walk) {
		s.uncover("the keyspace is too large to scan for less than the walks cost", "keys", size, "walk_keys_per_minute", walk)
		return
	}
	found := map[*Queue][]int{}
	match := redisconn.GlobEscape(s.prefix) + "*}"
	var cursor uint64
	for {
		keys, next, err := s.rdb.Scan(ctx, cursor, match, strayScanCount).Result()
		if err != nil {
			s.uncover("cannot scan the keyspace", "err", err)
			return
		}
		s.mu.Lock()
		for _, k := range keys {
			if q, i, ok := s.parse(k); ok {
				found[q] = append(found[q], i)
			}
		}
		s.mu.Unlock()
		if cursor = next; cursor == 0 {
			break
		}
	}
	if s.covered.Swap(&start) == nil {
		s.log.Info("scanning the keyspace for tasks written beyond the queues' shard counts, in place of each queue's walk of those indexes",
			"keys", size, "every", s.every)
	}
	for q, idx := range found {
		if beyond := beyondServed(q.Layout(), idx); len(beyond) > 0 && q.Sweeping() {
			q.strayKeys(beyond)
		}
	}
}

// uncover ends the scan's standing in for the queues' walks, and says why
// when it stood in until now.
func (s *StrayScan) uncover(why string, args ...any) {
	if s.covered.Swap(nil) != nil {
		s.log.Info(why+": the queues walk their indexes beyond the shard count again", args...)
	} else {
		s.log.Debug(why+": the queues walk their indexes beyond the shard count", args...)
	}
}

// parse tells which queue and index a key found by the scan is the
// pending key of; ok is false for any other key.
func (s *StrayScan) parse(key string) (q *Queue, i int, ok bool) {
	if !strings.HasSuffix(key, "}") {
		return nil, 0, false
	}
	colon := strings.LastIndexByte(key, ':')
	if colon < 0 {
		return nil, 0, false
	}
	q = s.queues[key[:colon+1]]
	digits := key[colon+1 : len(key)-1]
	i, err := strconv.Atoi(digits)
	if q == nil || err != nil || i < 0 || i >= shard.MaxShards || strconv.Itoa(i) != digits {
		return nil, 0, false
	}
	return q, i, true
}
