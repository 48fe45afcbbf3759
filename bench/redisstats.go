package bench

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
)

// cmdStats is Redis's INFO commandstats: calls per command name. Redis
// counts every command it executes, those run by Lua scripts included.
type cmdStats map[string]int64

// primaryStats is one primary's counters at one time: its commandstats
// and its CPU (INFO cpu: used_cpu_sys + used_cpu_user, seconds; hasCPU
// false when the section could not be read).
type primaryStats struct {
	calls  cmdStats
	cpuSec float64
	hasCPU bool
}

// redisSnap is the primaryStats of every primary, by its address: the one
// server, or each master of a cluster.
type redisSnap map[string]primaryStats

// benchOwn are commands only the bench sends during a measurement (its
// snapshots); they are left out of every count.
var benchOwn = map[string]bool{"info": true, "client|list": true}

// replication are the commands a primary's replicas send it (a cluster's
// replicas ack every second); they are not the dispatchers' and are left
// out too.
var replication = map[string]bool{"replconf": true, "psync": true, "sync": true}

// scriptCmds are the commands that run a script: one per script call.
var scriptCmds = map[string]bool{"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true}

// readCmdStats reads INFO commandstats and INFO cpu of every primary (two
// calls: Redis before 7 takes one section per INFO). A managed Redis may
// refuse the cpu section; then the CPU figures are left out, not failed.
func readCmdStats(ctx context.Context, rdb redis.UniversalClient) (redisSnap, error) {
	var mu sync.Mutex
	snap := redisSnap{}
	err := redisconn.ForEachPrimary(ctx, rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			return fmt.Errorf("redis INFO commandstats on %s: %w", addr, err)
		}
		st := primaryStats{calls: parseCmdStats(info)}
		if cpu, err := c.Info(ctx, "cpu").Result(); err == nil {
			st.cpuSec, st.hasCPU = parseCPU(cpu)
		}
		mu.Lock()
		defer mu.Unlock()
		snap[addr] = st
		return nil
	})
	if err != nil {
		return nil, err
	}
	return snap, nil
}

// parseCmdStats reads lines such as
// cmdstat_zadd:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0
func parseCmdStats(info string) cmdStats {
	out := cmdStats{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err == nil {
					out[strings.TrimPrefix(name, "cmdstat_")] = n
				}
			}
		}
	}
	return out
}

// parseCPU reads used_cpu_sys + used_cpu_user (seconds) of INFO cpu;
// ok is false unless both are there.
func parseCPU(info string) (float64, bool) {
	var sum float64
	found := 0
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok || (name != "used_cpu_sys" && name != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, false
		}
		sum += f
		found++
	}
	return sum, found == 2
}

// RedisUse is what the dispatchers cost Redis over one measurement: on a
// cluster, the sum over every primary.
type RedisUse struct {
	// Commands is every command Redis executed, those run inside Lua
	// scripts included (that is how Redis counts them, and it is the
	// server's work), without the bench's own and the replicas'.
	Commands int64 `json:"commands"`
	// ScriptCalls is the EVAL/EVALSHA calls among them.
	ScriptCalls int64 `json:"script_calls"`
	// ByCommand breaks Commands down by command name.
	ByCommand map[string]int64 `json:"by_command"`
	// Subtracted is what the bench itself sent (the rate mode's ZADDs).
	Subtracted map[string]int64 `json:"subtracted,omitempty"`
	// OtherClients counts clients that are neither the bench nor its
	// dispatchers (nor a replica) and sent commands during the
	// measurement: their commands are in the figures too.
	OtherClients int     `json:"other_clients"`
	Seconds      float64 `json:"seconds"`
	// CPUSeconds is Redis's CPU over the measurement (INFO cpu,
	// used_cpu_sys + used_cpu_user): everything the server did, whoever
	// asked, the bench's own INFO calls included. CPUPercent is that as
	// % of one core. Null when a primary would not tell.
	CPUSeconds *float64 `json:"cpu_seconds"`
	CPUPercent *float64 `json:"cpu_percent"`
	// Primaries breaks the figures down by primary, ordered by address:
	// the one server (with Sentinel, the primary), or each master of a
	// cluster.
	Primaries []*PrimaryUse `json:"primaries"`
}

// PrimaryUse is one primary's share of a RedisUse.
type PrimaryUse struct {
	Addr string `json:"addr"`
	// Shards is how many of the point's shards the primary holds.
	Shards       int              `json:"shards"`
	Commands     int64            `json:"commands"`
	ScriptCalls  int64            `json:"script_calls"`
	ByCommand    map[string]int64 `json:"by_command"`
	Subtracted   map[string]int64 `json:"subtracted,omitempty"`
	OtherClients int              `json:"other_clients"`
	// CmdsPerTask is Commands per task delivered (backlog and rate
	// modes); CmdsPerSec per second of the measurement.
	CmdsPerTask float64 `json:"cmds_per_task,omitempty"`
	CmdsPerSec  float64 `json:"cmds_per_sec"`
	// CPUSeconds is the primary's CPU over the measurement (null when
	// it would not tell), CPUPercent that as % of one core.
	CPUSeconds *float64 `json:"cpu_seconds"`
	CPUPercent *float64 `json:"cpu_percent"`
}

// redisUse is after minus before, primary by primary and summed, without
// the bench's own commands and the replicas', and minus own (by primary:
// commands the bench sent on purpose). A primary missing from before
// (promoted during the measurement) counts from its start.
//
// CPU is after minus before too, summed over the primaries; it is left
// out (nil) when any primary's is unknown.
func redisUse(before, after redisSnap, own map[string]map[string]int64) RedisUse {
	u := RedisUse{ByCommand: map[string]int64{}}
	addrs := slices.Sorted(maps.Keys(after))
	cpuKnown, cpu := len(addrs) > 0, 0.0
	for _, addr := range addrs {
		b, a := before[addr], after[addr]
		p := primaryUse(b.calls, a.calls, own[addr])
		p.Addr = addr
		_, hadBefore := before[addr]
		if a.hasCPU && (b.hasCPU || !hadBefore) {
			d := max(a.cpuSec-b.cpuSec, 0)
			p.CPUSeconds = &d
			cpu += d
		} else {
			cpuKnown = false
		}
		u.Primaries = append(u.Primaries, p)
		u.Commands += p.Commands
		u.ScriptCalls += p.ScriptCalls
		for name, n := range p.ByCommand {
			u.ByCommand[name] += n
		}
		for name, n := range p.Subtracted {
			if u.Subtracted == nil {
				u.Subtracted = map[string]int64{}
			}
			u.Subtracted[name] += n
		}
	}
	if cpuKnown {
		u.CPUSeconds = &cpu
	}
	return u
}

// setSeconds sets the measurement's length and the per-second figures
// that follow from it.
func (u *RedisUse) setSeconds(sec float64) {
	u.Seconds = sec
	if sec <= 0 {
		return
	}
	pct := func(cpu *float64) *float64 {
		if cpu == nil {
			return nil
		}
		v := *cpu / sec * 100
		return &v
	}
	u.CPUPercent = pct(u.CPUSeconds)
	for _, pu := range u.Primaries {
		pu.CmdsPerSec = float64(pu.Commands) / sec
		pu.CPUPercent = pct(pu.CPUSeconds)
	}
}

// primaryUse is one primary's after minus before, minus own.
func primaryUse(before, after cmdStats, own map[string]int64) *PrimaryUse {
	p := &PrimaryUse{ByCommand: map[string]int64{}}
	if len(own) > 0 {
		p.Subtracted = own
	}
	for name, n := range after {
		if benchOwn[name] || replication[name] {
			continue
		}
		d := n - before[name] - own[name]
		if d <= 0 {
			continue
		}
		p.ByCommand[name] = d
		p.Commands += d
		if scriptCmds[name] {
			p.ScriptCalls += d
		}
	}
	return p
}

// otherClients counts, on every primary by address, the clients whose
// name does not start with ours and that ran a command within the last
// since.
func otherClients(ctx context.Context, rdb redis.UniversalClient, ours string, since time.Duration) (map[string]int, error) {
	var mu sync.Mutex
	out := map[string]int{}
	err := redisconn.ForEachPrimary(ctx, rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return fmt.Errorf("redis CLIENT LIST on %s: %w", addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		out[addr] = countOthers(list, ours, since)
		return nil
	})
	return out, err
}

// countOthers counts the clients of one CLIENT LIST; the primary's
// replicas (flag S) are not counted.
func countOthers(list, ours string, since time.Duration) int {
	n := 0
	for line := range strings.SplitSeq(list, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var name, flags string
		idle := int64(-1)
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "name="); ok {
				name = v
			} else if v, ok := strings.CutPrefix(f, "idle="); ok {
				idle, _ = strconv.ParseInt(v, 10, 64)
			} else if v, ok := strings.CutPrefix(f, "flags="); ok {
				flags = v
			}
		}
		if strings.HasPrefix(name, ours) || idle < 0 || strings.Contains(flags, "S") {
			continue
		}
		// idle is whole seconds since the client's last command.
		if time.Duration(idle)*time.Second <= since {
			n++
		}
	}
	return n
}

// clockOffset estimates Redis's clock minus the local one (µs) from the
// TIME sample with the shortest round trip, and that round trip.
func clockOffset(ctx context.Context, rdb redis.UniversalClient) (offsetUs, rttUs int64, err error) {
	rttUs = -1
	for range 20 {
		before := time.Now()
		t, err := rdb.Time(ctx).Result()
		after := time.Now()
		if err != nil {
			return 0, 0, fmt.Errorf("redis TIME: %w", err)
		}
		rtt := after.Sub(before).Microseconds()
		if rttUs < 0 || rtt < rttUs {
			rttUs = rtt
			mid := before.Add(after.Sub(before) / 2)
			offsetUs = t.UnixMicro() - mid.UnixMicro()
		}
	}
	return offsetUs, rttUs, nil
}
