package scanner

import "github.com/redis/go-redis/v9"

// In-flight entries are "<due_ms>:<member>": the due time travels with the
// task so that a retry or a reaped task keeps its message_id, and so that
// a member rescheduled while in flight is a separate entry. The due part
// never holds ':', so the first ':' splits the two.
//
// All times are the Redis server's clock (TIME), never an instance's, so
// instances with skewed clocks neither dispatch early nor reap live leases.
// Every script touches only keys of one shard, which share the hash tag
// {Q:i}, so they run on Redis Cluster too. Members are data, never code:
// no script evaluates its input.
//
// Every script here only moves or settles tasks already stored, so each
// declares "#!lua flags=allow-oom": a Redis at maxmemory under noeviction
// refuses a script's first write otherwise (Redis 7), and a full Redis
// would never drain, since forgetting confirmed tasks is what frees its
// memory. With the shebang Redis checks the flags before running a script:
// a read-only replica refuses these outright with READONLY, the read-only
// sweep (batch 0) included, and keys must all come through KEYS.

// claimScript reaps expired leases of a shard back to pending, then moves
// up to a batch of due tasks from pending to in-flight with a lease.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] in-flight set P:{Q:i}:inflight (score = lease deadline ms)
// KEYS[3] attempts hash P:{Q:i}:attempts
// ARGV[1] most tasks to claim (also the most leases to reap); 0 only reads
//
//	when the shard next needs attention, changing nothing
//
// ARGV[2] lease in ms
// Returns {now_ms, next_pending_score|"", next_lease_deadline|"", reaped, entry...};
// reaped counts only leases of tasks that had no failed attempt, i.e. whose
// instance died or stalled, not retries whose backoff ran out.
var claimScript = redis.NewScript(`#!lua flags=allow-oom
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])

-- A lease that ran out belongs to an instance that died or gave up.
-- NX: if the producer rescheduled the member meanwhile, its new time wins.
local reaped = 0
local expired = {}
if limit > 0 then
  expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit)
end
for _, e in ipairs(expired) do
  local sep = string.find(e, ':', 1, true)
  redis.call('ZREM', KEYS[2], e)
  if redis.call('HEXISTS', KEYS[3], e) == 0 then
    reaped = reaped + 1
  end
  if redis.call('ZADD', KEYS[1], 'NX', string.sub(e, 1, sep - 1), string.sub(e, sep + 1)) == 0 then
    redis.call('HDEL', KEYS[3], e)
  end
end

local out = {now, '', '', reaped}
local items = {}
if limit > 0 then
  items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
end
if #items > 0 then
  local deadline = now + tonumber(ARGV[2])
  for i = 1, #items, 2 do
    local e = string.format('%d', math.floor(tonumber(items[i + 1]))) .. ':' .. items[i]
    redis.call('ZADD', KEYS[2], deadline, e)
    out[#out + 1] = e
  end
  -- The claimed tasks are exactly the lowest ranks.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, #items / 2 - 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[2] then out[2] = first[2] end
local lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
if lease[2] then out[3] = lease[2] end
return out
`)

// failScript records failed publishes: a task to retry stays in flight with
// its lease pushed out by the backoff (the claim script's reaper returns it
// to pending then, with its original due time); a task that is poison, or
// has used up its attempts, moves with its reason to the dead-letter set.
//
// KEYS[1] in-flight set
// KEYS[2] attempts hash
// KEYS[3] dead-letter set P:{Q:i}:dead (score = due ms)
// KEYS[4] dead-letter reasons hash P:{Q:i}:dead:reason (member -> reason)
// ARGV[1] first backoff ms, doubled per attempt
// ARGV[2] longest backoff ms
// ARGV[3] attempts after which a "poison" entry is dead-lettered
// ARGV[4..] triples: entry, mode, reason. mode "retry" never dead-letters,
//
//	"poison" dead-letters after ARGV[3] attempts, "dead" at once.
//
// Returns {retried, dead}. Entries no longer in flight are skipped.
var failScript = redis.NewScript(`#!lua flags=allow-oom
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local first, longest, maxAttempts = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local retried, dead = 0, 0
for i = 4, #ARGV, 3 do
  local e, mode, reason = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if redis.call('ZSCORE', KEYS[1], e) then
    local n = redis.call('HINCRBY', KEYS[2], e, 1)
    if mode == 'dead' or (mode == 'poison' and n >= maxAttempts) then
      local sep = string.find(e, ':', 1, true)
      local member = string.sub(e, sep + 1)
      redis.call('ZREM', KEYS[1], e)
      redis.call('HDEL', KEYS[2], e)
      redis.call('ZADD', KEYS[3], string.sub(e, 1, sep - 1), member)
      redis.call('HSET', KEYS[4], member, reason .. ' (after ' .. n .. ' attempts)')
      dead = dead + 1
    else
      local backoff = math.min(first * math.pow(2, math.min(n - 1, 30)), longest)
      redis.call('ZADD', KEYS[1], 'XX', now + backoff, e)
      retried = retried + 1
    end
  end
end
return {retried, dead}
`)

// releaseScript returns in-flight tasks to pending at once, without
// counting an attempt: used on shutdown and when the broker connection is
// lost, neither of which is the task's fault.
//
// KEYS[1] in-flight set
// KEYS[2] pending shard
// ARGV[1..] entries
// Returns how many went back.
var releaseScript = redis.NewScript(`#!lua flags=allow-oom
local n = 0
for _, e in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], e) == 1 then
    local sep = string.find(e, ':', 1, true)
    redis.call('ZADD', KEYS[2], 'NX', string.sub(e, 1, sep - 1), string.sub(e, sep + 1))
    n = n + 1
  end
end
return n
`)

// ackScript forgets confirmed tasks: their in-flight entries and attempt
// counts, atomically. A script rather than MULTI: Redis refuses every
// command queued in a MULTI while at maxmemory, even ZREM, which frees.
//
// KEYS[1] in-flight set
// KEYS[2] attempts hash
// ARGV[1..] entries
// Returns how many entries were still in flight.
var ackScript = redis.NewScript(`#!lua flags=allow-oom
local n = 0
for i = 1, #ARGV, 1000 do
  local j = math.min(i + 999, #ARGV)
  n = n + redis.call('ZREM', KEYS[1], unpack(ARGV, i, j))
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, j))
end
return n
`)
