package browse

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// MaxRead is the most entries one Redis call reads: every call stays
// short however large the set, so a walk of 10^7 tasks never holds Redis.
const MaxRead = 256

// Pos is a place in one sorted set's order, which is (score, member),
// members of equal score in byte order. A walk resumes after a Pos, not
// after a score: a million tasks may share one due time.
type Pos struct {
	Score  float64
	Member string
}

// afterScript reads the entries that follow a (score, member) position
// in one sorted set. Where the member is still there with that score, its
// rank gives the place at once; where it left (dispatched, requeued,
// purged, or rescheduled), a binary search among the entries of that score
// finds the first member after it. Both are O(log N): LIMIT with an offset
// would be O(offset) on Redis 7.0, and a score alone cannot tell ties
// apart. Members are compared byte by byte, as Redis orders them: Lua's
// own < follows the server's locale.
//
// KEYS[1] the sorted set (a pending, in-flight or dead-letter set)
// ARGV[1] the position's score
// ARGV[2] the position's member
// ARGV[3] how many entries to return
// Returns member, score, member, score... of up to ARGV[3] entries after
// the position, in the set's order (the caller stops at its own upper
// bound).
var afterScript = redis.NewScript(`#!lua flags=no-writes
local function before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local score, member, count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local r
local cur = redis.call('ZSCORE', KEYS[1], member)
if cur and tonumber(cur) == tonumber(score) then
  r = redis.call('ZRANK', KEYS[1], member) + 1
else
  local lo = redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. score)
  local hi = redis.call('ZCOUNT', KEYS[1], '-inf', score)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if before(member, redis.call('ZRANGE', KEYS[1], mid, mid)[1]) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  r = lo
end
return redis.call('ZRANGE', KEYS[1], r, r + count - 1, 'WITHSCORES')
`)

// start says where a read of one set begins.
type start struct {
	// pos is nil to begin at min (inclusive).
	pos *Pos
	// past, with pos, skips every entry of pos.Score: the shards that
	// come before the cursor's shard gave all of theirs already.
	past bool
}

// span is a read's score range, min and max inclusive (infinite for
// none).
type span struct{ min, max float64 }

var everything = span{math.Inf(-1), math.Inf(1)}

// scoreArg writes a score for Redis and for the cursor: integral scores
// (every due time and lease) without a fraction.
func scoreArg(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// read returns up to n entries of key within sp from st, and whether the
// set may hold more after them (a full batch).
func read(ctx context.Context, rdb redis.UniversalClient, key string, sp span, st start, n int) ([]redis.Z, bool, error) {
	var zs []redis.Z
	var err error
	switch {
	case st.pos == nil || st.pos.Score < sp.min:
		zs, err = rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: scoreArg(sp.min), Stop: scoreArg(sp.max), ByScore: true, Count: int64(n)}).Result()
	case st.past:
		zs, err = rdb.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: key, Start: "(" + scoreArg(st.pos.Score), Stop: scoreArg(sp.max), ByScore: true, Count: int64(n)}).Result()
	default:
		var raw []any
		raw, err = afterScript.Run(ctx, rdb, []string{key}, scoreArg(st.pos.Score), st.pos.Member, n).Slice()
		if err == nil {
			zs, err = pairs(raw)
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", key, err)
	}
	more := len(zs) == n
	for k, z := range zs { // the script reads by rank, past max
		if z.Score > sp.max {
			zs, more = zs[:k], false
			break
		}
	}
	return zs, more, nil
}

// pairs reads the script's member, score... reply.
func pairs(raw []any) ([]redis.Z, error) {
	zs := make([]redis.Z, 0, len(raw)/2)
	for k := 0; k+1 < len(raw); k += 2 {
		m, ok1 := raw[k].(string)
		s, ok2 := raw[k+1].(string)
		f, err := strconv.ParseFloat(s, 64)
		if !ok1 || !ok2 || err != nil {
			return nil, fmt.Errorf("unexpected reply %v", raw[k:k+2])
		}
		zs = append(zs, redis.Z{Score: f, Member: m})
	}
	return zs, nil
}

// Batches calls fn with the entries of one sorted set, MaxRead at a time
// in its order, each batch read after the last entry of the one before:
// fn may remove the entries it is given (requeue, purge) without the walk
// missing or repeating one that stays. It is how bulk changes go through
// millions of entries without reading a whole set.
func Batches(ctx context.Context, rdb redis.UniversalClient, key string, fn func([]redis.Z) error) error {
	st := start{}
	for {
		zs, more, err := read(ctx, rdb, key, everything, st, MaxRead)
		if err != nil {
			return err
		}
		if len(zs) > 0 {
			if err := fn(zs); err != nil {
				return err
			}
			last := zs[len(zs)-1]
			m, _ := last.Member.(string)
			st = start{pos: &Pos{Score: last.Score, Member: m}}
		}
		if !more {
			return nil
		}
	}
}
