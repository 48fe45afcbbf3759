// Package admin changes a queue's state in Redis for the operator's
// commands: pause and resume, and the dead letters (list, requeue, purge).
// Scheduling and cancelling go through shard.Producer, like any producer.
package admin

import (
	"context"
	"encoding/json"
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
// script of every instance then takes nothing from the shard. It wakes the
// instances too: an empty queue that dozes is read at once when it wakes,
// so its metrics and status pages say it is paused without waiting for
// its next read.
func Pause(ctx context.Context, rdb redis.UniversalClient, q Queue, nowMs int64) error {
	pipe := rdb.Pipeline()
	for i := 0; i < q.Shards; i++ {
		pipe.Set(ctx, q.Keys.Paused(i), nowMs, 0)
	}
	if err := execAll(ctx, pipe, "pause"); err != nil {
		return err
	}
	_ = rdb.Publish(ctx, q.Keys.Wake(), shard.WakeBusy).Err() // a hint, as Resume's
	return nil
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
	Shard int   `json:"shard"`
	DueMs int64 `json:"due_ms"`
	// ID is the member when it is a task id (the entry has a claimed
	// body), "" for a member that is its own body.
	ID string `json:"id,omitempty"`
	// Body is the message body: the claimed body of an id, or the member.
	Body string `json:"body"`
	// Properties are the task's properties as stored (browse.PropsJSON).
	Properties json.RawMessage `json:"properties,omitempty"`
	MessageID  string          `json:"message_id"`
	Reason     string          `json:"reason"`
	Member     string          `json:"-"` // the task id, or the body itself
	Entry      string          `json:"-"` // "<due_ms>:<member>", the set member
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
			// One round trip per batch for the reasons, bodies and
			// properties of all its entries.
			pipe := rdb.Pipeline()
			reasons := pipe.HMGet(ctx, q.Keys.DeadReason(i), entries...)
			bodies := pipe.HMGet(ctx, q.Keys.ClaimedBody(i), entries...)
			props := pipe.HMGet(ctx, q.Keys.ClaimedProps(i), entries...)
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				for _, c := range []*redis.SliceCmd{reasons, bodies, props} {
					if c.Err() != nil {
						return fmt.Errorf("read %s: %w", c.Args()[1], c.Err())
					}
				}
				return fmt.Errorf("read the dead letters of shard %d: %w", i, err)
			}
			out := make([]Dead, 0, len(entries))
			for n, e := range entries {
				d, ok := parseEntry(i, e)
				if !ok {
					continue
				}
				d.Reason = str(reasons.Val(), n)
				if bs := bodies.Val(); n < len(bs) {
					if body, ok := bs[n].(string); ok {
						d.ID, d.Body = d.Member, body
					}
				}
				if p := str(props.Val(), n); p != "" {
					d.Properties = browse.PropsJSON(p)
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

// str is vals[n] of an HMGET reply, "" for a missing field.
func str(vals []any, n int) string {
	if n >= len(vals) {
		return ""
	}
	s, _ := vals[n].(string)
	return s
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
	return Dead{Shard: i, DueMs: ms, Member: member, Body: member, Entry: e, MessageID: shard.MessageID([]byte(member), ms)}, true
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

// ErrPending is Requeue's answer for a member that is pending already.
var ErrPending = errors.New("it is pending already (scheduled again since, or another dead scheduling of it was requeued): nothing changed, the pending scheduling keeps its body and properties")

// requeueKeys are the keys requeueScript takes, for shard i.
func requeueKeys(k shard.Keys, i int) []string {
	return []string{k.Pending(i), k.Dead(i), k.DeadReason(i), k.Tasks(i), k.Props(i), k.ClaimedBody(i), k.ClaimedProps(i)}
}

// Requeue moves a dead letter back to pending; atMs 0 keeps its due time
// (and message_id). It reports false if d is no longer dead, ErrPending if
// its member is pending already. The instances are woken for it: it is due.
func Requeue(ctx context.Context, rdb redis.UniversalClient, q Queue, d Dead, atMs int64) (bool, error) {
	res, err := RequeueBatch(ctx, rdb, q, d.Shard, []Dead{d}, atMs)
	if err != nil {
		return false, err
	}
	if res[0] == Pending {
		return false, ErrPending
	}
	return res[0] == Done, nil
}

// Purge forgets a dead letter for good, with its body and properties.
func Purge(ctx context.Context, rdb redis.UniversalClient, q Queue, d Dead) (bool, error) {
	res, err := PurgeBatch(ctx, rdb, q, d.Shard, []Dead{d})
	if err != nil {
		return false, err
	}
	return res[0] == Done, nil
}

// Outcome is what a batch requeue or purge did to one dead letter.
type Outcome int

// The outcomes of RequeueBatch and PurgeBatch.
const (
	NotDead Outcome = iota // no longer dead: nothing changed
	Done                   // requeued, or purged
	// Pending: its member is pending already (ErrPending); nothing changed.
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

// requeueBatchScript moves dead entries of one shard back to its pending
// set, each at its own due time (so the same message_id) unless given
// another score, with the body and properties the claim set aside for the
// entry: they go back to the tasks and props hashes under the member, and
// leave the claimed hashes, in the same step as the ZADD. An entry without
// a claimed body (or properties) was a member that is its own body (or had
// none): a field the member has in the tasks (props) hash is then removed,
// so that the requeued task is the one that died.
//
// A member that is pending already is left alone, entry and claimed
// fields too: a sorted set holds a member once, and the ZADD would move
// that scheduling (rescheduled since, a producer scheduling the same id
// again, or another dead scheduling of it requeued first) and the HSETs
// would replace its newer body and properties. Two dead schedulings of one
// member in a batch: the first is requeued, the second is then pending
// already, as one call after the other would have it.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] dead-letter set P:{Q:i}:dead
// KEYS[3] dead-letter reasons P:{Q:i}:dead:reason
// KEYS[4] bodies of pending ids P:{Q:i}:tasks
// KEYS[5] properties of pending members P:{Q:i}:props
// KEYS[6] claimed bodies P:{Q:i}:claimed:body (entry -> body)
// KEYS[7] claimed properties P:{Q:i}:claimed:props (entry -> JSON)
// ARGV[1] the score to schedule them at, "" for each one's due time
// ARGV[2..] the entries "<due_ms>:<member>"
// Returns one code per entry: 1 requeued, 0 not dead, 2 its member is
// pending already (nothing changed in either case).
var requeueBatchScript = redis.NewScript(luaTypes + `
local bad = wrongType({'zset', 'zset', 'hash', 'hash', 'hash', 'hash', 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for n = 2, #ARGV do
  local e = ARGV[n]
  local code = 0
  local due, member = string.match(e, '^(-?%d+):(.*)$')
  if due and redis.call('ZSCORE', KEYS[2], e) then
    if redis.call('ZSCORE', KEYS[1], member) then
      code = 2
    else
      local score = ARGV[1]
      if score == '' then score = due end
      local body = redis.call('HGET', KEYS[6], e)
      local props = redis.call('HGET', KEYS[7], e)
      redis.call('ZADD', KEYS[1], score, member)
      if body then
        redis.call('HSET', KEYS[4], member, body)
      else
        redis.call('HDEL', KEYS[4], member)
      end
      if props then
        redis.call('HSET', KEYS[5], member, props)
      else
        redis.call('HDEL', KEYS[5], member)
      end
      redis.call('ZREM', KEYS[2], e)
      redis.call('HDEL', KEYS[3], e)
      redis.call('HDEL', KEYS[6], e)
      redis.call('HDEL', KEYS[7], e)
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
	codes, err := requeueBatchScript.Run(ctx, rdb, requeueKeys(q.Keys, shardIdx), args...).Int64Slice()
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

// purgeBatchScript forgets dead entries of one shard: each entry, its
// reason, and the body and properties the claim set aside for it.
//
// KEYS[1] dead-letter set P:{Q:i}:dead
// KEYS[2] dead-letter reasons P:{Q:i}:dead:reason
// KEYS[3] claimed bodies P:{Q:i}:claimed:body
// KEYS[4] claimed properties P:{Q:i}:claimed:props
// ARGV[1..] the entries.
// Returns one code per entry: 1 if it was dead, 0 if not.
var purgeBatchScript = redis.NewScript(luaTypes + `
local bad = wrongType({'zset', 'hash', 'hash', 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for n = 1, #ARGV do
  out[n] = redis.call('ZREM', KEYS[1], ARGV[n])
  redis.call('HDEL', KEYS[2], ARGV[n])
  redis.call('HDEL', KEYS[3], ARGV[n])
  redis.call('HDEL', KEYS[4], ARGV[n])
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
	keys := []string{q.Keys.Dead(shardIdx), q.Keys.DeadReason(shardIdx), q.Keys.ClaimedBody(shardIdx), q.Keys.ClaimedProps(shardIdx)}
	codes, err := purgeBatchScript.Run(ctx, rdb, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("purge on %s: %w", q.Keys.Dead(shardIdx), err)
	}
	out := make([]Outcome, len(codes))
	for n, c := range codes {
		out[n] = Outcome(c)
	}
	return out, nil
}
