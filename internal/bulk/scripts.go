package bulk

import "github.com/redis/go-redis/v9"

// Both scripts touch the keys of one shard only (hash tag {Q:i}), so they
// run on Redis Cluster, and each handles at most one batch: a few hundred
// tasks, O(batch + log N) however large the shard.

// luaAfter compares members in byte order, as Redis orders the members of
// equal score; Lua's < on strings follows the server's locale (strcoll).
const luaAfter = `
local function after(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
`

// readScript reads the next batch of a shard's walk in (score, member)
// order, after a cursor. The cursor is a position, not a score: a million
// tasks can share one due time, so the tasks of the cursor's score after
// its member are found by a binary search of their ranks (members of one
// score are in byte order), whether or not the cursor's own task is still
// there.
//
// KEYS[1] pending shard P:{Q:i}
// ARGV[1] "asc" or "desc"
// ARGV[2] lowest score, ARGV[3] highest (ZRANGEBYSCORE bounds: 5, (5, -inf)
// ARGV[4] cursor score, "" to start at the walk's first task
// ARGV[5] cursor member
// ARGV[6] batch size
// Returns member1, score1, member2, score2, ... in walk order.
var readScript = redis.NewScript(luaAfter + `
local key, dir, lo, hi, cs, cm = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local limit = tonumber(ARGV[6])
if cs == '' then
  if dir == 'asc' then
    return redis.call('ZRANGEBYSCORE', key, lo, hi, 'WITHSCORES', 'LIMIT', 0, limit)
  end
  return redis.call('ZREVRANGEBYSCORE', key, hi, lo, 'WITHSCORES', 'LIMIT', 0, limit)
end
local a = redis.call('ZCOUNT', key, '-inf', '(' .. cs)
local b = a + redis.call('ZCOUNT', key, cs, cs)
-- l: the first rank in [a, b) past the cursor: member > cm ascending,
-- member >= cm descending (the walk then goes down from l - 1).
local l, h = a, b
while l < h do
  local mid = math.floor((l + h) / 2)
  local m = redis.call('ZRANGE', key, mid, mid)[1]
  local past
  if dir == 'asc' then past = after(m, cm) else past = not after(cm, m) end
  if past then h = mid else l = mid + 1 end
end
local out = {}
if dir == 'asc' then
  if l < b then
    out = redis.call('ZRANGE', key, l, math.min(b, l + limit) - 1, 'WITHSCORES')
  end
  local room = limit - #out / 2
  if room > 0 then
    local more = redis.call('ZRANGEBYSCORE', key, '(' .. cs, hi, 'WITHSCORES', 'LIMIT', 0, room)
    for i = 1, #more do out[#out + 1] = more[i] end
  end
else
  if l > a then
    local r = redis.call('ZRANGE', key, math.max(a, l - limit), l - 1, 'WITHSCORES')
    for i = #r - 1, 1, -2 do
      out[#out + 1] = r[i]
      out[#out + 1] = r[i + 1]
    end
  end
  local room = limit - #out / 2
  if room > 0 then
    local more = redis.call('ZREVRANGEBYSCORE', key, '(' .. cs, lo, 'WITHSCORES', 'LIMIT', 0, room)
    for i = 1, #more do out[#out + 1] = more[i] end
  end
end
return out
`)

// actScript changes one batch of a shard's matching tasks and records the
// run's progress on the shard in the same step, so that a run interrupted
// anywhere resumes without doing a batch twice. Each task is changed only
// if its score is still the one the walk read: the same scheduling still
// pending, as a single cancel or reschedule would find it. Otherwise it was
// claimed, cancelled or rescheduled meanwhile, and is left alone and
// reported. A reschedule also unlists the member from the shard's moving
// hash, as shard.Producer's does.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] its moving hash P:{Q:i}:moving
// KEYS[3] the run's progress on the shard P:{Q:i}:bulk:ID (hash)
// ARGV[1] "cancel", "by" (shift by ARGV[2] ms) or "at" (due at ARGV[2] ms)
// ARGV[2] ms, see ARGV[1]
// ARGV[3] the progress's seq the caller read (0: none yet): another
//
//	process continuing the same run makes it differ, and nothing changes
//
// ARGV[4] the progress's TTL in ms
// ARGV[5..8] the progress after this batch: phase, cursor score (""
//
//	for the phase's start), cursor member, done ("1" or "0")
//
// ARGV[9..] member, score read, member, score read, ...
// Returns {changed, skipped, earliest new due ms or -1, first skipped
// members (up to 10)...}, or {-1} when the seq differs.
var actScript = redis.NewScript(`
for _, kt in ipairs({{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[3], 'hash'}}) do
  local got = redis.call('TYPE', kt[1])['ok']
  if got ~= 'none' and got ~= kt[2] then
    return redis.error_reply('WRONGTYPE key ' .. kt[1] .. ' holds a ' .. got .. ', not a ' .. kt[2] .. '; nothing changed')
  end
end
local seq = tonumber(redis.call('HGET', KEYS[3], 'seq') or '0')
if seq ~= tonumber(ARGV[3]) then
  return {-1}
end
local mode, ms = ARGV[1], tonumber(ARGV[2])
local changed, skipped, earliest = 0, 0, -1
local sample = {}
for i = 9, #ARGV, 2 do
  local m = ARGV[i]
  local s = redis.call('ZSCORE', KEYS[1], m)
  if s and tonumber(s) == tonumber(ARGV[i + 1]) then
    if mode == 'cancel' then
      redis.call('ZREM', KEYS[1], m)
    else
      local due = ms
      if mode == 'by' then due = tonumber(s) + ms end
      redis.call('ZADD', KEYS[1], string.format('%d', due), m)
      redis.call('HDEL', KEYS[2], m)
      if earliest < 0 or due < earliest then earliest = due end
    end
    changed = changed + 1
  else
    skipped = skipped + 1
    if #sample < 10 then sample[#sample + 1] = m end
  end
end
redis.call('HSET', KEYS[3], 'seq', seq + 1, 'phase', ARGV[5], 'score', ARGV[6], 'member', ARGV[7], 'done', ARGV[8])
redis.call('HINCRBY', KEYS[3], 'matched', (#ARGV - 8) / 2)
redis.call('HINCRBY', KEYS[3], 'changed', changed)
redis.call('HINCRBY', KEYS[3], 'skipped', skipped)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
local out = {changed, skipped, string.format('%d', earliest)}
for _, m in ipairs(sample) do out[#out + 1] = m end
return out
`)
