// Package admin changes a queue's state in Redis for the operator's
// commands: pause and resume, and the dead letters (list, requeue, purge).
// Scheduling and cancelling go through shard.Producer, like any producer.
package admin

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/internal/browse"
	"github.com/dispatcher/dispatcher/shard"
)

// Queue is one queue's keys and shard count.
type Queue struct {
	Keys shard.Keys
	// Shards is how many shards to act on: during a change of the shard
	// count, those of both counts (Layout.Span).
	Shards int
	// Layout, if set, says which shards a member's dead letters may be in.
	Layout shard.Layout
}

// Pause sets every shard's pause flag (its value: when, in ms): the claim
// script of every instance then takes nothing from the shard.
func Pause(ctx context.Context, rdb redis.UniversalClient, q Queue, nowMs int64) error {
	pipe := rdb.Pipeline()
	for i := 0; i < q.Shards; i++ {
		pipe.Set(ctx, q.Keys.Paused(i), nowMs, 0)
	}
	return execAll(ctx, pipe, "pause")
}

// Resume removes every shard's pause flag and wakes the instances.
func Resume(ctx context.Context, rdb redis.UniversalClient, q Queue) error {
	pipe := rdb.Pipeline()
	for i := 0; i < q.Shards; i++ {
		pipe.Del(ctx, q.Keys.Paused(i))
	}
	if err := execAll(ctx, pipe, "resume"); err != nil {
		return err
	}
	// A wake-up is a hint: the instances look at paused shards every second anyway.
	_ = rdb.Publish(ctx, q.Keys.Wake(), shard.WakeBusy).Err()
	return nil
}

func execAll(ctx context.Context, pipe redis.Pipeliner, what string) error {
	cmds, err := pipe.Exec(ctx)
	if err == nil {
		return nil
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return fmt.Errorf("%s: %s: %w", what, c.Args()[1], c.Err())
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// Dead is one dead-lettered scheduling.
type Dead struct {
	Shard     int    `json:"shard"`
	DueMs     int64  `json:"due_ms"`
	Member    string `json:"body"`
	MessageID string `json:"message_id"`
	Reason    string `json:"reason"`
	Entry     string `json:"-"` // "<due_ms>:<member>", the set member
}

// DeadEach calls fn with the dead letters of one shard, or of all (shard
// < 0), shard by shard, a batch of up to browse.MaxRead at a time in due
// order: no call reads a whole set, so it goes through millions. fn may
// requeue or purge the batch it is given. Only dead letters due in rg
// are walked.
func DeadEach(ctx context.Context, rdb redis.UniversalClient, q Queue, shardIdx int, rg browse.Range, fn func([]Dead) error) error {
	for _, i := range shardsOf(q, shardIdx) {
		err := browse.Batches(ctx, rdb, q.Keys.Dead(i), rg, func(zs []redis.Z) error {
			entries := make([]string, len(zs))
			for n, z := range zs {
				entries[n], _ = z.Member.(string)
			}
			reasons, err := rdb.HMGet(ctx, q.Keys.DeadReason(i), entries...).Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("read %s: %w", q.Keys.DeadReason(i), err)
			}
			out := make([]Dead, 0, len(entries))
			for n, e := range entries {
				d, ok := parseEntry(i, e)
				if !ok {
					continue
				}
				if n < len(reasons) {
					d.Reason, _ = reasons[n].(string)
				}
				out = append(out, d)
			}
			return fn(out)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// DeadOf returns the dead letters of one member (every scheduling of it).
// The dead-letter set is ordered by due time, not member, so it is walked
// in batches.
func DeadOf(ctx context.Context, rdb redis.UniversalClient, q Queue, member []byte) ([]Dead, error) {
	indexes := []int{shard.Index(member, q.Shards)}
	if q.Layout.Shards != 0 {
		indexes = q.Layout.Indexes(member)
	}
	var out []Dead
	for _, i := range indexes {
		err := DeadEach(ctx, rdb, q, i, browse.All, func(ds []Dead) error {
			for _, d := range ds {
				if d.Member == string(member) {
					out = append(out, d)
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func parseEntry(i int, e string) (Dead, bool) {
	due, member, ok := strings.Cut(e, ":")
	if !ok {
		return Dead{}, false
	}
	ms, err := strconv.ParseInt(due, 10, 64)
	if err != nil {
		return Dead{}, false
	}
	return Dead{Shard: i, DueMs: ms, Member: member, Entry: e, MessageID: shard.MessageID([]byte(member), ms)}, true
}

func shardsOf(q Queue, shardIdx int) []int {
	if shardIdx >= 0 {
		return []int{shardIdx}
	}
	out := make([]int, q.Shards)
	for i := range out {
		out[i] = i
	}
	return out
}

// requeueScript moves one dead entry back to its pending shard, at its
// own due time (so the same message_id) unless given another score. A
// member that is pending already (rescheduled since, or another dead
// scheduling of it requeued first) is left alone: a sorted set holds a
// member once, and the ZADD would move that scheduling.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] dead-letter set P:{Q:i}:dead
// KEYS[3] dead-letter reasons P:{Q:i}:dead:reason
// ARGV[1] the entry "<due_ms>:<member>"
// ARGV[2] the score to schedule it at, "" for its due time
// Returns 1 if it was moved, 0 if the entry is not dead, 2 if its member is
// pending already (nothing changed in either case).
var requeueScript = redis.NewScript(`
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
local due, member = string.match(ARGV[1], '^(-?%d+):(.*)$')
if redis.call('ZSCORE', KEYS[1], member) then
  return 2
end
local score = ARGV[2]
if score == '' then score = due end
redis.call('ZADD', KEYS[1], score, member)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
`)

// ErrPending is Requeue's answer for a member that is pending already.
var ErrPending = errors.New("its body is pending already (rescheduled since, or another dead scheduling of it was requeued): nothing changed")

// Requeue moves a dead letter back to pending; atMs 0 keeps its due time
// (and message_id). It reports false if d is no longer dead, ErrPending if
// its member is pending already. The instances are woken for it: it is due.
func Requeue(ctx context.Context, rdb redis.UniversalClient, q Queue, d Dead, atMs int64) (bool, error) {
	at := ""
	if atMs != 0 {
		at = strconv.FormatInt(atMs, 10)
	}
	n, err := requeueScript.Run(ctx, rdb, []string{q.Keys.Pending(d.Shard), q.Keys.Dead(d.Shard), q.Keys.DeadReason(d.Shard)}, d.Entry, at).Int()
	if err != nil {
		return false, fmt.Errorf("requeue on %s: %w", q.Keys.Dead(d.Shard), err)
	}
	if n == 2 {
		return false, ErrPending
	}
	if n == 1 {
		due := d.DueMs
		if atMs != 0 {
			due = atMs
		}
		_ = rdb.Publish(ctx, q.Keys.Wake(), shard.WakeDue(d.Shard, due)).Err() // a hint: sweeps find it anyway
	}
	return n == 1, nil
}

// purgeScript forgets one dead entry and its reason.
//
// KEYS[1] dead-letter set, KEYS[2] its reasons; ARGV[1] the entry.
// Returns 1 if it was dead, 0 if not.
var purgeScript = redis.NewScript(`
local n = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return n
`)

// Purge forgets a dead letter for good.
func Purge(ctx context.Context, rdb redis.UniversalClient, q Queue, d Dead) (bool, error) {
	n, err := purgeScript.Run(ctx, rdb, []string{q.Keys.Dead(d.Shard), q.Keys.DeadReason(d.Shard)}, d.Entry).Int()
	if err != nil {
		return false, fmt.Errorf("purge on %s: %w", q.Keys.Dead(d.Shard), err)
	}
	return n == 1, nil
}

// Outcome is what a batch requeue or purge did to one dead letter.
type Outcome int

// The outcomes of RequeueBatch and PurgeBatch.
const (
	NotDead Outcome = iota // no longer dead: nothing changed
	Done                   // requeued, or purged
	// Pending: its body is pending already (ErrPending); nothing changed.
	Pending
)

// luaTypes proves the types of a batch script's keys, KEYS[i] of
// types[i], before its first write: Redis does not undo a script's
// earlier writes when a later call fails, and a batch half done would be
// reported as failed.
const luaTypes = `
local function wrongType(types)
  for i, want in ipairs(types) do
    local got = redis.call('TYPE', KEYS[i])['ok']
    if got ~= 'none' and got ~= want then
      return 'WRONGTYPE key ' .. KEYS[i] .. ' holds a ' .. got .. ', not a ' .. want .. '; nothing changed'
    end
  end
  return nil
end
`

// requeueBatchScript is requeueScript for several entries of one shard:
// one call per batch instead of one per dead letter. Two dead schedulings
// of one body in a batch: the first is requeued, the second is then
// pending already, as one call after the other would have it.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] dead-letter set P:{Q:i}:dead
// KEYS[3] dead-letter reasons P:{Q:i}:dead:reason
// ARGV[1] the score to schedule them at, "" for each one's due time
// ARGV[2..] the entries "<due_ms>:<member>"
// Returns one code per entry, as requeueScript's.
var requeueBatchScript = redis.NewScript(luaTypes + `
local bad = wrongType({'zset', 'zset', 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for n = 2, #ARGV do
  local code = 0
  local due, member = string.match(ARGV[n], '^(-?%d+):(.*)$')
  if due and redis.call('ZSCORE', KEYS[2], ARGV[n]) then
    if redis.call('ZSCORE', KEYS[1], member) then
      code = 2
    else
      local score = ARGV[1]
      if score == '' then score = due end
      redis.call('ZADD', KEYS[1], score, member)
      redis.call('ZREM', KEYS[2], ARGV[n])
      redis.call('HDEL', KEYS[3], ARGV[n])
      code = 1
    end
  end
  out[#out + 1] = code
end
return out
`)

// RequeueBatch is Requeue for dead letters of one shard (a batch of
// DeadEach) in one call; it returns each one's outcome.
func RequeueBatch(ctx context.Context, rdb redis.UniversalClient, q Queue, shardIdx int, ds []Dead, atMs int64) ([]Outcome, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	at := ""
	if atMs != 0 {
		at = strconv.FormatInt(atMs, 10)
	}
	args := []any{at}
	for _, d := range ds {
		args = append(args, d.Entry)
	}
	codes, err := requeueBatchScript.Run(ctx, rdb, []string{q.Keys.Pending(shardIdx), q.Keys.Dead(shardIdx), q.Keys.DeadReason(shardIdx)}, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("requeue on %s: %w", q.Keys.Dead(shardIdx), err)
	}
	out := make([]Outcome, len(codes))
	earliest := int64(-1)
	for n, c := range codes {
		out[n] = Outcome(c)
		if c == 1 && (earliest < 0 || ds[n].DueMs < earliest) {
			earliest = ds[n].DueMs
		}
	}
	if earliest >= 0 {
		if atMs != 0 {
			earliest = atMs
		}
		_ = rdb.Publish(ctx, q.Keys.Wake(), shard.WakeDue(shardIdx, earliest)).Err() // a hint: sweeps find them anyway
	}
	return out, nil
}

// purgeBatchScript is purgeScript for several entries of one shard.
//
// KEYS[1] dead-letter set, KEYS[2] its reasons; ARGV[1..] the entries.
// Returns one code per entry: 1 if it was dead, 0 if not.
var purgeBatchScript = redis.NewScript(luaTypes + `
local bad = wrongType({'zset', 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for n = 1, #ARGV do
  out[n] = redis.call('ZREM', KEYS[1], ARGV[n])
  redis.call('HDEL', KEYS[2], ARGV[n])
end
return out
`)

// PurgeBatch is Purge for dead letters of one shard in one call.
func PurgeBatch(ctx context.Context, rdb redis.UniversalClient, q Queue, shardIdx int, ds []Dead) ([]Outcome, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	args := make([]any, len(ds))
	for n, d := range ds {
		args[n] = d.Entry
	}
	codes, err := purgeBatchScript.Run(ctx, rdb, []string{q.Keys.Dead(shardIdx), q.Keys.DeadReason(shardIdx)}, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("purge on %s: %w", q.Keys.Dead(shardIdx), err)
	}
	out := make([]Outcome, len(codes))
	for n, c := range codes {
		out[n] = Outcome(c)
	}
	return out, nil
}
