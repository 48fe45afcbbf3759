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

// writeScript writes one instance's records of several queues, stamped
// with the Redis clock, prunes from each queue's hash the records not
// renewed for the TTL (instances that died), and keeps the hash alive for
// the TTL. A hash holds one field per live instance: the prune reads them
// all, a few hundred bytes each. One call for many queues: an instance
// writes a record of each queue it serves every Every, and a call per
// queue was a third of a thousand idle queues' Redis CPU (a script
// call's fixed cost). On a cluster, where keys of different slots cannot
// share a call, it is called with one queue at a time. A queue whose
// write is refused (its key is of another type) does not stop the
// others': it is named in the reply.
//
// KEYS the records hash P:{Q}:instances of each queue
// ARGV[1] the instance's id
// ARGV[2] the TTL, ms
// ARGV[2 + q] its record of queue q (KEYS[q]), JSON
// Returns {now_ms, q, error, q, error, ...}: the Redis clock, and the
// position in KEYS of each queue whose write was refused, with the error.
var writeScript = redis.NewScript(`#!lua
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id, ttl = ARGV[1], tonumber(ARGV[2])
local stamp = string.format('%d', now) .. ' '
local out = {now}
for q = 1, #KEYS do
  local set = redis.pcall('HSET', KEYS[q], id, stamp .. ARGV[2 + q])
  if type(set) == 'table' and set.err then
    out[#out + 1] = q
    out[#out + 1] = set.err
  else
    local all = redis.call('HGETALL', KEYS[q])
    for i = 1, #all, 2 do
      local seen = tonumber(string.match(all[i + 1], '^%d+'))
      if not seen or now - seen > ttl then
        redis.call('HDEL', KEYS[q], all[i])
      end
    end
    redis.call('PEXPIRE', KEYS[q], ttl)
  end
end
return out
`)

// writeBatch is the most queues one writeScript call writes: a thousand
// queues' records hold Redis for a few ms in all, in calls of a fraction
// of that.
const writeBatch = 256

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

// runScripts runs one call of script per set of keys in one pipeline (on
// a cluster, one per node, in parallel), by its SHA and, where the server
// does not know it yet, by its source.
func runScripts(ctx context.Context, rdb redis.UniversalClient, script *redis.Script, keys [][]string, args func(n int) []any) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(keys))
	pipe := rdb.Pipeline()
	for n, k := range keys {
		cmds[n] = script.EvalSha(ctx, pipe, k, args(n)...)
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
			cmds[n] = script.Eval(ctx, pipe, k, args(n)...)
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
	for _, q := range queues {
		if id := recs[q].ID; id != recs[queues[0]].ID {
			return 0, fmt.Errorf("write records of two instances at once: %s's of %s and %s's of %s", recs[queues[0]].ID, queues[0], id, q)
		}
	}
	// Calls of writeBatch queues on one Redis, of one on a cluster.
	per := writeBatch
	if _, cluster := rdb.(*redis.ClusterClient); cluster {
		per = 1
	}
	var batches [][]string
	for from := 0; from < len(keys); from += per {
		batches = append(batches, keys[from:min(from+per, len(keys))])
	}
	cmds := runScripts(ctx, rdb, writeScript, batches, func(b int) []any {
		from := b * per
		args := []any{recs[queues[from]].ID, ttl.Milliseconds()}
		for n := range batches[b] {
			args = append(args, vals[from+n])
		}
		return args
	})
	var now int64
	var errs []error
	for b, c := range cmds {
		out, err := c.Slice()
		if err == nil && (len(out)%2 != 1 || out[0] == nil) {
			err = fmt.Errorf("want the clock and refusals, got %d values", len(out))
		}
		if err != nil {
			for _, k := range batches[b] {
				errs = append(errs, fmt.Errorf("write %s: %w", k, err))
			}
			continue
		}
		if ms, ok := out[0].(int64); ok {
			now = ms
		}
		for i := 1; i+1 < len(out); i += 2 {
			q, _ := out[i].(int64)
			if q < 1 || int(q) > len(batches[b]) {
				errs = append(errs, fmt.Errorf("write %s to %s: the script's reply names queue %v, not one of 1..%d: %v",
					batches[b][0], batches[b][len(batches[b])-1], out[i], len(batches[b]), out[i+1]))
				continue
			}
			errs = append(errs, fmt.Errorf("write %s: %v", batches[b][q-1], out[i+1]))
		}
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
	one := make([][]string, len(keys))
	for n, k := range keys {
		one[n] = []string{k}
	}
	cmds := runScripts(ctx, rdb, readScript, one, func(int) []any { return nil })
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
