package scanner

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// A queue that holds nothing costs an instance little, but a thousand of
// them each sweeping and renewing its role twice a second cost a fifth of
// a core and a Redis script call each time. So a queue whose sweeps have
// found every shard empty for a while dozes: its loop stops sweeping,
// bidding and timing, and the instance's IdleWatch looks at all dozing
// queues together, on the sweeps' grid, in one round trip per Redis: one
// script call that renews their sweeper roles, and plain EXISTS over the
// pending and in-flight sets of many queues at once (then, where a group
// holds something, one per queue of that group in a second round trip),
// or, on a small keyspace, one SCAN of all of it instead of the EXISTS. A
// queue is woken when any of its keys exists (a producer's ZADD, another
// instance's claim), when its role is no longer this instance's or is free
// (an instance that shares the queue's shards dozes without it), when its
// broker is not ready (so that its share of the shards goes to other
// instances, see holdShare), or by a wake-up on its channel; then it
// sweeps and bids at once. A task scheduled on a dozing queue is found
// within IdlePollInterval, as by a quiet queue's sweeps.
//
// The EXISTS are plain commands, not calls from the script: passed to a
// script, a thousand queues' 33,000 keys cost Redis 2.5 times the CPU
// (15 ms a look against 6, most of it the script's tables of keys), for
// nothing the script needs them for.

// idleScript renews the sweeper role of dozing queues and tells which of
// them must wake for it.
//
// KEYS: the sweeper key of each queue. ARGV, per queue q: "1" if the
// instance holds its sweeper role (renewed, as leadScript does, while it
// is still the holder), the instance's id, the role's TTL in ms.
// Returns the 1-based positions of the queues to wake: the role they hold
// is no longer theirs, or the role they do not hold is free (its holder
// died: they bid for it, as they would awake).
var idleScript = redis.NewScript(`
local wake = {}
for q = 1, #KEYS do
  local renew, id, ttl = ARGV[3 * q - 2], ARGV[3 * q - 1], ARGV[3 * q]
  local holder = redis.call('GET', KEYS[q])
  if renew == '1' and holder == id then
    redis.call('PEXPIRE', KEYS[q], ttl)
  elseif renew == '1' or not holder then
    wake[#wake + 1] = q
  end
end
return wake
`)

// IdleWatch watches the dozing queues of one instance on one Redis (not a
// cluster, where their keys cannot share a script). Start it with
// NewIdleWatch, pass it to the scanners (Options.IdleWatch), and Close it
// once they have stopped.
type IdleWatch struct {
	rdb   redis.UniversalClient
	every time.Duration

	mu     sync.Mutex
	dozing map[*dozer]struct{}
	gen    uint64    // counts the changes of dozing
	plan   *lookPlan // the look's commands for dozing as of gen

	// Owned by run's goroutine: the keyspace's size at the last look
	// (sized false: unknown), the looks left before the next scan after
	// one came back incomplete, and whether Redis refused DBSIZE or SCAN
	// (an ACL without them: the look asks EXISTS only, from then on).
	dbsize  int64
	sized   bool
	unscan  int
	refused bool
	log     *slog.Logger

	stop, stopped chan struct{}
}

// dozer is one dozing queue as the IdleWatch sees it.
type dozer struct {
	prefix  string // its queue's key prefix
	queue   string // and name
	sweeper string // its sweeper key
	args    []any  // its part of idleScript's ARGV
	// exists is its EXISTS over the pending and in-flight set of each
	// shard, made once: each look sends it as it is.
	exists []any
	ready  func() bool
	nudge  chan struct{} // wakes the queue's loop
}

// newDozer is the dozer of a queue of shards shards (keys), whose sweeper
// role instance holds (leader) or not, with the role's TTL.
func newDozer(keys shard.Keys, shards int, leader bool, instance string, ttl time.Duration, ready func() bool) *dozer {
	d := &dozer{prefix: keys.Prefix, queue: keys.Queue, sweeper: keys.Sweeper(), ready: ready, nudge: make(chan struct{}, 1)}
	d.exists = make([]any, 0, 1+2*shards)
	d.exists = append(d.exists, "exists")
	for i := 0; i < shards; i++ {
		d.exists = append(d.exists, keys.Pending(i), keys.Inflight(i))
	}
	renew := "0"
	if leader {
		renew = "1"
	}
	d.args = []any{renew, instance, strconv.FormatInt(ttl.Milliseconds(), 10)}
	return d
}

// poke wakes the dozing queue.
func (d *dozer) poke() {
	select {
	case d.nudge <- struct{}{}:
	default:
	}
}

// NewIdleWatch starts the IdleWatch that looks at dozing queues every
// interval (IdlePollInterval, on the sweeps' grid). Nil for a cluster
// client: there queues do not doze.
func NewIdleWatch(rdb redis.UniversalClient, every time.Duration, log *slog.Logger) *IdleWatch {
	if _, cluster := rdb.(*redis.ClusterClient); cluster || every <= 0 {
		return nil
	}
	if log == nil {
		log = slog.Default()
	}
	w := &IdleWatch{rdb: rdb, every: every, dozing: map[*dozer]struct{}{}, log: log, stop: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// Close stops the IdleWatch; queues still dozing are woken.
func (w *IdleWatch) Close() {
	if w == nil {
		return
	}
	close(w.stop)
	<-w.stopped
	w.mu.Lock()
	defer w.mu.Unlock()
	for d := range w.dozing {
		d.poke()
	}
}

func (w *IdleWatch) add(d *dozer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.dozing[d] = struct{}{}
	w.gen++
}

func (w *IdleWatch) remove(d *dozer) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.dozing, d)
	w.gen++
}

func (w *IdleWatch) run() {
	defer close(w.stopped)
	for {
		t := time.NewTimer(time.Until(gridNext(time.Now(), w.every)))
		select {
		case <-w.stop:
			t.Stop()
			return
		case <-t.C:
		}
		w.look()
	}
}

// idleKeysPerCall bounds one idleScript call and one EXISTS, so that a
// look at many thousand queues does not hold Redis in one command.
const idleKeysPerCall = 4096

// scanLookCost is what a key of the keyspace costs a SCAN with a MATCH
// over what a key costs an EXISTS, arguments included (0.65 µs and
// 0.16 µs on Redis 7.0): the look scans while the keyspace holds at most
// a quarter as many keys as it would ask EXISTS of, and at most
// scanLookMaxKeys, so that one SCAN holds Redis no longer than a few
// EXISTS would (about 5 ms). A scan also spares the instance writing
// every set's key: it reads back the shard keys of the prefix that exist.
const (
	scanLookCost    = 4
	scanLookMaxKeys = 8192
)

// scanLookPause is how many looks ask EXISTS after a scan came back
// incomplete: a table left sparse by mass deletions (Redis shrinks it
// later, not during a background save) holds more buckets than a COUNT
// sized by DBSIZE goes through, and each look would pay for both.
const scanLookPause = 60

// lookPlan is what a look sends for a set of dozing queues: made once
// and sent as it is while the set stays the same, since a look at a
// thousand queues that built its 37,000 arguments anew each time was a
// quarter of the instance's allocations.
type lookPlan struct {
	gen   uint64   // of IdleWatch.gen it was made for
	ds    []*dozer // the dozing queues
	calls []idleCall
	// The sets of many queues go in one EXISTS: nearly always none holds
	// anything, and a command per queue cost the instance a command's
	// own cost, written and read, a thousand times. Only a group that
	// holds something is asked again, queue by queue, to know which to
	// wake.
	groups []idleCall
	keys   int // in groups
	// On a keyspace small beside those keys, one SCAN of it stands in for
	// the groups: pattern matches every shard's keys of the queues'
	// prefix ("" if they have several).
	pattern string
	byQueue map[string]*dozer // made at the first scan
}

// idleCall is one command of a look, over the queues ds.
type idleCall struct {
	ds   []*dozer
	args []any
}

func newLookPlan(gen uint64, ds []*dozer) *lookPlan {
	p := &lookPlan{gen: gen, ds: ds}
	for rest := ds; len(rest) > 0; {
		c := idleCall{ds: rest[:min(len(rest), idleKeysPerCall)]}
		rest = rest[len(c.ds):]
		c.args = make([]any, 3, 3+4*len(c.ds))
		c.args[0], c.args[1], c.args[2] = "evalsha", idleScript.Hash(), len(c.ds)
		for _, d := range c.ds {
			c.args = append(c.args, d.sweeper)
		}
		for _, d := range c.ds {
			c.args = append(c.args, d.args...)
		}
		p.calls = append(p.calls, c)
	}
	for rest := ds; len(rest) > 0; {
		var g idleCall
		keys := 0
		for len(rest) > 0 && (len(g.ds) == 0 || keys+len(rest[0].exists)-1 <= idleKeysPerCall) {
			g.ds, keys, rest = append(g.ds, rest[0]), keys+len(rest[0].exists)-1, rest[1:]
		}
		g.args = make([]any, 1, 1+keys)
		g.args[0] = "exists"
		for _, d := range g.ds {
			g.args = append(g.args, d.exists[1:]...)
		}
		p.groups = append(p.groups, g)
		p.keys += keys
	}
	if len(ds) > 0 {
		p.pattern = redisconn.GlobEscape(ds[0].prefix) + ":{*:*}*"
		for _, d := range ds {
			if d.prefix != ds[0].prefix {
				p.pattern = ""
			}
		}
	}
	return p
}

// queueOf returns the dozing queue whose pending or in-flight set key k
// is, nil if none: k read back to its queue and index (a queue name may
// hold ':' or '}'), then compared with the queue's own keys.
func (p *lookPlan) queueOf(k string) *dozer {
	if p.byQueue == nil {
		p.byQueue = make(map[string]*dozer, len(p.ds))
		for _, d := range p.ds {
			p.byQueue[d.queue] = d
		}
	}
	rest, ok := strings.CutPrefix(k, p.ds[0].prefix+":{")
	if !ok {
		return nil
	}
	rest, ok = strings.CutSuffix(strings.TrimSuffix(rest, ":inflight"), "}")
	colon := strings.LastIndexByte(rest, ':')
	if !ok || colon < 0 {
		return nil
	}
	i, err := strconv.Atoi(rest[colon+1:])
	d := p.byQueue[rest[:colon]]
	if err != nil || d == nil || i < 0 || 2+2*i >= len(d.exists) || k != d.exists[1+2*i] && k != d.exists[2+2*i] {
		return nil
	}
	return d
}

// look renews the dozing queues' roles and looks at their sets, in one
// round trip, and wakes those it must; a queue whose part failed is woken,
// and then finds out for itself.
func (w *IdleWatch) look() {
	w.mu.Lock()
	if w.plan == nil || w.plan.gen != w.gen {
		ds := make([]*dozer, 0, len(w.dozing))
		for d := range w.dozing {
			ds = append(ds, d)
		}
		w.plan = newLookPlan(w.gen, ds)
	}
	p := w.plan
	w.mu.Unlock()
	// A queue whose broker is not ready is woken (see holdShare); the
	// others are looked at, with a plan of their own for this look.
	var ask []*dozer // nil while every queue is ready
	for n, d := range p.ds {
		switch {
		case !d.ready():
			if ask == nil {
				ask = append(make([]*dozer, 0, len(p.ds)), p.ds[:n]...)
			}
			d.poke()
		case ask != nil:
			ask = append(ask, d)
		}
	}
	if ask != nil {
		p = newLookPlan(p.gen, ask)
	}
	if len(p.ds) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), claimTimeout)
	defer cancel()
	pipe := w.rdb.Pipeline()
	calls := make([]*redis.Cmd, len(p.calls))
	for n, c := range p.calls {
		calls[n] = pipe.Do(ctx, c.args...)
	}
	var dbsize *redis.IntCmd
	if !w.refused && p.pattern != "" {
		dbsize = pipe.DBSize(ctx) // for the next look's choice
	}
	var scan *redis.ScanCmd
	if w.unscan > 0 {
		w.unscan--
	} else if dbsize != nil && w.sized && w.dbsize <= scanLookMaxKeys && w.dbsize*scanLookCost <= int64(p.keys) {
		// COUNT beyond the keyspace: one call goes through all of it, so
		// the look sees at one instant, as EXISTS does, every key there.
		scan = pipe.Scan(ctx, 0, p.pattern, 2*w.dbsize+1000)
	}
	groups := make([]*redis.Cmd, len(p.groups))
	if scan == nil {
		for n, g := range p.groups {
			groups[n] = pipe.Do(ctx, g.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command's own error is read below
	if dbsize != nil {
		n, err := dbsize.Result()
		w.dbsize, w.sized = n, err == nil
		w.refuse("DBSIZE", err)
	}
	if scan != nil {
		keys, cursor, err := scan.Result()
		if err == nil && cursor == 0 {
			for _, k := range keys {
				if d := p.queueOf(k); d != nil {
					d.poke()
				}
			}
			groups = nil
		} else {
			// Refused, failed, or the keyspace outgrew the COUNT: this
			// look asks the sets themselves.
			w.refuse("SCAN", err)
			if err == nil {
				w.unscan = scanLookPause
			}
			pipe := w.rdb.Pipeline()
			for n, g := range p.groups {
				groups[n] = pipe.Do(ctx, g.args...)
			}
			_, _ = pipe.Exec(ctx)
		}
	}
	var again []*dozer
	if groups != nil { // nil: the scan answered
		for n, g := range p.groups {
			switch held, err := groups[n].Int64(); {
			case err != nil:
				for _, d := range g.ds {
					d.poke()
				}
			case held > 0 && len(g.ds) == 1:
				g.ds[0].poke()
			case held > 0:
				again = append(again, g.ds...)
			}
		}
	}
	if len(again) > 0 {
		pipe := w.rdb.Pipeline()
		exists := make([]*redis.Cmd, len(again))
		for n, d := range again {
			exists[n] = pipe.Do(ctx, d.exists...)
		}
		_, _ = pipe.Exec(ctx)
		for n, d := range again {
			if held, err := exists[n].Int64(); err != nil || held > 0 {
				d.poke()
			}
		}
	}
	for n, c := range p.calls {
		woke, err := calls[n].Int64Slice()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			keys := make([]string, len(c.ds))
			var args []any
			for n, d := range c.ds {
				keys[n] = d.sweeper
				args = append(args, d.args...)
			}
			woke, err = idleScript.Run(ctx, w.rdb, keys, args...).Int64Slice()
		}
		if err != nil {
			for _, d := range c.ds {
				d.poke()
			}
			continue
		}
		for _, q := range woke {
			if q >= 1 && int(q) <= len(c.ds) {
				c.ds[q-1].poke()
			}
		}
	}
}

// refuse stops the look's scans for good if err is Redis refusing cmd (an
// ACL without it, a renamed command), as opposed to a passing error
// (LOADING after a restart, a lost connection).
func (w *IdleWatch) refuse(cmd string, err error) {
	if w.refused || !redis.HasErrorPrefix(err, "NOPERM") && !redis.HasErrorPrefix(err, "ERR unknown command") {
		return
	}
	w.refused = true
	log := w.log
	if log == nil {
		log = slog.Default()
	}
	log.Info("the look at dozing queues asks EXISTS of every set from now on: Redis refused "+cmd+" (grant +scan +dbsize to spare it)", "err", err)
}

// canDoze reports whether the queue may doze: this instance sweeps it, its
// last sweep found every shard empty and its sweeps have stretched to the
// idle interval, and it has nothing claimed, held, publishing or backed
// off.
func (s *Scanner) canDoze(busy bool, outstanding int) bool {
	if s.opt.IdleWatch == nil || busy || outstanding > 0 || !s.quiet || s.role.leading || !s.sweeps() {
		return false
	}
	if s.due.every < s.due.idleEvery() || len(s.due.known) > 0 || len(s.prim.unanswered) > 0 {
		return false
	}
	if s.publishing.Load() > 0 || s.reservedAhead.Load() > 0 || s.hold.len() > 0 || !s.brokerReady() {
		return false
	}
	now := time.Now()
	for i := 0; i < s.opt.Shards; i++ {
		if s.due.aside(i, now) {
			return false
		}
	}
	for _, n := range s.prim.nodes {
		if n.claiming || n.until.After(now) {
			return false
		}
	}
	return true
}

// doze leaves the queue to the IdleWatch until it or a wake-up wakes it,
// or ctx ends; then the queue sweeps every primary and bids for its role
// at once.
func (s *Scanner) doze(ctx context.Context) {
	d := newDozer(s.keys, s.opt.Shards, s.role.leader, s.role.instance, s.role.ttl(), s.brokerReady)
	s.dozing.Store(true) // before add, and false before remove: seen with the watch's count
	s.opt.IdleWatch.add(d)
	s.met.dozing(1)
	select {
	case <-d.nudge:
	case <-s.wake.ch:
	case <-ctx.Done():
	}
	s.dozing.Store(false)
	s.wakes.Add(1)
	s.opt.IdleWatch.remove(d)
	s.met.dozing(0)
	s.quiet = false
	for _, n := range s.prim.nodes {
		n.sweptAt = time.Time{}
	}
	s.role.free()
}
