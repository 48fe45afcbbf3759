// Package liveness lets the instances of a fleet know within a second or
// two that one of them died, so that what it had claimed is handed out
// again at once instead of when its lease runs out, without ever handing
// out what a live but stopped instance (SIGSTOP, a long pause, a network
// partition) may still publish.
//
// Each instance heartbeats into one hash, P:live (field: its liveness id,
// value: the Redis ms of its last heartbeat and the queues it serves), and
// keeps a subscription (sharded on Redis Cluster) to a
// channel of its own, P:live:<id>, open on the node that serves that
// channel. An instance is declared dead only when both say so: its
// heartbeat is older than the timeout AND its subscription is gone. A
// killed process's connections are closed by its kernel at once, so it
// is found dead one timeout after its last heartbeat; a stopped or
// partitioned one keeps its connection open from Redis's side and is left
// to its leases. The declaration is a compare-and-set on the record (it
// becomes "dead <ms>"), which fences the instance: its next heartbeat is
// refused, so it publishes nothing more it had claimed under that id and
// takes a new one. Until then it fences itself: it publishes only while
// its last successful heartbeat was sent less than half the timeout ago,
// and a declaration needs the record to be older than the whole timeout.
//
// On Redis Cluster the records live on one primary, which may stop
// answering while the others serve their shards; a fence on the heartbeat
// alone would then stop every instance's publishing, not only that
// primary's shards. There the instance's channel is placed on another
// primary (its liveness id is chosen so), and the instance pings its own
// subscription: while a ping sent less than half the timeout ago was
// answered on a subscription that was open before its record could go
// stale, and less than the cluster's node timeout has passed since its
// last heartbeat went through, no one can find it unsubscribed: a judge
// asks the primary the majority routes the channel to, and a partition
// that left the instance with its channel's old primary began after that
// heartbeat, so the majority cannot have failed that primary over yet. It
// may then go on publishing with its heartbeat failing. What that leaves
// open is a double fault: its subscription's connection closed by Redis
// within half a timeout of a ping while the records' primary answers
// others but not it. Without the node timeout (CONFIG GET refused) the
// heartbeat alone decides.
package liveness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults.
const (
	// Timeout: an instance whose heartbeat is this old and whose
	// connection is gone is dead.
	Timeout = 1500 * time.Millisecond
	// Keep: how long records of dead instances stay (their claims' leases
	// have run out long before).
	Keep = 10 * time.Minute
)

// Options configure a Liveness.
type Options struct {
	Prefix string // key prefix P
	ID     string // the instance's id; liveness ids are ID#<epoch>
	// Timeout (0: Timeout); heartbeats go every quarter of it, and the
	// instance publishes only while its last one is under half of it old.
	Timeout time.Duration
	Keep    time.Duration // 0: Keep
	// OnDead hands out the claims of a dead liveness id (in every queue
	// the instance serves). It is called once per id and process, for ids
	// this instance declared dead, ids it finds declared dead by others,
	// and its own former id once it learns it was declared dead. It runs
	// on a goroutine of its own and must be safe to run twice.
	OnDead func(ctx context.Context, id string)
	// Queues are the queues the instance serves: its record names them,
	// so that the live instances of a queue know each other (Members).
	Queues []string
	Logger *slog.Logger
}

// Liveness is one instance's heartbeat, its fence, and its watch over the
// others. Run it once.
type Liveness struct {
	rdb redis.UniversalClient
	opt Options
	log *slog.Logger

	mu     sync.Mutex
	id     string    // the current liveness id
	epoch  int       // its number
	okSent time.Time // when the last heartbeat that succeeded for id was sent
	ps     *redis.PubSub
	// The subscription's proof of life (Redis Cluster): subAt, when its
	// current connection was confirmed subscribed (zero: not now); pongAt,
	// when the last ping answered on that connection was sent.
	subAt, pongAt time.Time
	// unanswered: when the first ping since the last answer was sent;
	// lostAt: when the subscription was found gone (an error, or Redis
	// unsubscribed it), zero while it is there.
	unanswered, lostAt time.Time
	// base: ping payloads are offsets from it (its monotonic reading
	// makes their ages immune to wall-clock steps).
	base time.Time
	// nodeTimeout: the cluster's node timeout, 0 if unknown; the
	// subscription's proof holds at most that long after the last
	// heartbeat (no failover completes sooner).
	nodeTimeout time.Duration
	closed      bool       // Run ended: subscribe opens nothing more
	subMu       sync.Mutex // one subscribe at a time
	reopening   atomic.Bool
	cluster     bool
	seen        map[string]bool // dead ids handed to OnDead
	// members: per queue, the live ids serving it, sorted, from the last
	// heartbeat's records (this instance's included while it is live).
	members map[string][]string
	failed  bool // the last heartbeat failed (logged once)
	// streak: when the current run of heartbeats that went through began
	// (zero after one failed): others are judged only once it is a
	// timeout old (see judgeable).
	streak time.Time
	// judging: silent instances are being judged (one round at a time).
	judging atomic.Bool
	// draining: the instance is stopping; its record names no queue, so
	// the others take its shards over while it finishes.
	draining atomic.Bool
	// held: queues left out of the record for now (Hold); under mu.
	held map[string]bool
	// kick asks Run for a heartbeat now (a change of the queues served).
	kick   chan struct{}
	onDead sync.WaitGroup
}

// Key is the hash of liveness records.
func Key(prefix string) string { return prefix + ":live" }

// Channel is the channel instance id keeps subscribed while it lives.
func Channel(prefix, id string) string { return prefix + ":live:" + id }

// New returns a Liveness.
func New(rdb redis.UniversalClient, opt Options) *Liveness {
	if opt.Timeout <= 0 {
		opt.Timeout = Timeout
	}
	if opt.Keep <= 0 {
		opt.Keep = Keep
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	l := &Liveness{rdb: rdb, opt: opt, log: opt.Logger, seen: map[string]bool{}, held: map[string]bool{}, kick: make(chan struct{}, 1)}
	_, l.cluster = rdb.(*redis.ClusterClient)
	l.base = time.Now()
	l.id = l.idOf(0)
	return l
}

// Prepare chooses, on Redis Cluster, the first liveness id: one whose
// channel another primary than the records' serves. Call it before
// anything reads ID(); without it (or if Redis does not answer) the id
// is the first one, and the instance fences itself whenever the records'
// primary does not answer.
func (l *Liveness) Prepare(ctx context.Context) {
	e := l.pickEpoch(ctx, 0)
	nt := l.readNodeTimeout(ctx)
	l.mu.Lock()
	l.epoch, l.id, l.nodeTimeout = e, l.idOf(e), nt
	l.mu.Unlock()
}

// readNodeTimeout reads cluster-node-timeout from the records' primary (0
// if this is not a cluster, or it cannot be read).
func (l *Liveness) readNodeTimeout(ctx context.Context) time.Duration {
	cc, ok := l.rdb.(*redis.ClusterClient)
	if !ok {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, l.opt.Timeout)
	defer cancel()
	node, err := cc.MasterForKey(ctx, Key(l.opt.Prefix))
	var v map[string]string
	if err == nil {
		v, err = node.ConfigGet(ctx, "cluster-node-timeout").Result()
	}
	ms, perr := strconv.ParseInt(v["cluster-node-timeout"], 10, 64)
	if err == nil && perr != nil {
		err = fmt.Errorf("cluster-node-timeout %q: %w", v["cluster-node-timeout"], perr)
	}
	if err != nil {
		l.log.Warn("cannot read the cluster's node timeout (grant +config|get): while the primary of the liveness records does not answer, every queue's publishing waits, not only that primary's shards", "err", err)
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}

// pickEpoch returns the first epoch from from on whose channel is served
// by another primary than the records (from itself if none of the next
// few is, or this is not a cluster).
func (l *Liveness) pickEpoch(ctx context.Context, from int) int {
	cc, ok := l.rdb.(*redis.ClusterClient)
	if !ok {
		return from
	}
	ctx, cancel := context.WithTimeout(ctx, l.opt.Timeout)
	defer cancel()
	records, err := cc.MasterForKey(ctx, Key(l.opt.Prefix))
	if err != nil {
		return from
	}
	for e := from; e < from+64; e++ {
		node, err := cc.MasterForKey(ctx, Channel(l.opt.Prefix, l.idOf(e)))
		if err != nil {
			return from
		}
		if node.Options().Addr != records.Options().Addr {
			return e
		}
	}
	return from
}

func (l *Liveness) idOf(epoch int) string { return l.opt.ID + "#" + strconv.Itoa(epoch) }

// ID is the liveness id claims are recorded under now.
func (l *Liveness) ID() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.id
}

// Check says whether tasks claimed under id may be published now (ok), or
// never (fenced: id is not the current one, it was declared dead). Neither:
// the last heartbeat is too old, wait.
func (l *Liveness) Check(id string) (ok, fenced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if id != l.id {
		return false, true
	}
	return l.liveLocked(), false
}

// liveLocked reports whether no other instance can have declared this one
// dead (see the package doc). l.mu is held.
func (l *Liveness) liveLocked() bool {
	half := l.opt.Timeout / 2
	switch {
	case l.okSent.IsZero():
		return false
	case time.Since(l.okSent) < half:
		return true
	}
	// The subscription proves it: a ping answered on a connection
	// subscribed before the record could be found stale (a judge reads a
	// record stale only a whole timeout after okSent), and less than the
	// cluster's node timeout since the last heartbeat went through: a
	// partition that leaves this instance with its channel's primary
	// began after it, and the majority fails that primary over no sooner.
	return l.cluster && l.nodeTimeout > half && time.Since(l.okSent) < l.nodeTimeout-half &&
		!l.subAt.IsZero() && !l.subAt.After(l.okSent.Add(half)) &&
		!l.pongAt.Before(l.subAt) && time.Since(l.pongAt) < half
}

// heartbeatScript renews one instance's record unless it was declared
// dead, prunes records older than the keep time, and returns the others.
//
// KEYS[1] the liveness records P:live (hash: id -> "<ms>|<queue>,<queue>...",
//
//	or "dead <ms>" once declared dead)
//
// ARGV[1] the instance's liveness id
// ARGV[2] keep time, ms
// ARGV[3] the queues it serves, comma-separated
// Returns {now_ms, 1 (renewed) or 0 (declared dead), id, value, ...} with
// the other instances' records.
var heartbeatScript = redis.NewScript(`#!lua flags=allow-oom
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[2])
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and string.sub(v, 1, 5) == 'dead ' then return {now, 0} end
redis.call('HSET', KEYS[1], ARGV[1], now .. '|' .. (ARGV[3] or ''))
local out = {now, 1}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local seen = tonumber(string.match(all[i + 1], '(%d+)'))
  if not seen or now - seen > keep then
    redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
redis.call('PEXPIRE', KEYS[1], keep)
return out
`)

// declareScript declares an instance dead if its record is still the one
// read and older than the timeout: the compare-and-set that fences it.
//
// KEYS[1] the liveness records
// ARGV[1] the instance's liveness id
// ARGV[2] its record as read
// ARGV[3] the timeout, ms
// Returns 1 if it declared it dead, else 0.
var declareScript = redis.NewScript(`#!lua flags=allow-oom
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v ~= ARGV[2] or now - tonumber(string.match(v, '^(%d+)')) <= tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], 'dead ' .. now)
return 1
`)

// Run heartbeats until ctx ends, then removes the instance's record (a
// stopping instance has handed its claims back itself).
func (l *Liveness) Run(ctx context.Context) error {
	defer l.onDead.Wait()
	l.subscribe(ctx)
	defer func() {
		l.mu.Lock()
		ps, id := l.ps, l.id
		l.closed = true
		l.mu.Unlock()
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		l.rdb.HDel(stop, Key(l.opt.Prefix), id)
		if ps != nil {
			_ = ps.Close()
		}
	}()
	tick := time.NewTicker(l.opt.Timeout / 4)
	defer tick.Stop()
	for {
		l.beat(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-l.kick:
		}
	}
}

// subscribe opens the subscription of the current id, then closes the
// former one's. go-redis keeps it open, reconnecting as needed, while its
// channel is read.
func (l *Liveness) subscribe(ctx context.Context) {
	l.subMu.Lock()
	defer l.subMu.Unlock()
	l.mu.Lock()
	id := l.id
	l.mu.Unlock()
	ch := Channel(l.opt.Prefix, id)
	var ps *redis.PubSub
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		// Sharded: the subscription follows its slot to the node that
		// serves it, where subscribers() asks (a plain one stays on the
		// node it was opened on when the slot moves).
		ps = cc.SSubscribe(ctx, ch)
	} else {
		ps = l.rdb.Subscribe(ctx, ch)
	}
	confirm, cancel := context.WithTimeout(ctx, l.opt.Timeout)
	_, err := ps.Receive(confirm)
	if err != nil && ctx.Err() == nil {
		// Without it this instance looks disconnected whenever it is
		// silent: a stop or a partition could then get it declared dead.
		l.log.Error("cannot subscribe to this instance's liveness channel: if it stops or is cut off, others may declare it dead", "channel", ch, "err", err)
	}
	cancel()
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = ps.Close()
		return
	}
	old := l.ps
	l.ps = ps
	l.subAt, l.pongAt, l.unanswered, l.lostAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	if err == nil {
		l.subAt = time.Now()
	} else {
		l.lostAt = time.Now()
	}
	l.mu.Unlock()
	go l.receive(ps)
	go l.ping(ctx, ps)
	if old != nil { // after the new one is open: no moment without one
		_ = old.Close()
	}
}

// receive reads ps until it is closed: its (re)subscriptions and the
// answers to ping's pings (nothing is published there). go-redis
// reconnects and subscribes again after an error.
func (l *Liveness) receive(ps *redis.PubSub) {
	for {
		msg, err := ps.Receive(context.Background())
		now := time.Now()
		l.mu.Lock()
		current, closed := l.ps == ps, l.closed
		switch m := msg.(type) {
		case nil:
			if current {
				l.lost(now)
			}
		case *redis.Subscription:
			if current && (m.Kind == "subscribe" || m.Kind == "ssubscribe") {
				l.subAt, l.pongAt, l.unanswered, l.lostAt = now, time.Time{}, time.Time{}, time.Time{}
			} else if current {
				l.lost(now) // Redis unsubscribed it (its slot moved): beat opens it again
			}
		case *redis.Pong:
			ns, perr := strconv.ParseInt(m.Payload, 10, 64)
			if sent := l.base.Add(time.Duration(ns)); current && perr == nil && !l.subAt.IsZero() && !sent.Before(l.subAt) && sent.After(l.pongAt) {
				l.pongAt, l.unanswered = sent, time.Time{}
			}
		}
		l.mu.Unlock()
		if errors.Is(err, redis.ErrClosed) || err != nil && closed {
			return // closed, or Run ended and is closing it
		}
		if err != nil {
			time.Sleep(l.opt.Timeout / 8) // go-redis reconnects on the next read
		}
	}
}

// lost records that the subscription is gone. l.mu is held.
func (l *Liveness) lost(now time.Time) {
	l.subAt, l.pongAt, l.unanswered = time.Time{}, time.Time{}, time.Time{}
	if l.lostAt.IsZero() {
		l.lostAt = now
	}
}

// ping pings ps's connection every quarter of the timeout, with the time
// sent as the payload, until ps is closed or ctx ends.
func (l *Liveness) ping(ctx context.Context, ps *redis.PubSub) {
	tick := time.NewTicker(l.opt.Timeout / 4)
	defer tick.Stop()
	for {
		sent := time.Now()
		err := ps.Ping(ctx, strconv.FormatInt(int64(sent.Sub(l.base)), 10))
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		l.mu.Lock()
		if err == nil && l.ps == ps && l.unanswered.IsZero() && l.pongAt.Before(sent) {
			l.unanswered = sent
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// beat sends one heartbeat and acts on the records it returns.
func (l *Liveness) beat(ctx context.Context) {
	l.mu.Lock()
	id := l.id
	l.mu.Unlock()
	key := Key(l.opt.Prefix)
	sent := time.Now()
	hb, cancel := context.WithTimeout(ctx, l.opt.Timeout/2)
	vals, err := heartbeatScript.Run(hb, l.rdb, []string{key}, id, l.opt.Keep.Milliseconds(), l.queuesField()).Slice()
	cancel()
	if err == nil && len(vals) < 2 {
		err = fmt.Errorf("heartbeat on %s: %d values", key, len(vals))
	}
	if err != nil {
		if ctx.Err() == nil {
			l.mu.Lock()
			first := !l.failed
			l.failed = true
			l.streak = time.Time{}
			l.mu.Unlock()
			if first && errors.Is(err, context.DeadlineExceeded) {
				// No heartbeat answered within half the timeout proves
				// anything: with round trips that slow, no instance publishes.
				l.log.Warn("liveness heartbeat not answered within half of DISPATCHER_LIVENESS_TIMEOUT: publishing waits for one that is; if Redis round trips are this slow, raise the timeout", "key", key, "timeout", l.opt.Timeout, "err", err)
			} else if first {
				l.log.Warn("liveness heartbeat failed: publishing waits for the next one", "key", key, "err", err)
			}
		}
		return
	}
	now, _ := vals[0].(int64)
	if renewed, _ := vals[1].(int64); renewed == 0 {
		l.fenced(ctx, id)
		return
	}
	l.mu.Lock()
	if l.id == id {
		l.okSent = sent
	}
	if l.streak.IsZero() {
		l.streak = sent
	}
	streak := l.streak
	if l.failed {
		l.failed = false
		l.log.Info("liveness heartbeat works again")
	}
	// A subscription that answers no ping while Redis answers heartbeats
	// (a connection dead without an error), or that stays gone (Redis
	// unsubscribed it when its slot moved, and go-redis does not subscribe
	// again), is opened again.
	mute := !l.subAt.IsZero() && !l.unanswered.IsZero() && time.Since(l.unanswered) > 4*l.opt.Timeout
	gone := l.subAt.IsZero() && !l.lostAt.IsZero() && time.Since(l.lostAt) > 4*l.opt.Timeout
	l.mu.Unlock()
	if (mute || gone) && l.reopening.CompareAndSwap(false, true) {
		l.log.Warn("this instance's liveness subscription is gone or answers no ping: opening it again", "unanswered_pings", mute)
		// Off the heartbeat's path: a node that does not answer holds up
		// the subscribe, not the heartbeat.
		l.onDead.Add(1)
		go func() {
			defer l.onDead.Done()
			defer l.reopening.Store(false)
			l.subscribe(ctx)
		}()
	}
	// One slice each for the queues served by this instance alone and for
	// those it holds, shared: an append of another's id copies it (its
	// capacity is its length). A heartbeat of a thousand queues otherwise
	// built a thousand of them, every beat.
	members := make(map[string][]string, len(l.opt.Queues))
	alone, none := []string{id}, []string{}
	l.mu.Lock()
	for _, q := range l.opt.Queues {
		members[q] = none
		if !l.held[q] {
			members[q] = alone
		}
	}
	l.mu.Unlock()
	var silent [][2]string // records of others to judge off this path
	listed := make(map[string]bool, len(vals)/2)
	for i := 2; i+1 < len(vals); i += 2 {
		other, _ := vals[i].(string)
		v, _ := vals[i+1].(string)
		listed[other] = true
		if l.fresh(now, v) || !strings.HasPrefix(v, "dead ") && !judgeable(streak, l.timeoutOf(v)) {
			ms, queues, _ := strings.Cut(v, "|")
			for _, q := range strings.Split(queues, ",") {
				if m, ok := members[q]; ok && ms != "" {
					members[q] = append(m, other)
				}
			}
		} else {
			silent = append(silent, [2]string{other, v})
		}
	}
	if len(silent) > 0 && l.judging.CompareAndSwap(false, true) {
		// On a goroutine, each call with a deadline: a node that hangs
		// (the one serving a silent instance's channel) must not hold up
		// this instance's own heartbeat, and with it its publishing.
		l.onDead.Add(1)
		go func() {
			defer l.onDead.Done()
			defer l.judging.Store(false)
			for _, r := range silent {
				jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opt.Timeout/2)
				l.judge(jctx, ctx, now, r[0], r[1])
				cancel()
			}
		}()
	}
	for _, m := range members {
		slices.Sort(m)
	}
	l.mu.Lock()
	if l.id == id {
		l.members = members
	}
	// A dead id is remembered while its record is kept (the heartbeat
	// prunes it after the keep time): over a long run with restarts the
	// memory would otherwise grow with every id that ever died, and an id
	// whose record was pruned may come back (an instance stopped that
	// long) and must be handed out again if it dies again.
	for dead := range l.seen {
		if !listed[dead] {
			delete(l.seen, dead)
		}
	}
	l.mu.Unlock()
}

// timeoutMark starts the element of a record's queue list that gives the
// instance's own timeout in ms ("~1500"): no queue name has it, so a
// version that does not know it takes it for a queue no one serves.
const timeoutMark = "~"

// queuesField is the record's list of queues served (none once draining,
// and none held: Hold), then the instance's own timeout: a judge declares
// it dead by that, the one it fences itself by, not by the judge's own
// (instances may differ during a rolling change of it).
func (l *Liveness) queuesField() string {
	own := timeoutMark + strconv.FormatInt(l.opt.Timeout.Milliseconds(), 10)
	if l.draining.Load() {
		return own
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	qs := make([]string, 0, len(l.opt.Queues)+1)
	for _, q := range l.opt.Queues {
		if !l.held[q] {
			qs = append(qs, q)
		}
	}
	return strings.Join(append(qs, own), ",")
}

// timeoutOf is the timeout a record's instance fences itself by: the one
// it gives, or this instance's own if it gives none (an older version).
func (l *Liveness) timeoutOf(v string) int64 {
	_, queues, _ := strings.Cut(v, "|")
	for q := range strings.SplitSeq(queues, ",") {
		if ms, ok := strings.CutPrefix(q, timeoutMark); ok {
			if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 {
				return n
			}
		}
	}
	return l.opt.Timeout.Milliseconds()
}

// Hold leaves queue out of (held) or puts it back into the instance's
// record, at once (a heartbeat is sent now): an instance that cannot
// publish (its broker is out of reach) must not keep a share of the
// queue's shards, which no one else would sweep meanwhile.
func (l *Liveness) Hold(queue string, held bool) {
	l.mu.Lock()
	changed := l.held[queue] != held
	if held {
		l.held[queue] = true
	} else {
		delete(l.held, queue)
	}
	l.mu.Unlock()
	if changed {
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// Drain says the instance is stopping: from its next heartbeat on its
// record names no queue, so the other instances sweep its share of the
// shards while it settles what it has under way. It still heartbeats
// (its publishes need it) until Run ends.
func (l *Liveness) Drain() { l.draining.Store(true) }

// Members returns the live instances serving queue (their liveness ids,
// sorted; this one's included), as of the last heartbeat; nil while this
// instance's own liveness has lapsed. The slice is shared (with other
// queues' too): read it, do not change it.
func (l *Liveness) Members(queue string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.liveLocked() {
		return nil
	}
	// With the records' primary out of reach (Cluster) the last shares
	// stay: were one instance to sweep every shard meanwhile, its claims
	// would overwrite the last claim of shards whose claim another
	// instance is waiting to retry, and that batch would wait its lease.
	return l.members[queue]
}

// judgeable reports whether others may be judged by a record with timeout
// ms: only once this instance's own heartbeats have gone through for that
// long. After an outage of Redis (a restart, a failover) every record is
// stale and every instance is reconnecting; the first one back would
// otherwise find the others unsubscribed and declare them dead, and what
// they had published unconfirmed would go out twice. A record of another
// not yet judgeable counts as a member's (its share stays) until then.
func judgeable(streak time.Time, ms int64) bool {
	return !streak.IsZero() && time.Since(streak) >= time.Duration(ms)*time.Millisecond
}

// fresh reports whether a record is of a live instance: its heartbeat is
// recent.
func (l *Liveness) fresh(now int64, v string) bool {
	ms, _, _ := strings.Cut(v, "|")
	seen, err := strconv.ParseInt(ms, 10, 64)
	return err == nil && now-seen <= l.timeoutOf(v)
}

// judge looks at another instance's record that is not fresh: declared
// dead (hand its claims out, once), or stale with no connection left
// (declare it dead). ctx bounds its calls; run is the Liveness's own.
func (l *Liveness) judge(ctx, run context.Context, now int64, id, v string) bool {
	if strings.HasPrefix(v, "dead ") {
		l.dead(run, id)
		return false
	}
	ms, _, _ := strings.Cut(v, "|")
	seen, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return false
	}
	n, err := l.subscribers(ctx, Channel(l.opt.Prefix, id))
	if err != nil {
		l.log.Warn("cannot tell whether a silent instance is connected", "instance", id, "err", err)
		return false
	}
	if n > 0 {
		return false // stopped or cut off, not dead: its leases decide
	}
	ok, err := declareScript.Run(ctx, l.rdb, []string{Key(l.opt.Prefix)}, id, v, l.timeoutOf(v)).Int()
	if err != nil {
		l.log.Warn("cannot declare a dead instance dead", "instance", id, "err", err)
		return false
	}
	if ok == 1 {
		l.log.Warn("instance declared dead: no heartbeat and no connection; handing out its claimed tasks", "instance", id, "silent_ms", now-seen)
		l.dead(run, id)
	}
	return false
}

// subscribers counts the subscriptions to ch on the node that serves it.
func (l *Liveness) subscribers(ctx context.Context, ch string) (int64, error) {
	var c redis.Cmdable = l.rdb
	if cc, ok := l.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, ch)
		if err != nil {
			return 0, err
		}
		c = node
	}
	var m map[string]int64
	var err error
	if _, ok := l.rdb.(*redis.ClusterClient); ok {
		m, err = c.PubSubShardNumSub(ctx, ch).Result()
	} else {
		m, err = c.PubSubNumSub(ctx, ch).Result()
	}
	if err != nil {
		return 0, err
	}
	return m[ch], nil
}

// fenced: this instance's id was declared dead (it could not heartbeat
// for the timeout and lost its connection meanwhile). Its claims under
// that id are another's now; it takes a new id.
func (l *Liveness) fenced(ctx context.Context, old string) {
	l.mu.Lock()
	if l.id != old {
		l.mu.Unlock()
		return
	}
	next := l.epoch + 1
	l.mu.Unlock()
	// Chosen before it is taken: no claim is recorded under an id that is
	// then replaced. Only Run's goroutine changes the id.
	next = l.pickEpoch(ctx, next)
	l.mu.Lock()
	l.epoch = next
	l.id = l.idOf(l.epoch)
	l.okSent = time.Time{}
	l.mu.Unlock()
	l.log.Error("this instance was declared dead by another: its claimed tasks go to other instances; going on under a new liveness id", "old", old)
	l.subscribe(ctx)
	l.dead(ctx, old)
}

// dead hands a dead id to OnDead, once.
func (l *Liveness) dead(ctx context.Context, id string) {
	l.mu.Lock()
	if l.seen[id] {
		l.mu.Unlock()
		return
	}
	l.seen[id] = true
	l.mu.Unlock()
	if l.opt.OnDead == nil {
		return
	}
	l.onDead.Add(1)
	go func() {
		defer l.onDead.Done()
		l.opt.OnDead(context.WithoutCancel(ctx), id)
	}()
}
