package bench

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// cmdStats is Redis's INFO commandstats: calls per command name. Redis
// counts every command it executes, those run by Lua scripts included.
type cmdStats map[string]int64

// benchOwn are commands only the bench sends during a measurement (its
// snapshots); they are left out of every count.
var benchOwn = map[string]bool{"info": true, "client|list": true}

// scriptCmds are the commands that run a script: one per script call.
var scriptCmds = map[string]bool{"eval": true, "evalsha": true, "eval_ro": true, "evalsha_ro": true, "fcall": true, "fcall_ro": true}

func readCmdStats(ctx context.Context, rdb *redis.Client) (cmdStats, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	return parseCmdStats(info), nil
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

// RedisUse is what the dispatchers cost Redis over one measurement.
type RedisUse struct {
	// Commands is every command Redis executed, those run inside Lua
	// scripts included (that is how Redis counts them, and it is the
	// server's work), without the bench's own.
	Commands int64 `json:"commands"`
	// ScriptCalls is the EVAL/EVALSHA calls among them.
	ScriptCalls int64 `json:"script_calls"`
	// ByCommand breaks Commands down by command name.
	ByCommand map[string]int64 `json:"by_command"`
	// Subtracted is what the bench itself sent (the rate mode's ZADDs).
	Subtracted map[string]int64 `json:"subtracted,omitempty"`
	// OtherClients counts clients that are neither the bench nor its
	// dispatchers and sent commands during the measurement: their
	// commands are in the figures too.
	OtherClients int     `json:"other_clients"`
	Seconds      float64 `json:"seconds"`
}

// redisUse is after minus before, without the bench's own commands and
// minus own (commands the bench sent on purpose).
func redisUse(before, after cmdStats, own map[string]int64) RedisUse {
	u := RedisUse{ByCommand: map[string]int64{}, Subtracted: own}
	for name, n := range after {
		if benchOwn[name] {
			continue
		}
		d := n - before[name] - own[name]
		if d <= 0 {
			continue
		}
		u.ByCommand[name] = d
		u.Commands += d
		if scriptCmds[name] {
			u.ScriptCalls += d
		}
	}
	return u
}

// otherClients counts clients whose name does not start with ours and
// that ran a command within the last since.
func otherClients(ctx context.Context, rdb *redis.Client, ours string, since time.Duration) (int, error) {
	list, err := rdb.ClientList(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redis CLIENT LIST: %w", err)
	}
	return countOthers(list, ours, since), nil
}

func countOthers(list, ours string, since time.Duration) int {
	n := 0
	for line := range strings.SplitSeq(list, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		var name string
		idle := int64(-1)
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, "name="); ok {
				name = v
			} else if v, ok := strings.CutPrefix(f, "idle="); ok {
				idle, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		if strings.HasPrefix(name, ours) || idle < 0 {
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
func clockOffset(ctx context.Context, rdb *redis.Client) (offsetUs, rttUs int64, err error) {
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
