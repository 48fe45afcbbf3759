package bench

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
)

// BurstResult is what a burst point measured besides a backlog's figures:
// N tasks share one due time, the instances are running when it comes,
// and meanwhile a producer ZADDs and an operator reads `stats` on the same
// Redis, as users do when a million jobs fall due at 3:30 pm.
type BurstResult struct {
	DueMs int64 `json:"due_ms"` // the one due time (Redis clock)
	// DrainSeconds is from the due time to the last receipt;
	// DrainPerSec the tasks received per second over it.
	DrainSeconds float64 `json:"drain_seconds"`
	DrainPerSec  float64 `json:"drain_per_sec"`
	// PerSecond counts the receipts in each second after the due time;
	// with -max-rate it shows whether the limit held.
	PerSecond []int `json:"per_second"`
	MaxRate   int   `json:"max_rate,omitempty"`
	// Producer is the latency of a producer's single ZADD (one round
	// trip, far-future task) during the drain, Before the same in the 2 s
	// before the due time; Stats of the read `dispatcher stats` does.
	Producer Probe `json:"producer_zadd"`
	Before   Probe `json:"producer_zadd_before"`
	Stats    Probe `json:"stats_read"`
	// Slow counts what Redis's SLOWLOG recorded over SlowUs during the
	// drain: calls (a script, and on Redis 7 each command inside it too)
	// that held the server that long; SlowMaxMs the longest, SlowBy the
	// count per command (scripts by their first key's role).
	SlowUs    int64          `json:"slowlog_threshold_us"`
	Slow      int            `json:"slow_calls"`
	SlowMaxMs float64        `json:"slow_max_ms"`
	SlowBy    map[string]int `json:"slow_by_command,omitempty"`
	// SlowNote says why the slow-log figures are missing, if they are.
	SlowNote string `json:"slow_note,omitempty"`
}

// Probe is a latency distribution of one kind of call, in ms.
type Probe struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func probeOf(us []int32) Probe {
	if len(us) == 0 {
		return Probe{}
	}
	d := distNoCurve(us)
	return Probe{Count: len(us), P50: d.P50, P99: d.P99, Max: d.Max}
}

// slowThresholdUs: what the burst counts as holding Redis too long.
const slowThresholdUs = 1000

// runBurst: N tasks due at one time, K instances running when it comes.
func (r *runner) runBurst(ctx context.Context, p Point) (*Result, error) {
	c, err := r.ceiling(ctx, p)
	if err != nil {
		return nil, err
	}
	m, err := r.newMeasurement(p, p.Backlog)
	if err != nil {
		return nil, err
	}
	defer m.close()
	// The due time leaves room for the load (this machine loads some
	// 100,000 tasks/s) and the instances' start.
	lead := time.Duration(r.opt.BurstLead)
	if lead == 0 {
		lead = 10*time.Second + time.Duration(p.Backlog/50_000)*time.Second
	}
	offset := time.Duration(r.rep.ClockOffsetUs) * time.Microsecond
	due := time.Now().Add(offset + lead).UnixMilli() // on Redis's clock
	var loaded atomic.Int64
	stop := r.prog.start(func() string {
		return fmt.Sprintf("%s: loading %s/%s", p, thousands(int(loaded.Load())), thousands(p.Backlog))
	})
	began := time.Now()
	err = load(ctx, r.rdb, m.keys, p, 0, p.Backlog, func(int) int64 { return due }, &loaded)
	stop()
	m.res.LoadSeconds = time.Since(began).Seconds()
	if err != nil {
		return m.res, err
	}
	dueLocal := time.UnixMilli(due).Add(-offset)
	if time.Until(dueLocal) < 3*time.Second { // the start, then 2 s of baseline
		return m.res, fmt.Errorf("loading took %.1fs, too close to the due time: give a longer -burst-lead than %s", m.res.LoadSeconds, lead)
	}
	if m.fleet, err = startFleet(ctx, m.spec(), p.Instances); err != nil {
		return m.res, err
	}
	if err := m.fleet.waitReady(ctx); err != nil {
		return m.res, err
	}
	cpu0, err := m.startUsage()
	if err != nil {
		return m.res, err
	}
	if !sleepCtx(ctx, time.Until(dueLocal)-2*time.Second) {
		return m.res, ctx.Err()
	}
	br := &BurstResult{DueMs: due, MaxRate: r.opt.MaxRate, SlowUs: slowThresholdUs}
	restore, err := r.slowLogOn(ctx)
	if err != nil {
		br.SlowNote = err.Error()
	} else {
		defer restore() // on every return: the server's settings are not the bench's
	}
	before, err := readCmdStats(ctx, r.rdb)
	if err != nil {
		return m.res, err
	}
	// The probes run in a process of their own, as a producer does (and
	// on the CPUs -probe-cpus gives): in the bench's, they would wait for
	// its consumer's CPU as much as for Redis.
	pr, err := r.startProbe(m, due+3_600_000, dueLocal)
	if err != nil {
		return m.res, err
	}
	waitErr := m.wait(ctx, nil)
	probed, probeErr := pr.stop()
	if restore != nil {
		br.Slow, br.SlowMaxMs, br.SlowBy, err = r.slowLogRead(ctx, dueLocal)
		if err != nil {
			br.SlowNote = err.Error()
		}
	}
	if waitErr != nil {
		return m.res, waitErr
	}
	if probeErr != nil {
		return m.res, probeErr
	}
	if err := m.finish(ctx, before, zaddsOnly(probed.zadds), cpu0, began); err != nil {
		return m.res, err
	}
	br.Producer, br.Before, br.Stats = probeOf(probed.during), probeOf(probed.before), probeOf(probed.stats)
	// One due time: each receipt's lateness is its time after the due time.
	last := slices.Max(append([]int32{0}, m.rec.late...))
	br.DrainSeconds = float64(last) / 1e6
	if br.DrainSeconds > 0 {
		br.DrainPerSec = float64(m.res.Delivered) / br.DrainSeconds
	}
	br.PerSecond = make([]int, last/1_000_000+1)
	for _, us := range m.rec.late {
		if us >= 0 {
			br.PerSecond[us/1_000_000]++
		}
	}
	m.res.Burst = br
	m.res.Ceiling = c.PerSec
	if c.PerSec > 0 {
		m.res.Ratio = br.DrainPerSec / c.PerSec
	}
	return m.res, nil
}

// slowLogOn makes every primary log calls over slowThresholdUs and empties
// its slow log; restore puts the settings back.
func (r *runner) slowLogOn(ctx context.Context) (restore func(), err error) {
	type was struct {
		c               *redis.Client
		slower, longest string
	}
	var mu sync.Mutex
	var olds []was
	restore = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, o := range olds {
			o.c.ConfigSet(ctx, "slowlog-log-slower-than", o.slower)
			o.c.ConfigSet(ctx, "slowlog-max-len", o.longest)
		}
	}
	err = redisconn.ForEachPrimary(ctx, r.rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		got, err := c.ConfigGet(ctx, "slowlog-*").Result()
		if err != nil {
			return fmt.Errorf("%s: CONFIG GET: %w", addr, err)
		}
		if err := c.ConfigSet(ctx, "slowlog-log-slower-than", strconv.Itoa(slowThresholdUs)).Err(); err != nil {
			return fmt.Errorf("%s: CONFIG SET: %w", addr, err)
		}
		mu.Lock()
		olds = append(olds, was{c, got["slowlog-log-slower-than"], got["slowlog-max-len"]})
		mu.Unlock()
		if err := c.ConfigSet(ctx, "slowlog-max-len", "100000").Err(); err != nil {
			return fmt.Errorf("%s: CONFIG SET: %w", addr, err)
		}
		return c.SlowLogReset(ctx).Err()
	})
	if err != nil {
		restore()
		return nil, fmt.Errorf("no slow-log figures: %w", err)
	}
	return restore, nil
}

// slowLogRead reads what every primary's slow log holds from since on.
func (r *runner) slowLogRead(ctx context.Context, since time.Time) (n int, maxMs float64, by map[string]int, err error) {
	var mu sync.Mutex
	by = map[string]int{}
	err = redisconn.ForEachPrimary(ctx, r.rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		logs, err := c.SlowLogGet(ctx, 100000).Result()
		if err != nil {
			return fmt.Errorf("%s: SLOWLOG GET: %w", addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, l := range logs {
			if l.Time.Before(since.Add(-time.Second)) {
				continue
			}
			// Redis 7 also logs the commands a script ran (client "?:0"):
			// they are inside the script's time, not more of it.
			if l.ClientAddr == "?:0" {
				by["(in a script) "+strings.ToLower(l.Args[0])]++
				continue
			}
			n++
			maxMs = max(maxMs, float64(l.Duration.Microseconds())/1000)
			by[slowName(l.Args)]++
		}
		return nil
	})
	return n, maxMs, by, err
}

// slowName names a slow call: the command, and for a script the roles of
// its keys, which tell the scripts apart: "evalsha [pending inflight
// attempts claim paused]" is the claim.
func slowName(args []string) string {
	if len(args) == 0 {
		return "?"
	}
	name := strings.ToLower(args[0])
	if name != "evalsha" && name != "eval" || len(args) < 3 {
		return name
	}
	n, err := strconv.Atoi(args[2])
	if err != nil {
		return name
	}
	var roles []string
	for _, k := range args[3:min(len(args), 3+n)] {
		role := "pending"
		if j := strings.LastIndexByte(k, '}'); j >= 0 && j+1 < len(k) {
			role = strings.TrimPrefix(k[j+1:], ":")
		}
		roles = append(roles, role)
	}
	return name + " [" + strings.Join(roles, " ") + "]"
}

// burstText is the one-line summary of a burst point.
func burstText(b *BurstResult) string {
	if b == nil {
		return ""
	}
	peak := 0
	secs := append([]int(nil), b.PerSecond...)
	sort.Ints(secs)
	if len(secs) > 0 {
		peak = secs[len(secs)-1]
	}
	slow := fmt.Sprintf("%d Redis calls over %d ms (longest %.1f ms)", b.Slow, b.SlowUs/1000, b.SlowMaxMs)
	if b.SlowNote != "" {
		slow = b.SlowNote
	}
	return fmt.Sprintf("\n     drained in %.1fs (%s/s, busiest second %s); producer ZADD p50/p99/max %.2f/%.2f/%.2f ms (before: %.2f/%.2f/%.2f); stats read %.1f/%.1f/%.1f ms; %s",
		b.DrainSeconds, thousands(int(b.DrainPerSec)), thousands(peak),
		b.Producer.P50, b.Producer.P99, b.Producer.Max, b.Before.P50, b.Before.P99, b.Before.Max,
		b.Stats.P50, b.Stats.P99, b.Stats.Max, slow)
}
