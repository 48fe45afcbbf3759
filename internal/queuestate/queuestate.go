// Package queuestate reads what a queue holds in Redis, shard by shard:
// pending, due, in flight, retried after failed publishes, dead, and how
// late its oldest due task (pending or retried) is. The sweeping instance
// reads it for its metrics and stall watchdog, and `dispatcher stats` and
// the status page show it. Each shard costs one small read-only script
// call: counts only (ZCARD, ZCOUNT, HLEN) and first members, never a scan
// of a big set.
package queuestate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// readScript reads one shard's figures on the server's clock, so every
// reader (instances with skewed clocks, the CLI on a laptop) agrees on
// what is due. It only reads: no-writes lets it run on a replica and on a
// Redis at maxmemory.
//
// Retried tasks are the in-flight entries with a failed publish recorded:
// the fields of the attempts hash (HLEN, O(1)). The oldest of them by due
// time is the first of the retrying index (a sorted set by due time, see
// scanner/scripts.go) that is still in the attempts hash: an entry an
// older version acked without leaving the index is skipped, at most
// retryProbe of them, so the read stays O(log n) however many are
// retried.
//
// Bad scores (shard/score.go) are read without a scan too: a pending
// task scored under ARGV[3] (0, negative, -inf, seconds before 1973) has
// no due time, so the earliest dated ones are read past them, and they
// are counted, with the first's member; one scored ARGV[4] or more
// (micro- or nanoseconds, +inf) is the last of the set: counted, with
// the last's member. Members come cut to ARGV[5] bytes.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] in-flight set P:{Q:i}:inflight (score = lease deadline ms)
// KEYS[3] dead-letter set P:{Q:i}:dead
// KEYS[4] pause flag P:{Q:i}:paused
// KEYS[5] attempts hash P:{Q:i}:attempts
// KEYS[6] retrying set P:{Q:i}:retrying (score = due ms)
// KEYS[7..10] the hashes of task ids' bodies and properties, P:{Q:i}:tasks,
//
//	:props, :claimed:body and :claimed:props: only their types are
//	checked (HLEN, O(1)), so that a key of the wrong type, which stops
//	the shard's claims, marks the shard broken here too
//
// ARGV[1] the score below which a due time is taken for seconds (10^11)
// ARGV[2] retryProbe: most index entries looked at for the oldest retried
// ARGV[3] the score below which a task is undated (10^8)
// ARGV[4] the score from which a task is far in the future (10^14)
// ARGV[5] most bytes of a member returned
// Returns {now_ms, pending, due, earliest_score|"", inflight,
// inflight_expired, dead, earliest_ms_score|"", paused (1 or 0), retried,
// oldest_retried_due|"", first_member, undated, earliest_dated_seconds|"",
// far, last_score|"", last_member}; due counts pending tasks
// with a due time at or before now, inflight_expired in-flight entries
// whose lease (or retry backoff) ran out, which the next claim takes
// again. earliest_ms_score is the earliest score of at least ARGV[1]: a
// producer writing seconds puts its tasks first in the set, and they
// must not hide how late the others are; earliest_dated_seconds, read
// when the first task is undated, the earliest score from ARGV[3] up to
// ARGV[1].
//
// What a shard does not hold costs no call (most shards of quiet queues
// hold little): a shard with none of its keys costs one EXISTS (and the
// clock); the id hashes' types are checked only when one exists,
// and the pending set's count, due count and last member are read only
// when it has a first one (the due count only when that one is due).
var readScript = redis.NewScript("#!lua flags=no-writes\n" + luaNowMs + readShard + "return readShard(KEYS, now)\n")

// readShard is the read of one shard, a Lua function of its keys (in
// KEYS' order, see readScript) and the server clock in ms.
const readShard = `local function readShard(KEYS, now)
  if redis.call('EXISTS', unpack(KEYS)) == 0 then
    return {now, 0, 0, '', 0, 0, 0, '', 0, 0, '', '', 0, '', 0, '', ''}
  end
  if redis.call('EXISTS', KEYS[7], KEYS[8], KEYS[9], KEYS[10]) > 0 then
    for k = 7, 10 do redis.call('HLEN', KEYS[k]) end
  end
  local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local pending, due, tail = 0, 0, {}
  if head[1] then
    pending = redis.call('ZCARD', KEYS[1])
    if tonumber(head[2]) <= tonumber(now) then
      due = redis.call('ZCOUNT', KEYS[1], '-inf', now)
    end
    tail = head
    if pending > 1 then
      tail = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
    end
  end
  local msHead, secHead, undated = {}, {}, 0
  if head[2] and tonumber(head[2]) < tonumber(ARGV[1]) then
    msHead = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if tonumber(head[2]) < tonumber(ARGV[3]) then
      undated = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. ARGV[3])
      secHead = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[3], '(' .. ARGV[1], 'WITHSCORES', 'LIMIT', 0, 1)
    end
  end
  local far = 0
  if tail[2] and tonumber(tail[2]) >= tonumber(ARGV[4]) then
    far = redis.call('ZCOUNT', KEYS[1], ARGV[4], '+inf')
  end
  local retried = redis.call('HLEN', KEYS[5])
  local oldestRetried = ''
  if retried > 0 then
    local idx = redis.call('ZRANGE', KEYS[6], 0, tonumber(ARGV[2]) - 1, 'WITHSCORES')
    for i = 1, #idx, 2 do
      if redis.call('HEXISTS', KEYS[5], idx[i]) == 1 then
        oldestRetried = idx[i + 1]
        break
      end
    end
  end
  local inflight, expired = redis.call('ZCARD', KEYS[2]), 0
  if inflight > 0 then
    expired = redis.call('ZCOUNT', KEYS[2], '-inf', now)
  end
  local cut = tonumber(ARGV[5])
  return {now,
    pending, due, head[2] or '',
    inflight, expired,
    redis.call('ZCARD', KEYS[3]), msHead[2] or '', redis.call('GET', KEYS[4]) and 1 or 0,
    retried, oldestRetried, string.sub(head[1] or '', 1, cut), undated, secHead[2] or '',
    far, tail[2] or '', string.sub(tail[1] or '', 1, cut)}
end
`

// luaNowMs reads the server clock, in ms, as a string.
const luaNowMs = `local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
`

// readManyScript reads several shards of a queue on one Redis (not a
// cluster, where their keys live in different slots) in one call: KEYS
// are readScript's for each shard in turn, ARGV as readScript's. Returns
// readScript's values for each shard, or the error of its read (a key of
// the wrong type) in their place: one shard's bad key spoils no other's
// read. A queue's quiet shards then cost one call together, not one each.
var readManyScript = redis.NewScript("#!lua flags=no-writes\n" + luaNowMs + readShard + `
local out = {}
for i = 1, #KEYS, 10 do
  local ok, got = pcall(readShard, {unpack(KEYS, i, i + 9)}, now)
  if not ok then
    if type(got) == 'table' and got.err then got = got.err end
    got = redis.error_reply(tostring(got))
  end
  out[#out + 1] = got
end
return out
`)

// retryProbe bounds how many entries of the retrying index a read looks
// at for one still retried (see readScript).
const retryProbe = 16

// memberCut is the most bytes of a member a read returns (bad scores).
const memberCut = 64

// Scored is a pending task a read names: its member, cut to memberCut
// bytes, and its score as Redis holds it ("-5", "+inf").
type Scored struct {
	Member string `json:"member"`
	Score  string `json:"score"`
}

// Shard is what one shard holds.
type Shard struct {
	Index    int   `json:"shard"`
	Pending  int64 `json:"pending"`
	Due      int64 `json:"due"`
	Inflight int64 `json:"inflight"`
	// Expired counts in-flight tasks whose lease or retry backoff ran out:
	// the next claim hands them out again.
	Expired int64 `json:"inflight_expired"`
	Dead    int64 `json:"dead"`
	// Retried counts in-flight tasks with a failed publish (nack,
	// unroutable, no confirm, refused) recorded: each waits out its
	// backoff or is being published again, until the broker confirms it
	// or it is dead-lettered.
	Retried int64 `json:"retried"`
	// OldestRetriedDueMs is the due time of the earliest retried task (ms
	// since the epoch), 0 if none (or none known: see readScript).
	OldestRetriedDueMs int64 `json:"oldest_retried_due_ms,omitempty"`
	// RetriedAge is how long the earliest retried task has been due.
	RetriedAge        time.Duration `json:"-"`
	RetriedAgeSeconds float64       `json:"oldest_retried_age_seconds"`
	// Paused: `dispatcher pause` holds the shard's claims.
	Paused bool `json:"paused,omitempty"`
	// NextDueMs is the due time of the earliest pending task (ms since the
	// epoch), 0 if none is pending.
	NextDueMs int64 `json:"next_due_ms,omitempty"`
	// OldestDueAge is how long the earliest task that is due and not yet
	// delivered has been due, whether it waits in pending or in a retry;
	// 0 if none is due.
	OldestDueAge time.Duration `json:"-"`
	AgeSeconds   float64       `json:"oldest_due_age_seconds"`
	// Undated counts pending tasks with no real due time (scored under
	// shard.UndatedBelow: 0, negative, -inf, seconds before 1973), due at
	// once; FirstUndated is the first. Their lateness is not known, so
	// OldestDueAge leaves them out here; the sweeping instance counts it
	// from when it first saw one (internal/monitor).
	Undated      int64   `json:"undated,omitempty"`
	FirstUndated *Scored `json:"first_undated,omitempty"`
	// Far counts pending tasks scored after year 5138 (micro- or
	// nanoseconds, +inf), which wait until then; LastFar is the last.
	Far     int64   `json:"far_future,omitempty"`
	LastFar *Scored `json:"last_far_future,omitempty"`
	// Beyond: the shard's index is beyond the queue's shard count (a
	// producer hashing with a larger count wrote it); read only when asked.
	Beyond bool `json:"beyond_shard_count,omitempty"`
	// Err says why the shard could not be read (a key of the wrong type,
	// its primary down), "" if it was.
	Err string `json:"error,omitempty"`
}

// Queue is what one queue holds: its shards' figures and their sums.
type Queue struct {
	Name     string  `json:"queue"`
	Shards   []Shard `json:"shards"`
	Pending  int64   `json:"pending"`
	Due      int64   `json:"due"`
	Inflight int64   `json:"inflight"`
	Expired  int64   `json:"inflight_expired"`
	Dead     int64   `json:"dead"`
	Retried  int64   `json:"retried"`
	Undated  int64   `json:"undated"`
	Far      int64   `json:"far_future"`
	// Beyond counts the pending tasks in shards beyond the queue's shard
	// count (Target.Beyond).
	Beyond int64 `json:"beyond_shard_count"`
	// OldestDueAge is the largest of the shards': how late the queue's
	// oldest task that is due and not yet delivered (pending or retried)
	// is.
	OldestDueAge time.Duration `json:"-"`
	AgeSeconds   float64       `json:"oldest_due_age_seconds"`
	// RetriedAge is the largest of the shards': how late the oldest
	// retried task is.
	RetriedAge        time.Duration `json:"-"`
	RetriedAgeSeconds float64       `json:"oldest_retried_age_seconds"`
	// NextDueMs is the earliest due time of any pending task, 0 if none.
	NextDueMs int64 `json:"next_due_ms,omitempty"`
	// Broken counts the shards that could not be read.
	Broken int `json:"broken_shards"`
	// Paused counts the shards `dispatcher pause` holds (all of them after
	// a pause that completed).
	Paused int `json:"paused_shards"`
	// Layout is the queue's shard layout when the reader knew it: its
	// shard count and, during a change (`dispatcher reshard`), the count
	// it changes from.
	Layout *shard.Layout `json:"layout,omitempty"`
	// Sweeper is the instance that holds the queue's sweeper role, "" if
	// none does; SweeperErr says why it could not be read, if it could not.
	Sweeper    string `json:"sweeper"`
	SweeperErr string `json:"sweeper_error,omitempty"`
	// ReadAt is the Redis clock when the shards were read (the latest of
	// their primaries').
	ReadAt time.Time `json:"read_at"`
}

// Late lists the shards with a due task not yet delivered, the latest
// first.
func (q Queue) Late() []Shard {
	var out []Shard
	for _, s := range q.Shards {
		if s.OldestDueAge > 0 {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].OldestDueAge > out[b].OldestDueAge })
	return out
}

// Target names a queue to read: its name and shard count, and indexes
// beyond that count to read too (where shard.Beyond found tasks).
type Target struct {
	Name   string
	Shards int
	Beyond []int
}

// indexes are the shards of t to read.
func (t Target) indexes() []int {
	out := make([]int, 0, t.Shards+len(t.Beyond))
	for i := range t.Shards {
		out = append(out, i)
	}
	return append(out, t.Beyond...)
}

// Read reads the queues in one pipeline (on a cluster, one per primary,
// sent in parallel by go-redis). A shard that cannot be read is marked
// with its error and the others are read anyway; the error returned is
// for a failure of the whole round trip (no shard of any queue read).
func Read(ctx context.Context, rdb redis.UniversalClient, prefix string, targets []Target) ([]Queue, error) {
	// A call reads one shard, or (one Redis, not a cluster) all the
	// shards of a queue (readManyScript).
	type call struct {
		q, at  int   // queue, position of its first shard in the queue's
		shards []int // shard indexes
		cmd    *redis.Cmd
	}
	_, cluster := rdb.(*redis.ClusterClient)
	var calls []call
	sweepers := make([]*redis.StringCmd, len(targets))
	send := func(pipe redis.Pipeliner, c *call, source bool) {
		k := shard.Keys{Prefix: prefix, Queue: targets[c.q].Name}
		keys := make([]string, 0, 10*len(c.shards))
		for _, i := range c.shards {
			keys = append(keys, k.Pending(i), k.Inflight(i), k.Dead(i), k.Paused(i), k.Attempts(i), k.Retrying(i),
				k.Tasks(i), k.Props(i), k.ClaimedBody(i), k.ClaimedProps(i))
		}
		script := readScript
		if !cluster {
			script = readManyScript
		}
		args := []any{shard.SecondsScoreBelow, retryProbe, shard.UndatedBelow, shard.FarScoreFrom, memberCut}
		if source { // after NOSCRIPT: the source, which also caches it
			c.cmd = script.Eval(ctx, pipe, keys, args...)
		} else {
			c.cmd = script.EvalSha(ctx, pipe, keys, args...)
		}
	}
	pipe := rdb.Pipeline()
	for q, t := range targets {
		if cluster {
			for n, i := range t.indexes() {
				calls = append(calls, call{q: q, at: n, shards: []int{i}})
				send(pipe, &calls[len(calls)-1], false)
			}
		} else {
			calls = append(calls, call{q: q, shards: t.indexes()})
			send(pipe, &calls[len(calls)-1], false)
		}
		sweepers[q] = pipe.Get(ctx, shard.Keys{Prefix: prefix, Queue: t.Name}.Sweeper())
	}
	// Each command's error is read below. One that was never sent (the
	// connection's set-up failed: AUTH, SELECT) has none of its own: it
	// gets the pipeline's.
	if _, err := pipe.Exec(ctx); err != nil {
		for _, c := range calls {
			if c.cmd.Err() == nil && c.cmd.Val() == nil {
				c.cmd.SetErr(err)
			}
		}
	}
	pipe = rdb.Pipeline()
	resend := false
	for n := range calls {
		if redis.HasErrorPrefix(calls[n].cmd.Err(), "NOSCRIPT") {
			send(pipe, &calls[n], true)
			resend = true
		}
	}
	if resend {
		_, _ = pipe.Exec(ctx)
	}

	// Each shard's values, or the error of its read.
	type shardRead struct {
		q, i, n int // queue, shard index, position in the queue's shards
		vals    []any
		err     error
	}
	var reads []shardRead
	for _, c := range calls {
		first := len(reads)
		for n, i := range c.shards {
			reads = append(reads, shardRead{q: c.q, i: i, n: c.at + n})
		}
		vals, err := c.cmd.Slice()
		for n := range c.shards {
			r := &reads[first+n]
			switch {
			case err != nil:
				r.err = err
			case cluster:
				r.vals = vals
			case n >= len(vals):
				r.err = fmt.Errorf("read script returned %d shards' values, want %d", len(vals), len(c.shards))
			default:
				switch v := vals[n].(type) {
				case error:
					r.err = v
				case []any:
					r.vals = v
				default:
					r.err = fmt.Errorf("read script returned %T for a shard", v)
				}
			}
		}
	}

	// A wrong-type key fails the script with a message that names no key:
	// ask which key it is, for the few shards it happens to.
	why := map[int]error{}
	for n, c := range reads {
		if redis.HasErrorPrefix(c.err, "WRONGTYPE") {
			k := shard.Keys{Prefix: prefix, Queue: targets[c.q].Name}
			why[n] = wrongType(ctx, rdb, k.Pending(c.i), "zset", k.Inflight(c.i), "zset", k.Dead(c.i), "zset",
				k.Attempts(c.i), "hash", k.Retrying(c.i), "zset", k.Tasks(c.i), "hash", k.Props(c.i), "hash",
				k.ClaimedBody(c.i), "hash", k.ClaimedProps(c.i), "hash")
		}
	}

	out := make([]Queue, len(targets))
	for q, t := range targets {
		out[q] = Queue{Name: t.Name, Shards: make([]Shard, t.Shards+len(t.Beyond))}
		sw, err := sweepers[q].Result()
		switch {
		case err == nil:
			out[q].Sweeper = sw
		case !errors.Is(err, redis.Nil):
			out[q].SweeperErr = err.Error()
		}
	}
	read := 0
	var firstErr error
	for n, c := range reads {
		s := Shard{Index: c.i, Beyond: c.i >= targets[c.q].Shards}
		now, err := parseShard(c.vals, c.err, &s)
		if w := why[n]; w != nil {
			err = w
		}
		if err != nil {
			s.Err = err.Error()
			if firstErr == nil {
				firstErr = err
			}
		} else {
			read++
			if t := time.UnixMilli(now); t.After(out[c.q].ReadAt) {
				out[c.q].ReadAt = t
			}
		}
		out[c.q].Shards[c.n] = s
	}
	for q := range out {
		out[q].sum()
	}
	if read == 0 && firstErr != nil {
		return out, fmt.Errorf("read queue state: %w", firstErr)
	}
	return out, nil
}

// The read script's values, by position.
const (
	vNow = iota
	vPending
	vDue
	vHead
	vInflight
	vExpired
	vDead
	vMsHead
	vPaused
	vRetried
	vOldestRetried
	vHeadMember
	vUndated
	vSecHead
	vFar
	vTail
	vTailMember
	vCount
)

func parseShard(vals []any, err error, s *Shard) (now int64, _ error) {
	if err != nil {
		return 0, err
	}
	if len(vals) != vCount {
		return 0, fmt.Errorf("read script returned %d values, want %d", len(vals), vCount)
	}
	ints := make([]int64, len(vals))
	scores := make([]float64, len(vals)) // of the score values; NaN if none
	for n, v := range vals {
		scores[n] = math.NaN()
		switch v := v.(type) {
		case int64:
			ints[n] = v
		case string:
			if v == "" || n == vHeadMember || n == vTailMember {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("read script value %d: %q is not a number", n, v)
			}
			scores[n] = f
			ints[n] = int64(max(-1<<53, min(f, 1<<53))) // a score of ±inf stays in range
		default:
			return 0, errors.New("read script returned an unexpected value")
		}
	}
	now = ints[vNow]
	s.Pending, s.Due, s.Inflight, s.Expired, s.Dead = ints[vPending], ints[vDue], ints[vInflight], ints[vExpired], ints[vDead]
	s.Paused = ints[vPaused] == 1
	s.Retried = ints[vRetried]
	if !math.IsNaN(scores[vOldestRetried]) {
		// A task a producer scheduled in seconds keeps them in its entry;
		// an undated one has no due time to be late from.
		s.OldestRetriedDueMs, _ = shard.MeantMs(ints[vOldestRetried])
	}
	s.Undated, s.Far = ints[vUndated], ints[vFar]
	scored := func(member, score int) *Scored {
		m, _ := vals[member].(string)
		return &Scored{Member: m, Score: shard.FormatScore(scores[score])}
	}
	if s.Undated > 0 {
		s.FirstUndated = scored(vHeadMember, vHead)
	}
	if s.Far > 0 {
		s.LastFar = scored(vTailMember, vTail)
	}
	// The earliest dated due times: the first task's, and past undated and
	// seconds ones, the first in seconds and the first in ms.
	var dues []int64
	for _, n := range []int{vHead, vSecHead, vMsHead} {
		if math.IsNaN(scores[n]) {
			continue
		}
		if due, ok := shard.MeantMs(ints[n]); ok {
			dues = append(dues, due)
		}
	}
	var pendingAge time.Duration
	for _, due := range dues {
		if s.NextDueMs == 0 || due < s.NextDueMs {
			s.NextDueMs = due
		}
		if due <= now {
			pendingAge = max(pendingAge, time.Duration(now-due)*time.Millisecond)
		}
	}
	s.RetriedAge = retriedAge(s.OldestRetriedDueMs, now)
	s.OldestDueAge = max(pendingAge, s.RetriedAge)
	s.AgeSeconds, s.RetriedAgeSeconds = s.OldestDueAge.Seconds(), s.RetriedAge.Seconds()
	return now, nil
}

func retriedAge(dueMs, nowMs int64) time.Duration {
	if dueMs <= 0 || dueMs > nowMs {
		return 0
	}
	return time.Duration(nowMs-dueMs) * time.Millisecond
}

// Grow sets the ages of a shard that could not be read from its last
// known due times and the server clock nowMs, so that they go on growing:
// a late shard whose primary went away must not look on time.
func (s *Shard) Grow(nowMs int64) {
	s.OldestDueAge, s.RetriedAge = 0, retriedAge(s.OldestRetriedDueMs, nowMs)
	if s.NextDueMs > 0 && s.NextDueMs <= nowMs {
		s.OldestDueAge = time.Duration(nowMs-s.NextDueMs) * time.Millisecond
	}
	s.OldestDueAge = max(s.OldestDueAge, s.RetriedAge)
	s.AgeSeconds, s.RetriedAgeSeconds = s.OldestDueAge.Seconds(), s.RetriedAge.Seconds()
}

// Sum recomputes the queue's sums from its shards. A shard with an error
// counts with the figures it carries (none, unless the caller carried its
// last known ones over).
func (q *Queue) Sum() {
	q.Pending, q.Due, q.Inflight, q.Expired, q.Dead, q.Retried, q.Broken, q.Paused = 0, 0, 0, 0, 0, 0, 0, 0
	q.Undated, q.Far, q.Beyond = 0, 0, 0
	q.OldestDueAge, q.RetriedAge, q.NextDueMs = 0, 0, 0
	q.sum()
}

func (q *Queue) sum() {
	for _, s := range q.Shards {
		if s.Err != "" {
			q.Broken++
		}
		if s.Paused {
			q.Paused++
		}
		q.Pending += s.Pending
		q.Due += s.Due
		q.Inflight += s.Inflight
		q.Expired += s.Expired
		q.Dead += s.Dead
		q.Retried += s.Retried
		q.Undated += s.Undated
		q.Far += s.Far
		if s.Beyond {
			q.Beyond += s.Pending
		}
		q.OldestDueAge = max(q.OldestDueAge, s.OldestDueAge)
		q.AgeSeconds = q.OldestDueAge.Seconds()
		q.RetriedAge = max(q.RetriedAge, s.RetriedAge)
		q.RetriedAgeSeconds = q.RetriedAge.Seconds()
		if s.NextDueMs > 0 && (q.NextDueMs == 0 || s.NextDueMs < q.NextDueMs) {
			q.NextDueMs = s.NextDueMs
		}
	}
}

// wrongType names the first key that is not of its type; keyTypes are
// pairs of a key and its Redis type (zset, hash).
func wrongType(ctx context.Context, rdb redis.UniversalClient, keyTypes ...string) error {
	names := map[string]string{"zset": "a sorted set", "hash": "a hash"}
	for n := 0; n+1 < len(keyTypes); n += 2 {
		k, want := keyTypes[n], keyTypes[n+1]
		if t, err := rdb.Type(ctx, k).Result(); err == nil && t != want && t != "none" {
			return fmt.Errorf("WRONGTYPE key %s holds a %s, not %s", k, t, names[want])
		}
	}
	return errors.New("WRONGTYPE a key of the shard is not of its type")
}

// BrokenShards groups the queue's unreadable shards by error, errors in
// the order first met, each with its shard indexes in order.
func (q Queue) BrokenShards() (errs []string, shards map[string][]int) {
	shards = map[string][]int{}
	for _, s := range q.Shards {
		if s.Err == "" {
			continue
		}
		if shards[s.Err] == nil {
			errs = append(errs, s.Err)
		}
		shards[s.Err] = append(shards[s.Err], s.Index)
	}
	return errs, shards
}

// JoinIndexes writes at most n shard indexes: "0, 1, 2 and 13 more".
func JoinIndexes(idx []int, n int) string {
	parts := make([]string, 0, min(len(idx), n))
	for _, i := range idx[:min(len(idx), n)] {
		parts = append(parts, strconv.Itoa(i))
	}
	list := strings.Join(parts, ", ")
	if len(idx) > n {
		list += " and " + strconv.Itoa(len(idx)-n) + " more"
	}
	return list
}
