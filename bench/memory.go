package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/redisconn"
	"github.com/dispatcher/dispatcher/shard"
)

// MemoryResult is one memory point: what N pending tasks of one size cost
// Redis, with no dispatcher running.
type MemoryResult struct {
	Point
	Name string `json:"name"`
	// UsedBytes is the growth of used_memory (INFO memory, summed over
	// every primary) from before the load to after it; PerTask that over
	// the tasks; PerTaskOverhead PerTask minus the member's own bytes.
	UsedBytes       int64   `json:"used_bytes"`
	PerTask         float64 `json:"bytes_per_task"`
	PerTaskOverhead float64 `json:"overhead_bytes_per_task"`
	// In16GB is how many such tasks 16 GiB of used_memory holds (the
	// dataset alone: no headroom for a fork, replication buffers or
	// fragmentation, which the docs discuss).
	In16GB       int64   `json:"tasks_in_16gib"`
	LoadSeconds  float64 `json:"load_seconds"`
	LoadedPerSec float64 `json:"loaded_per_sec"`
	// Fragmentation is mem_fragmentation_ratio after the load (the worst
	// primary's).
	Fragmentation float64 `json:"fragmentation_ratio"`
	// OtherClients counts clients that are neither the bench nor its
	// instances and ran a command while the point loaded: their writes
	// and frees are in UsedBytes too.
	OtherClients int `json:"other_clients"`
	// OtherConnections counts the connections Redis took during the load
	// beyond the bench's own: a client that wrote and left is not in
	// CLIENT LIST, but its connection is in INFO stats.
	OtherConnections int64 `json:"other_connections"`
}

// runMemory loads the point's tasks, due in an hour, over its shards and
// reads what they cost; no instance runs.
func (r *runner) runMemory(ctx context.Context, p Point) (*MemoryResult, error) {
	name := r.name(p.Mode)
	keys := shard.Keys{Prefix: name, Queue: benchQueue}
	defer r.cleanKeys(name, []string{benchQueue}, p.Shards)
	res := &MemoryResult{Point: p, Name: name}
	// The last point's keys were UNLINKed: Redis frees them in the
	// background, which would come off this point's growth.
	if err := r.lazyFreed(ctx); err != nil {
		return res, err
	}
	before, _, err := r.usedMemory(ctx)
	if err != nil {
		return res, err
	}
	connsBefore, oursBefore, err := r.connections(ctx)
	if err != nil {
		return res, err
	}
	var loaded atomic.Int64
	stop := r.prog.start(func() string {
		return fmt.Sprintf("%s: loading %s/%s", p, thousands(int(loaded.Load())), thousands(p.Backlog))
	})
	began := time.Now()
	later := began.Add(time.Hour).UnixMilli()
	err = load(ctx, r.rdb, keys, p, 0, p.Backlog, func(i int) int64 { return later + int64(i%60000) }, &loaded)
	stop()
	res.LoadSeconds = time.Since(began).Seconds()
	if err != nil {
		return res, err
	}
	res.LoadedPerSec = float64(p.Backlog) / res.LoadSeconds
	after, frag, err := r.usedMemory(ctx)
	if err != nil {
		return res, err
	}
	res.UsedBytes = after - before
	res.PerTask = float64(res.UsedBytes) / float64(p.Backlog)
	res.PerTaskOverhead = res.PerTask - float64(p.Size)
	if res.PerTask > 0 {
		res.In16GB = int64(float64(16<<30) / res.PerTask)
	}
	res.Fragmentation = frag
	// CLIENT LIST's idle is in whole seconds: a second more than the load
	// took covers a client that ran a command just before its end.
	others, err := otherClients(ctx, r.rdb, r.clientPrefix(), time.Since(began)+time.Second)
	if err != nil {
		return res, err
	}
	for _, n := range others {
		res.OtherClients += n
	}
	connsAfter, oursAfter, err := r.connections(ctx)
	if err != nil {
		return res, err
	}
	// Less the bench's own connections opened meanwhile (its pool grows
	// with the load's workers).
	for id := range oursAfter {
		if !oursBefore[id] {
			connsAfter--
		}
	}
	res.OtherConnections = max(0, connsAfter-connsBefore)
	return res, nil
}

// connections sums total_connections_received (INFO stats) over every
// primary, and returns the bench's own connections there (CLIENT LIST,
// by name) as "addr id".
func (r *runner) connections(ctx context.Context) (received int64, ours map[string]bool, err error) {
	var mu sync.Mutex
	ours = map[string]bool{}
	err = redisconn.ForEachPrimary(ctx, r.rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		info, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return fmt.Errorf("redis INFO stats on %s: %w", addr, err)
		}
		n, err := infoInt(info, "total_connections_received")
		if err != nil {
			return fmt.Errorf("redis INFO stats on %s: %w", addr, err)
		}
		list, err := c.ClientList(ctx).Result()
		if err != nil {
			return fmt.Errorf("redis CLIENT LIST on %s: %w", addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		received += n
		for line := range strings.SplitSeq(list, "\n") {
			var id string
			mine := false
			for f := range strings.FieldsSeq(line) {
				if v, ok := strings.CutPrefix(f, "id="); ok {
					id = v
				} else if v, ok := strings.CutPrefix(f, "name="); ok {
					mine = strings.HasPrefix(v, r.clientPrefix())
				}
			}
			if mine {
				ours[addr+" "+id] = true
			}
		}
		return nil
	})
	return received, ours, err
}

// lazyFreed waits until no primary has objects left to free in the
// background.
func (r *runner) lazyFreed(ctx context.Context) error {
	for {
		pending := false
		err := redisconn.ForEachPrimary(ctx, r.rdb, func(ctx context.Context, addr string, c *redis.Client) error {
			info, err := c.Info(ctx, "memory").Result()
			if err != nil {
				return fmt.Errorf("redis INFO memory on %s: %w", addr, err)
			}
			if !strings.Contains(info, "lazyfree_pending_objects:0") {
				pending = true
			}
			return nil
		})
		if err != nil || !pending {
			return err
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// usedMemory sums used_memory over every primary and returns the worst
// fragmentation ratio.
func (r *runner) usedMemory(ctx context.Context) (used int64, frag float64, err error) {
	var mu sync.Mutex
	err = redisconn.ForEachPrimary(ctx, r.rdb, func(ctx context.Context, addr string, c *redis.Client) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return fmt.Errorf("redis INFO memory on %s: %w", addr, err)
		}
		u, f := parseMemory(info)
		mu.Lock()
		defer mu.Unlock()
		used += u
		frag = max(frag, f)
		return nil
	})
	return used, frag, err
}

// parseMemory reads used_memory and mem_fragmentation_ratio from INFO
// memory.
func parseMemory(info string) (used int64, frag float64) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			used, _ = strconv.ParseInt(v, 10, 64)
		case "mem_fragmentation_ratio":
			frag, _ = strconv.ParseFloat(v, 64)
		}
	}
	return used, frag
}

// memoryText is the one-line summary of a memory point.
func memoryText(res *MemoryResult) string {
	return fmt.Sprintf("  => %.0f bytes per task (%.0f beyond the %d-byte member), %s tasks in 16 GiB; loaded at %s/s; fragmentation %.2f",
		res.PerTask, res.PerTaskOverhead, res.Size, thousands(int(res.In16GB)), thousands(int(res.LoadedPerSec)), res.Fragmentation)
}

// infoInt reads the integer field name of an INFO reply.
func infoInt(info, name string) (int64, error) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s %q: %w", name, v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no %s", name)
}
