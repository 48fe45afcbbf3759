package bulk

import "github.com/redis/go-redis/v9"

// actScript touches the keys of one shard only (hash tag {Q:i}), so it
// runs on Redis Cluster, and handles at most one batch: a few hundred
// tasks, O(batch + log N) however large the shard. The batch is read by
// browse.Read, in (score, member) order after the walk's cursor.

// actScript changes one batch of a shard's matching tasks and records the
// run's progress on the shard in the same step, so that a run interrupted
// anywhere resumes without doing a batch twice. Each task is changed only
// if its score is still the one the walk read: the same scheduling still
// pending, as a single cancel or reschedule would find it. Otherwise it was
// claimed, cancelled or rescheduled meanwhile, and is left alone and
// reported. A reschedule also unlists the member from the shard's moving
// hash, as shard.Producer's does; it leaves the member's body and
// properties where they are (they stay with the member). A cancel removes
// them with the member, as a single cancel does, so that no field outlives
// its task.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] its moving hash P:{Q:i}:moving
// KEYS[3] the run's progress on the shard P:{Q:i}:bulk:ID (hash)
// KEYS[4] bodies of pending ids P:{Q:i}:tasks (hash)
// KEYS[5] properties of pending members P:{Q:i}:props (hash)
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
for _, kt in ipairs({{KEYS[1], 'zset'}, {KEYS[2], 'hash'}, {KEYS[3], 'hash'}, {KEYS[4], 'hash'}, {KEYS[5], 'hash'}}) do
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
      redis.call('HDEL', KEYS[4], m)
      redis.call('HDEL', KEYS[5], m)
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
