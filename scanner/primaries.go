package scanner

import (
	"context"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// On Redis Cluster a queue's shards live on several primaries, and each
// may be busy, slow, refusing or gone on its own. What the loop knows of
// each primary, and of the claims on their way to them (their shards, the
// tokens of claims whose answer never came), is kept here: the loop asks
// only which primaries are free and what jobs to send them.

// primaries is the loop's view of the primaries holding the queue's
// shards. Owned by Run's goroutine but for refusal.
type primaries struct {
	rdb     redis.UniversalClient
	keys    shard.Keys
	shards  int           // Options.Shards
	cluster bool          // Redis Cluster: shards live on several primaries
	token   func() string // a new claim token
	met     queueMetrics
	lim     *logLimiter

	nodes      map[string]*nodeState
	addrs      []string       // the primaries holding the queue's shards (cluster)
	addrsAt    time.Time      // when addrs was read
	inClaim    map[int]bool   // shards whose claim is on its way
	unanswered map[int]string // shard -> token of a claim whose answer never came
	refusal    atomic.Value   // string: why Redis refuses the scripts now, "" if it does not
}

func newPrimaries(rdb redis.UniversalClient, keys shard.Keys, shards int, token func() string, met queueMetrics, lim *logLimiter) *primaries {
	_, cluster := rdb.(*redis.ClusterClient)
	return &primaries{rdb: rdb, keys: keys, shards: shards, cluster: cluster, token: token, met: met, lim: lim,
		nodes: map[string]*nodeState{}, inClaim: map[int]bool{}, unanswered: map[int]string{}}
}

// claimJob is one pipelined claim (limit > 0) or sweep (limit 0, reads
// only) of shards that live on one primary.
type claimJob struct {
	node   string // primary's address; "" with one server
	shards []int
	tokens []string // the claim token of each shard
	limit  int
	slots  int       // publish slots held for its batches
	sent   time.Time // when it was launched
	// ahead: a claim of tasks not due yet (look-ahead), which may wait the
	// Coalescer's few ms to share a round trip with other queues' claims.
	ahead bool
	// probe: a sweep that looks with one EXISTS first (nothing was known
	// to be due in the queue: it is likely empty).
	probe bool
	// aheads: per shard, how far ahead of their due time its claim takes
	// tasks (nil or 0: due ones only); reserved: per shard, the room taken
	// in the holder for them (see Scanner.reserveAhead).
	aheads   []time.Duration
	reserved []int
}

// aheadAt is how far ahead the claim of the job's n-th shard looks.
func (j claimJob) aheadAt(n int) time.Duration {
	if n < len(j.aheads) {
		return j.aheads[n]
	}
	return 0
}

// reservedAt is the room in the holder reserved for the job's n-th shard.
func (j claimJob) reservedAt(n int) int {
	if n < len(j.reserved) {
		return j.reserved[n]
	}
	return 0
}

// nodeState is the loop's view of one primary.
type nodeState struct {
	claiming  bool          // a job is running on it
	until     time.Time     // backed off until
	delay     time.Duration // last backoff
	refusal   string        // why it refuses the scripts, "" if it does not
	sweptAt   time.Time     // its shards' last sweep
	full      bool          // its last claim gave a whole batch: more is due
	lastClaim bool          // its last job was a claim (not a sweep)
}

// node returns the loop's state of a primary.
func (p *primaries) node(addr string) *nodeState {
	n := p.nodes[addr]
	if n == nil {
		n = &nodeState{}
		p.nodes[addr] = n
	}
	return n
}

// nodeOf returns the primary that holds shard i ("" with one server).
func (p *primaries) nodeOf(ctx context.Context, i int) string {
	if !p.cluster {
		return ""
	}
	return redisconn.NodeOf(ctx, p.rdb, p.keys.Pending(i))
}

// free reports whether the loop may send a job to a primary now.
func (p *primaries) free(addr string, now time.Time) bool {
	n := p.node(addr)
	return !n.claiming && !now.Before(n.until)
}

// anyFree reports whether some primary may take a job now, so that the
// loop does not pick shards (and, when busy, advance the balancer) only to
// find every primary busy. On a cluster the list of primaries holding the
// queue's shards is read again at most once a second; the state of a
// primary that no longer holds any (failed over, resharded away) is
// dropped, so an old refusal of it is not reported forever.
func (p *primaries) anyFree(ctx context.Context) bool {
	now := time.Now()
	if !p.cluster {
		return p.free("", now)
	}
	if now.Sub(p.addrsAt) > time.Second {
		p.addrsAt = now
		p.addrs = p.addrs[:0]
		for i := 0; i < p.shards; i++ {
			if a := p.nodeOf(ctx, i); !slices.Contains(p.addrs, a) {
				p.addrs = append(p.addrs, a)
			}
		}
		pruned := false
		for a, n := range p.nodes {
			if !n.claiming && !slices.Contains(p.addrs, a) {
				delete(p.nodes, a)
				pruned = pruned || n.refusal != ""
			}
		}
		if pruned {
			p.storeRefusals()
		}
	}
	for _, a := range p.addrs {
		if p.free(a, now) {
			return true
		}
	}
	return false
}

// anyFull reports whether some primary's last claim gave a whole batch.
func (p *primaries) anyFull() bool {
	for _, n := range p.nodes {
		if n.full {
			return true
		}
	}
	return false
}

// slotsPerJob is how many of the held publish slots one primary's claim
// may take: on a cluster an even share, so that a primary that stopped
// answering holds no more than its share while its claim times out.
func (p *primaries) slotsPerJob(held int) int {
	if !p.cluster || len(p.addrs) < 2 {
		return held
	}
	return max(1, (held+len(p.addrs)-1)/len(p.addrs))
}

// jobs groups shards by primary into one job each, leaving out shards
// whose primary is busy with a job or backed off, and at most perJob
// shards per primary (1 while a primary that failed is being probed
// again). Shards come in priority order and keep it.
func (p *primaries) jobs(ctx context.Context, shards []int, limit, perJob int) []claimJob {
	now := time.Now()
	var out []claimJob
	at := map[string]int{}
	for _, i := range shards {
		addr := p.nodeOf(ctx, i)
		// A shard whose claim is still on its way (on a cluster, to a
		// primary it may since have left) is in no other claim: both could
		// carry the token of a lost claim and return the same batch.
		if !p.free(addr, now) || (limit > 0 && p.inClaim[i]) {
			continue
		}
		n, ok := at[addr]
		if !ok {
			n = len(out)
			at[addr] = n
			out = append(out, claimJob{node: addr, limit: limit})
		}
		most := perJob
		if limit > 0 && p.node(addr).delay > 0 {
			most = 1
		}
		if len(out[n].shards) < most {
			out[n].shards = append(out[n].shards, i)
			out[n].tokens = append(out[n].tokens, p.claimToken(i))
		}
	}
	return out
}

// claimToken is the token of the next claim of shard i: the token of a
// claim whose answer never came (a timeout, a lost connection), so that
// if Redis ran it after all (a primary that was stopped runs what it had
// received when it resumes) the claim returns that batch instead of
// leaving it in flight until its lease runs out; a new one otherwise.
func (p *primaries) claimToken(i int) string {
	if t, ok := p.unanswered[i]; ok {
		return t
	}
	return p.token()
}

// started records that job j is sent: its primary is busy until it answers.
func (p *primaries) started(j *claimJob) {
	j.sent = time.Now()
	if j.limit > 0 {
		for _, i := range j.shards {
			p.inClaim[i] = true
		}
	}
	n := p.node(j.node)
	n.lastClaim = j.limit > 0
	n.claiming = true
}

// answered records that job j's answer came (or its round trip failed).
func (p *primaries) answered(j claimJob) {
	p.node(j.node).claiming = false
	if j.limit > 0 {
		for _, i := range j.shards {
			delete(p.inClaim, i)
		}
	}
}

// settleToken decides, from a claim's answer, what token shard i's next
// claim carries. No answer (a timeout, a lost connection): Redis may have
// run the claim, so the next one carries its token and returns its batch.
// Only an answer that shows the script compared the token ends that: an
// error answer (LOADING, NOPERM, MOVED, a wrong-type key, ...) or "paused"
// means it did not run that far, and a lost claim's token is kept for the
// claim after it; else its batch would wait out its lease. lost reports
// that the claim went unanswered.
func (p *primaries) settleToken(i int, token string, vals []any, err error) (lost bool) {
	if err != nil && !isReply(err) {
		p.unanswered[i] = token
		return true
	}
	if err != nil {
		return false
	}
	if c, perr := parseClaimed(vals); perr == nil && !c.paused {
		delete(p.unanswered, i)
	}
	return false
}

// lost reports whether shard i's last claim went unanswered: it is
// claimed again at once, with that claim's token.
func (p *primaries) lost(i int) bool {
	_, ok := p.unanswered[i]
	return ok
}

// nodeTrouble logs a primary's failure (rate-limited) and backs that
// primary off: only its shards wait.
func (p *primaries) nodeTrouble(ctx context.Context, addr string, err error) {
	if ctx.Err() != nil {
		return
	}
	n := p.node(addr)
	n.delay = min(max(2*n.delay, 50*time.Millisecond), 2*time.Second)
	n.until = time.Now().Add(n.delay)
	p.met.error("redis", 1)
	p.reloadSlots()
	// One log key per kind of trouble, so that a LOADING after a lost
	// connection is not held back as a repeat of it.
	class := redisErrorClass(err)
	args := []any{"err", err}
	if addr != "" {
		args = append(args, "primary", addr)
	}
	if hint, ok := redisHints[class]; ok {
		args = append(args, "hint", hint)
	}
	p.lim.Warn("redis:"+addr+":"+class, "redis unavailable; retrying", args...)
	if class != "conn" {
		why := class
		if hint, ok := redisHints[class]; ok {
			why += ": " + hint
		}
		if addr != "" {
			why = addr + ": " + why
		}
		n.refusal = why
		p.storeRefusals()
	}
}

// nodeFine clears a primary's backoff and refusal after a good answer.
func (p *primaries) nodeFine(addr string) {
	n := p.node(addr)
	n.delay, n.until = 0, time.Time{}
	if n.refusal != "" {
		n.refusal = ""
		p.storeRefusals()
	}
}

// storeRefusals gathers the primaries' refusals for RedisRefusal.
func (p *primaries) storeRefusals() {
	var whys []string
	for _, n := range p.nodes {
		if n.refusal != "" {
			whys = append(whys, n.refusal)
		}
	}
	sort.Strings(whys)
	p.refusal.Store(strings.Join(whys, "; "))
}

// refused says why Redis refuses the scripts now, "" if it does not.
func (p *primaries) refused() string {
	why, _ := p.refusal.Load().(string)
	return why
}

// scripter is where to load a script for a job: its own primary. A cluster
// client would load it on every node, replicas included, and one node that
// is down would keep a healthy primary from getting it.
func (p *primaries) scripter(ctx context.Context, j claimJob) redis.Scripter {
	if cc, ok := p.rdb.(*redis.ClusterClient); ok && len(j.shards) > 0 {
		if c, err := cc.MasterForKey(ctx, p.keys.Pending(j.shards[0])); err == nil {
			return c
		}
	}
	return p.rdb
}

// reloadSlots has a cluster client read the slot map again (in the
// background): go-redis reads it every minute and on MOVED, but a
// pipeline to a primary that died only fails to dial, and its replica's
// promotion would otherwise go unnoticed for up to a minute.
func (p *primaries) reloadSlots() {
	if cc, ok := p.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}
