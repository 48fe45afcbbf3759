package browse

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/dispatcher/dispatcher/shard"
)

// MaxRead is the most entries one Redis call of a walk reads: every call
// stays short however large the set, so a walk of 10^7 tasks never holds
// Redis.
const MaxRead = 256

// Pos is a place in one sorted set's order, which is (score, member),
// members of equal score in byte order. A walk resumes after a Pos, not
// after a score: a million tasks may share one due time.
type Pos struct {
	Score  float64
	Member string
}

// Bound is one end of a score range: Score is in it, or with Open only
// the scores beyond it.
type Bound struct {
	Score float64
	Open  bool
}

// String writes the bound as ZRANGEBYSCORE and ZCOUNT take it: "5",
// "(5", "-inf", "+inf".
func (b Bound) String() string {
	if b.Open {
		return "(" + FormatScore(b.Score)
	}
	return FormatScore(b.Score)
}

// Range is a range of scores, from Min up to Max.
type Range struct{ Min, Max Bound }

// All is every score.
var All = Range{Min: Bound{Score: math.Inf(-1)}, Max: Bound{Score: math.Inf(1)}}

// from narrows r to begin at b, if b is above r's own start.
func (r Range) from(b Bound) Range {
	if b.Score > r.Min.Score || (b.Score == r.Min.Score && b.Open) {
		r.Min = b
	}
	return r
}

// Order is the direction of a read.
type Order bool

const (
	Asc  Order = false // by (score, member) ascending
	Desc Order = true  // by (score, member) descending
)

// readScript reads the entries that follow a (score, member) position in
// one sorted set, going up or down, within a score range. Where the
// position's member is still there with that score, its rank gives the
// place at once; where it left (dispatched, requeued, purged, cancelled or
// rescheduled), a binary search among the entries of that score finds
// where it was. Then one ZRANGE by rank reads the batch. Each call is
// O(log N + count), plus the search's O(log T) steps of O(log N) among T
// tied entries when the member left: LIMIT with an offset would be
// O(offset) on Redis 7.0, and a score alone cannot tell ties apart. Members are compared byte by byte, as Redis orders them:
// Lua's own < follows the server's locale (strcoll).
//
// KEYS[1] the sorted set (a pending, in-flight or dead-letter set)
// ARGV[1] "asc" or "desc"
// ARGV[2] lowest score, ARGV[3] highest, as ZRANGEBYSCORE takes them (5,
//
//	(5, -inf, +inf)
//
// ARGV[4] the position's score, "" to start at the range's first entry
//
//	in the read's direction (its lowest ascending, its highest
//	descending); a position before that start counts as ""
//
// ARGV[5] the position's member
// ARGV[6] how many entries to return, at least 1
// Returns member, score, member, score... of up to ARGV[6] entries after
// the position, in the read's direction, all within the range.
var readScript = redis.NewScript(`#!lua flags=no-writes
local function before(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local function bound(s)
  local open = string.sub(s, 1, 1) == '('
  if open then s = string.sub(s, 2) end
  local v = tonumber(s)
  if s == '+inf' or s == 'inf' then v = math.huge elseif s == '-inf' then v = -math.huge end
  if v == nil then error('bad score bound ' .. s) end
  return v, open
end
local key, desc = KEYS[1], ARGV[1] == 'desc'
local lo, hi, cs, cm = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local count = tonumber(ARGV[6])
local lov, loopen = bound(lo)
local hiv, hiopen = bound(hi)
local function abovelo(x) if loopen then return x > lov end return x >= lov end
local function belowhi(x) if hiopen then return x < hiv end return x <= hiv end
local s = nil
if cs ~= '' then s = bound(cs) end
-- Past the range's end: nothing follows. Before its start: start there.
if s and ((desc and not abovelo(s)) or (not desc and not belowhi(s))) then
  return {}
end
if s and ((desc and not belowhi(s)) or (not desc and not abovelo(s))) then
  s = nil
end
if not s then
  if desc then
    return redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, count)
  end
  return redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', 0, count)
end
-- r: the rank of the first entry after the position, in the direction.
local r
local cur = redis.call('ZSCORE', key, cm)
if cur and tonumber(cur) == s then
  r = redis.call('ZRANK', key, cm)
  if desc then r = r - 1 else r = r + 1 end
else
  -- The member is not among the entries of score cs, ranks [l, h): find
  -- the first of them above it.
  local l = redis.call('ZCOUNT', key, '-inf', '(' .. cs)
  local h = l + redis.call('ZCOUNT', key, cs, cs)
  while l < h do
    local mid = math.floor((l + h) / 2)
    if before(cm, redis.call('ZRANGE', key, mid, mid)[1]) then
      h = mid
    else
      l = mid + 1
    end
  end
  r = l
  if desc then r = l - 1 end
end
local out = {}
if desc then
  if r < 0 then return out end
  local zs = redis.call('ZRANGE', key, math.max(0, r - count + 1), r, 'WITHSCORES')
  for i = #zs - 1, 1, -2 do
    if not abovelo(tonumber(zs[i + 1])) then break end
    out[#out + 1] = zs[i]
    out[#out + 1] = zs[i + 1]
  end
else
  local zs = redis.call('ZRANGE', key, r, r + count - 1, 'WITHSCORES')
  for i = 1, #zs - 1, 2 do
    if not belowhi(tonumber(zs[i + 1])) then break end
    out[#out + 1] = zs[i]
    out[#out + 1] = zs[i + 1]
  end
end
return out
`)

// FormatScore writes a score for Redis (an argument, a ZRANGEBYSCORE
// bound) and for a cursor: the shortest text that reads back as the same
// float, integral scores (every due time and lease) without a fraction.
func FormatScore(f float64) string { return shard.FormatScore(f) }

// Read returns up to n (at least 1) entries of the sorted set key within
// r, in the order o, after the position after (nil, or one before r's
// start in that order: from that start), and whether the set may hold
// more after them (a full batch). It is one Redis call of O(log N + n)
// (see readScript), however many entries share the position's score and
// whether or not its member is still there: a walk that resumes after the
// last entry of the batch before neither misses nor repeats an entry that
// stayed where it was, whatever left or moved behind it meanwhile.
func Read(ctx context.Context, rdb redis.UniversalClient, key string, r Range, o Order, after *Pos, n int) ([]redis.Z, bool, error) {
	if n < 1 {
		return nil, false, fmt.Errorf("read %s: batch of %d entries", key, n)
	}
	dir, score, member := "asc", "", ""
	if o == Desc {
		dir = "desc"
	}
	if after != nil {
		score, member = FormatScore(after.Score), after.Member
	}
	raw, err := readScript.Run(ctx, rdb, []string{key}, dir, r.Min.String(), r.Max.String(), score, member, n).Slice()
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", key, err)
	}
	zs, err := pairs(raw)
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", key, err)
	}
	return zs, len(zs) == n, nil
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
// millions of entries without reading a whole set. Only the scores in rg
// are walked.
func Batches(ctx context.Context, rdb redis.UniversalClient, key string, rg Range, fn func([]redis.Z) error) error {
	var after *Pos
	for {
		zs, more, err := Read(ctx, rdb, key, rg, Asc, after, MaxRead)
		if err != nil {
			return err
		}
		if len(zs) > 0 {
			if err := fn(zs); err != nil {
				return err
			}
			last := zs[len(zs)-1]
			m, _ := last.Member.(string)
			after = &Pos{Score: last.Score, Member: m}
		}
		if !more {
			return nil
		}
	}
}
