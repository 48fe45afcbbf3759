package instances

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// writeScript writes one instance's record of one queue, stamped with the
// Redis clock, prunes the records not renewed for the TTL (instances that
// died), and keeps the hash alive for the TTL. The hash holds one field
// per live instance: the prune reads them all, a few hundred bytes each.
//
// KEYS[1] the queue's records P:{Q}:instances
// ARGV[1] the instance's id
// ARGV[2] its record, JSON
// ARGV[3] the TTL, ms
// Returns the Redis clock, ms.
var writeScript = redis.NewScript(`#!lua
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', now) .. ' ' .. ARGV[2])
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local seen = tonumber(string.match(all[i + 1], '^%d+'))
  if not seen or now - seen > ttl then
    redis.call('HDEL', KEYS[1], all[i])
  end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return now
`)

// readScript reads a queue's records with the clock of the node that
// holds them, which stamped them. It only reads: it runs on a replica.
//
// KEYS[1] the queue's records P:{Q}:instances
// Returns {now_ms, field, value, field, value, ...}.
var readScript = redis.NewScript(`#!lua flags=no-writes
local t = redis.call('TIME')
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
return out
`)

// runScripts runs one call of script per key in one pipeline (on a
// cluster, one per node, in parallel), by its SHA and, where the server
// does not know it yet, by its source.
func runScripts(ctx context.Context, rdb redis.UniversalClient, script *redis.Script, keys []string, args func(n int) []any) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(keys))
	pipe := rdb.Pipeline()
	for n, k := range keys {
		cmds[n] = script.EvalSha(ctx, pipe, []string{k}, args(n)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		// A command never sent (the connection's set-up failed) has no
		// error of its own: it gets the pipeline's.
		for _, c := range cmds {
			if c.Err() == nil && c.Val() == nil {
				c.SetErr(err)
			}
		}
	}
	pipe = rdb.Pipeline()
	resend := false
	for n, k := range keys {
		if redis.HasErrorPrefix(cmds[n].Err(), "NOSCRIPT") {
			cmds[n] = script.Eval(ctx, pipe, []string{k}, args(n)...)
			resend = true
		}
	}
	if resend {
		_, _ = pipe.Exec(ctx)
	}
	return cmds
}

// Write writes an instance's records, one per queue, in one round trip,
// and returns the Redis clock (of the last node that answered) in ms.
func Write(ctx context.Context, rdb redis.UniversalClient, prefix string, recs map[string]Record, ttl time.Duration) (int64, error) {
	queues := make([]string, 0, len(recs))
	for q := range recs {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	keys := make([]string, len(queues))
	vals := make([]string, len(queues))
	for n, q := range queues {
		keys[n] = shard.Keys{Prefix: prefix, Queue: q}.Instances()
		v, err := encode(recs[q])
		if err != nil {
			return 0, err
		}
		vals[n] = v
	}
	cmds := runScripts(ctx, rdb, writeScript, keys, func(n int) []any {
		return []any{recs[queues[n]].ID, vals[n], ttl.Milliseconds()}
	})
	var now int64
	var errs []error
	for n, c := range cmds {
		ms, err := c.Int64()
		if err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", keys[n], err))
			continue
		}
		now = ms
	}
	return now, errors.Join(errs...)
}

// Remove deletes an instance's records of queues: a clean stop leaves the
// lists at once rather than after the TTL.
func Remove(ctx context.Context, rdb redis.UniversalClient, prefix, id string, queues []string) error {
	pipe := rdb.Pipeline()
	for _, q := range queues {
		pipe.HDel(ctx, shard.Keys{Prefix: prefix, Queue: q}.Instances(), id)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("remove the records of %s: %w", id, err)
	}
	return nil
}

// Queue is what the records of one queue say.
type Queue struct {
	Name string
	// NowMs is the Redis clock at the read, on the node that holds the
	// records.
	NowMs int64
	// Records are the live ones (renewed within the TTL), by id.
	Records []Record
	// Err says why the records could not be read; Bad counts records that
	// could not be decoded (skipped).
	Err error
	Bad int
}

// Read reads the queues' live records in one round trip. A queue whose
// records cannot be read carries its error; the others are read anyway.
func Read(ctx context.Context, rdb redis.UniversalClient, prefix string, queues []string, ttl time.Duration) []Queue {
	keys := make([]string, len(queues))
	for n, q := range queues {
		keys[n] = shard.Keys{Prefix: prefix, Queue: q}.Instances()
	}
	cmds := runScripts(ctx, rdb, readScript, keys, func(int) []any { return nil })
	out := make([]Queue, len(queues))
	for n, c := range cmds {
		out[n] = Queue{Name: queues[n]}
		vals, err := c.StringSlice()
		if err == nil && len(vals)%2 == 0 {
			err = fmt.Errorf("want the clock and field-value pairs, got %d values", len(vals))
		}
		if err == nil {
			out[n].NowMs, err = strconv.ParseInt(vals[0], 10, 64)
		}
		if err != nil {
			out[n].Err = fmt.Errorf("read %s: %w", keys[n], err)
			continue
		}
		for i := 1; i+1 < len(vals); i += 2 {
			r, err := decode(vals[i], vals[i+1])
			if err != nil {
				out[n].Bad++
				continue
			}
			if out[n].NowMs-r.SeenMs > ttl.Milliseconds() {
				continue // its instance is gone; the next write prunes it
			}
			out[n].Records = append(out[n].Records, r)
		}
		sort.Slice(out[n].Records, func(a, b int) bool { return out[n].Records[a].ID < out[n].Records[b].ID })
	}
	return out
}
