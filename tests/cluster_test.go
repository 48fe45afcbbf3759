package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/liveness"
	"github.com/dispatcher/dispatcher/internal/testenv"
	"github.com/dispatcher/dispatcher/shard"
)

// The tests here run dispatchers on private Redis Clusters (3 primaries,
// 3 replicas) and Sentinel set-ups that they start, break and tear down.

// newClusterHarness is a harness whose producers, leftovers and daemons
// use the cluster c.
func newClusterHarness(t *testing.T, c *testenv.RedisCluster, queues ...queueSpec) *harness {
	h := newHarnessOn(t, c.Client(), queues...)
	h.extra["DISPATCHER_REDIS_URL"] = c.URL()
	return h
}

// waitReplicated makes every primary wait until its replica has every
// write so far, so a failover loses none of the tasks scheduled before it.
func waitReplicated(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	wait := func(ctx context.Context, c *redis.Client) error {
		n, err := c.Do(ctx, "WAIT", 1, 5000).Int()
		if err == nil && n < 1 {
			err = fmt.Errorf("WAIT on %s: %d replicas acknowledged", c.Options().Addr, n)
		}
		return err
	}
	var err error
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, wait)
	} else {
		err = wait(ctx, rdb.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// shardsByPrimary maps each primary's address to the shards of q it holds.
func shardsByPrimary(c *testenv.RedisCluster, prefix string, q queueSpec) map[string][]int {
	keys := shard.Keys{Prefix: prefix, Queue: q.Name}
	out := map[string][]int{}
	for i := 0; i < q.Shards; i++ {
		p := c.PrimaryOfSlot(keys.ShardSlot(i))
		out[p.Addr] = append(out[p.Addr], i)
	}
	return out
}

// TestClusterDispatch: three dispatchers, two queues of 16 shards, 30,000
// tasks on a cluster of three primaries: every task delivered once and
// never early, and every primary held and served some of the shards.
func TestClusterDispatch(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	qs := []queueSpec{{Name: "alpha", Shards: 16}, {Name: "beta", Shards: 16}}
	h := newClusterHarness(t, c, qs...)
	ps := []*proc{h.start(), h.start(), h.start()}

	from := time.Now().Add(2 * time.Second)
	want := map[string]map[string]int64{}
	for _, q := range qs {
		want[q.Name] = scheduleSpread(t, h.producer(q.Name), "c-"+q.Name, 15000, from, 4*time.Second)
	}
	// Every primary holds scheduled tasks of both queues.
	ctx := context.Background()
	for _, q := range qs {
		keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
		for addr, shards := range shardsByPrimary(c, h.prefix, q) {
			var n int64
			for _, i := range shards {
				n += h.rdb.ZCard(ctx, keys.Pending(i)).Val()
			}
			t.Logf("queue %s: primary %s holds shards %v with %d tasks", q.Name, addr, shards, n)
			if n == 0 {
				t.Errorf("queue %s: primary %s holds no task", q.Name, addr)
			}
		}
		if got := len(shardsByPrimary(c, h.prefix, q)); got != 3 {
			t.Errorf("queue %s spreads over %d primaries, want 3", q.Name, got)
		}
	}

	// dispatcher stats reads every shard on every primary.
	clusterStats := func() map[string]int64 {
		out, errOut, code := runCLI(t, h.env(), "stats", "--json")
		var doc struct {
			Queues []struct {
				Queue   string `json:"queue"`
				Pending int64  `json:"pending"`
				Broken  int    `json:"broken_shards"`
				Shards  []any  `json:"shards"`
			} `json:"queues"`
		}
		if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
			t.Fatalf("stats on the cluster: exit %d, %v, %s", code, err, errOut)
		}
		pending := map[string]int64{}
		for _, q := range doc.Queues {
			if q.Broken != 0 || len(q.Shards) != 16 {
				t.Errorf("stats on the cluster: queue %s has %d broken of %d shards", q.Queue, q.Broken, len(q.Shards))
			}
			pending[q.Queue] = q.Pending
		}
		return pending
	}
	if p := clusterStats(); !time.Now().Before(from) {
		t.Logf("stats on the cluster ran past the first due time (machine slow): pending %v not checked", p)
	} else if p["alpha"] != 15000 || p["beta"] != 15000 {
		t.Errorf("stats on the cluster before anything was due: pending %v, want 15000 each", p)
	}

	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Add(1)
		go func() { defer wg.Done(); h.verify(q.Name, want[q.Name], 60*time.Second, 0) }()
	}
	wg.Wait()
	for _, q := range qs {
		if p, f, d := h.leftovers(q); p+f+d != 0 {
			t.Errorf("queue %s left pending %d, in flight %d, dead %d", q.Name, p, f, d)
		}
	}
	if p := clusterStats(); p["alpha"] != 0 || p["beta"] != 0 {
		t.Errorf("stats on the cluster after delivery: pending %v, want 0", p)
	}
	// Each instance says where the shards are.
	for _, p := range ps[:1] {
		out := p.out.String()
		for _, prim := range c.Primaries() {
			if !strings.Contains(out, "primary="+prim.Addr) {
				t.Errorf("start-up log names no shards on primary %s:\n%s", prim.Addr, tail(out, 3000))
			}
		}
	}
}

// TestClusterFailover: a primary is replaced under traffic, by CLUSTER
// FAILOVER on its replica and by SIGKILL with the replica promoted after
// cluster-node-timeout. Every task scheduled before (and confirmed by
// WAIT) arrives; duplicates and lateness are measured.
func TestClusterFailover(t *testing.T) {
	for _, how := range []string{"manual", "kill"} {
		t.Run(how, func(t *testing.T) {
			c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
			q := queueSpec{Name: "fo", Shards: 16}
			h := newClusterHarness(t, c, q)
			h.extra["DISPATCHER_LEASE"] = "5s"
			h.start()
			h.start()
			from := time.Now().Add(time.Second)
			want := scheduleSpread(t, h.producer(q.Name), "fo", 8000, from, 8*time.Second)
			waitReplicated(t, h.rdb)

			// The killed primary also holds the queue-level keys (sweeper
			// role, balancer counter, wake channel): the worst case.
			keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
			victim := c.PrimaryOfSlot(keys.ShardSlot(0))
			if how == "kill" {
				victim = c.PrimaryOf(keys.Sweeper())
			}
			holdsQueueKeys := c.PrimaryOf(keys.Sweeper()).Addr == victim.Addr
			o := verifyWhile(h, q.Name, want, 90*time.Second, len(want), func() {
				time.Sleep(time.Until(from.Add(3 * time.Second)))
				began := time.Now()
				switch how {
				case "manual":
					c.Failover(c.ReplicaOf(victim))
				case "kill":
					c.KillPrimary(victim)
					c.WaitPromoted(victim, 30*time.Second)
				}
				t.Logf("primary %s (queue-level keys too: %v) replaced in %s", victim.Addr, holdsQueueKeys, time.Since(began).Round(time.Millisecond))
			})
			if o.WorstLate > 30*time.Second {
				t.Errorf("worst lateness %s: the promoted primary's shards were not picked up", o.WorstLate)
			}
			eventually(t, 30*time.Second, "nothing left in Redis", func() bool {
				p, f, d := h.leftovers(q)
				return p+f+d == 0
			})
		})
	}
}

// TestClusterReshard moves the slots of four shards to other primaries,
// key batch by key batch, while their tasks fall due: the scripts meet
// ASK, TRYAGAIN and MOVED, and nothing is lost or sent twice.
func TestClusterReshard(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{})
	q := queueSpec{Name: "moving", Shards: 16}
	h := newClusterHarness(t, c, q)
	h.start()
	h.start()
	from := time.Now().Add(time.Second)
	want := scheduleSpread(t, h.producer(q.Name), "mv", 6000, from, 8*time.Second)
	keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	verifyWhile(h, q.Name, want, 60*time.Second, 0, func() {
		time.Sleep(time.Until(from.Add(time.Second)))
		for _, i := range []int{0, 5, 10, 15} {
			slot := keys.ShardSlot(i)
			src := c.PrimaryOfSlot(slot)
			var dst *testenv.ClusterNode
			for _, p := range c.Primaries() {
				if p.Addr != src.Addr {
					dst = p
					break
				}
			}
			began := time.Now()
			if err := c.MigrateSlotSlowly(context.Background(), slot, dst, 100*time.Millisecond); err != nil {
				t.Errorf("migrate slot %d of shard %d: %v", slot, i, err)
				return
			}
			t.Logf("shard %d (slot %d) moved %s -> %s in %s", i, slot, src.Addr, dst.Addr, time.Since(began).Round(time.Millisecond))
		}
	})
	if p, f, d := h.leftovers(q); p+f+d != 0 {
		t.Errorf("left pending %d, in flight %d, dead %d", p, f, d)
	}
}

// TestClusterPrimaryPaused stops one primary (SIGSTOP) for 10 s while tasks
// fall due on every shard. Only its shards wait: the others' tasks keep
// their lateness (the figures are logged; the bound checked is far above
// them and far below the pause), even though the liveness records wait
// too. Two instances run, so the one that does
// not sweep must not take over nor stall while the role's key is out of
// reach. The node timeout is long, so no failover
// muddles what is measured.
func TestClusterPrimaryPaused(t *testing.T) {
	c := testenv.StartRedisCluster(t, testenv.ClusterOptions{NodeTimeout: 30 * time.Second})
	q := queueSpec{Name: "paused", Shards: 16}
	h := newClusterHarness(t, c, q)
	// The paused primary holds the queue-level keys too (sweeper role,
	// balancer counter, wake channel) and the liveness records: the worst
	// case.
	keys := shard.Keys{Prefix: h.prefix, Queue: q.Name}
	paused := c.PrimaryOf(keys.Sweeper())
	if live := liveness.Key(h.prefix); c.PrimaryOf(live).Addr != paused.Addr {
		if err := c.MigrateSlot(context.Background(), c.Slot(live), paused); err != nil {
			t.Fatalf("move %s to %s: %v", live, paused.Addr, err)
		}
	}
	addr := testenv.FreeAddr(t)
	h.extra["DISPATCHER_HTTP_ADDR"] = addr
	h.start()
	delete(h.extra, "DISPATCHER_HTTP_ADDR")
	h.start()
	from := time.Now().Add(time.Second)
	const n, span = 3000, 16 * time.Second
	want := scheduleSpread(t, h.producer(q.Name), "ps", n, from, span)
	onPaused := map[int]bool{}
	for _, i := range shardsByPrimary(c, h.prefix, q)[paused.Addr] {
		onPaused[i] = true
	}
	pauseAt := from.Add(3 * time.Second)
	// Longer than a claim's time limit several times over: a primary that
	// stopped answering must not take the publish slots from the others
	// while its claims time out and are retried.
	const pause = 10 * time.Second

	var got []received
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); got = h.collect(q.Name, n, 60*time.Second) }()
	time.Sleep(time.Until(pauseAt))
	c.Pause(paused)
	resumeAt := time.Now().Add(pause)
	// /readyz names the primary that does not answer.
	code, body := 0, ""
	for time.Now().Before(resumeAt.Add(-time.Second)) {
		if code, body = readyz(addr); code == http.StatusServiceUnavailable && strings.Contains(body, paused.Addr) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != http.StatusServiceUnavailable || !strings.Contains(body, paused.Addr) {
		t.Errorf("/readyz while %s was paused: %d %q, want 503 naming it", paused.Addr, code, body)
	}
	time.Sleep(time.Until(resumeAt))
	c.Resume(paused)
	resumed := time.Now()
	eventually(t, 10*time.Second, "/readyz to say ready after the resume", func() bool { return readyStatus(addr) == http.StatusOK })
	t.Logf("/readyz named %s while paused (%q); ready again %s after the resume", paused.Addr, strings.TrimSpace(body), time.Since(resumed).Round(time.Millisecond))
	wg.Wait()

	ids, dups := countIDs(got)
	if miss := missing(want, ids); len(miss) > 0 || dups > 0 {
		t.Fatalf("%d missing, %d duplicates", len(miss), dups)
	}
	// Lateness of the tasks due while the primary was paused, split by
	// where their shard lives; and of the others' tasks before the pause.
	var before, others, own []time.Duration
	seen := map[string]bool{}
	for _, r := range got {
		if seen[r.d.MessageId] {
			continue
		}
		seen[r.d.MessageId] = true
		due := time.UnixMilli(want[r.d.MessageId])
		late := r.at.Sub(due)
		i := shard.Index(r.d.Body, q.Shards)
		switch {
		case due.Before(pauseAt) && !onPaused[i]:
			before = append(before, late)
		case due.Before(pauseAt) || due.After(pauseAt.Add(pause)):
		case onPaused[i]:
			own = append(own, late)
		default:
			others = append(others, late)
		}
	}
	t.Logf("primary %s (shards %v) paused %s", paused.Addr, sortedShards(onPaused), pause)
	t.Logf("other primaries' tasks before the pause: %s", latencies(before))
	t.Logf("other primaries' tasks during the pause: %s", latencies(others))
	t.Logf("paused primary's tasks during the pause: %s", latencies(own))
	if len(others) == 0 || len(own) == 0 {
		t.Fatalf("no tasks to compare: %d on others, %d on the paused primary", len(others), len(own))
	}
	if worst := slices.Max(others); worst > time.Second {
		t.Errorf("a task of another primary's shard was %s late while %s was paused: the failure did not stay local", worst, paused.Addr)
	}
	// The paused primary runs the claims it had received when it resumes,
	// after the dispatcher gave up on their answers: claiming again with
	// the same token returns those batches, rather than leaving them in
	// flight until their lease (30 s) runs out.
	if worst := slices.Max(own); worst > pause+5*time.Second {
		t.Errorf("a task of the paused primary's shards was %s late after a %s pause: claims answered after their timeout waited for their lease", worst, pause)
	}
}

func sortedShards(m map[int]bool) []int {
	var out []int
	for i := range m {
		out = append(out, i)
	}
	sort.Ints(out)
	return out
}

// latencies summarises lateness: count, p50, p99, max.
func latencies(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	p := func(f float64) time.Duration { return s[int(f*float64(len(s)-1))].Round(100 * time.Microsecond) }
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", len(s), p(0.5), p(0.99), s[len(s)-1].Round(100*time.Microsecond))
}

// TestSentinelFailover: the primary behind Sentinel is SIGKILLed under
// traffic; the dispatcher follows the promotion of its replica and every
// task scheduled before (and confirmed by WAIT) arrives.
func TestSentinelFailover(t *testing.T) {
	s := testenv.StartRedisSentinel(t, testenv.SentinelOptions{})
	q := queueSpec{Name: "sent", Shards: 8}
	h := newHarnessOn(t, s.Client(), q)
	h.extra["DISPATCHER_REDIS_URL"] = s.URL()
	h.extra["DISPATCHER_LEASE"] = "5s"
	h.start()
	h.start()
	from := time.Now().Add(time.Second)
	want := scheduleSpread(t, h.producer(q.Name), "st", 5000, from, 8*time.Second)
	waitReplicated(t, h.rdb)
	o := verifyWhile(h, q.Name, want, 90*time.Second, len(want), func() {
		time.Sleep(time.Until(from.Add(3 * time.Second)))
		began := time.Now()
		old := s.KillPrimary()
		s.WaitFailover(old.Addr(), 60*time.Second)
		t.Logf("sentinels promoted the replica %s after the kill", time.Since(began).Round(time.Millisecond))
	})
	if o.WorstLate > 30*time.Second {
		t.Errorf("worst lateness %s: the dispatcher did not follow the promotion", o.WorstLate)
	}
	eventually(t, 30*time.Second, "nothing left in Redis", func() bool {
		p, f, d := h.leftovers(q)
		return p+f+d == 0
	})
}
