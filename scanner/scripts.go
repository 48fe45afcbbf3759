package scanner

import "github.com/redis/go-redis/v9"

// In-flight entries are "<due_ms>:<member>": the due time travels with the
// task so that a retry or a reaped task keeps its message_id, and so that
// a member rescheduled while in flight is a separate entry. The due part
// never holds ':', so the first ':' splits the two.
//
// A scheduling, once claimed, stays in the in-flight set until the broker
// confirmed it or it is dead-lettered: reaping and releasing change only
// its lease (the score), in place. So a producer that schedules the same
// member again meanwhile creates a second, separate scheduling in pending,
// and neither swallows the other.
//
// Leases fence stale writers. A claim gives every entry of its batch the
// same lease deadline, unique to that claim, and returns it; fail and release act on an entry
// only while its score is still that deadline. An instance that stalled
// past its lease, whose tasks another instance has reaped, can then
// neither shorten the new holder's lease nor release its live entry; and
// a script that go-redis runs again after a lost reply finds the score
// already changed and does nothing twice. Released entries get lease 0:
// any instance reclaims them at once. A retry's backoff lease ends in
// half a ms, so it never equals a claim's deadline (whole ms).
//
// Scripts check the type of every key they write before their first
// write: Redis does not undo a script's earlier writes when a later call
// fails, so a wrong-type key (someone SET the dead-letter key) found
// half-way would leave a task removed from one set and in no other.
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

// luaPrelude is shared by the scripts: the check that a key is absent or
// of the type a script is about to write.
const luaPrelude = `#!lua flags=allow-oom
local function wrongType(kt)
  for i = 1, #kt, 2 do
    local got = redis.call('TYPE', kt[i])['ok']
    if got ~= 'none' and got ~= kt[i + 1] then
      return 'WRONGTYPE key ' .. kt[i] .. ' holds a ' .. got .. ', not a ' .. kt[i + 1] .. '; nothing changed'
    end
  end
  return nil
end
`

// luaNow reads the server clock in ms, for the scripts that need it (ack
// and release, run once per batch, do not), and in µs (nowUs), which the
// claim returns: the instances' estimate of the server clock, which times
// the publish of tasks claimed ahead, is then not off by up to a ms.
const luaNow = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nowUs = tonumber(t[1]) * 1000000 + tonumber(t[2])
`

// claimRecords is how many of a shard's last claims its :claim record
// keeps: a claim run again with the token of any of them returns its
// batch. Instances whose claims a stalled primary runs when it resumes,
// after they gave up on the answers, each run theirs again with its token.
// The claim script's keep is the same number (a script's source is a
// constant); TestLostClaimTokenSurvivesOtherInstancesClaims checks the two
// agree.
const claimRecords = 8

// claimScript re-leases expired in-flight entries in place and moves
// tasks due within the look-ahead from pending to in-flight, up to a batch
// in all, every one with the same new lease deadline: now + lease, or one
// more than the shard's last deadline if that is not later, so that no two
// claims of a shard share a deadline (the fence) even in the same ms or
// with other leases. A task claimed ahead of its due time is held by the
// instance and published at its due time (see holder.go), never before.
//
// It runs on every claim, so it is written for few commands (Redis counts
// each call inside a script as its work): every key's type is proven by a
// read before the first write (a read of a wrong-type key fails, and
// nothing has changed yet), the claimed tasks go in with one ZADD, and the
// next due times come from what the reads already returned.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] in-flight set P:{Q:i}:inflight (score = lease deadline ms)
// KEYS[3] attempts hash P:{Q:i}:attempts
// KEYS[4] last claims P:{Q:i}:claim (string of "<token> <deadline>" pairs,
//
//	the last claimRecords claims that handed something out, newest last;
//	a version before it wrote only the last, which reads the same)
//
// KEYS[5] pause flag P:{Q:i}:paused: while it exists the claim takes and
//
//	reaps nothing and returns reaped = -1
//
// KEYS[6] bodies of tasks with an id P:{Q:i}:tasks (id -> body)
// KEYS[7] properties P:{Q:i}:props (member -> JSON)
// KEYS[8] claimed bodies P:{Q:i}:claimed:body (entry -> body)
// KEYS[9] claimed properties P:{Q:i}:claimed:props (entry -> JSON)
// KEYS[10] dead-letter set P:{Q:i}:dead
// KEYS[11] dead-letter reasons P:{Q:i}:dead:reason
// KEYS[12] claim owners P:{Q:i}:owners (only with ARGV[6])
//
// A claimed member's body and properties move from KEYS[6]/KEYS[7] to
// KEYS[8]/KEYS[9] under its entry, in the claim: a producer scheduling the
// same id again then writes fields of its own, which this scheduling's ack
// cannot delete. One EXISTS over these and the attempts hash, read in place
// of the attempts hash's TYPE, tells a queue without ids, properties or
// failed tasks that it has none: it pays nothing for them.
//
// ARGV[1] most tasks to claim; 0 only reads when the shard next needs
//
//	attention, changing nothing
//
// ARGV[2] lease in ms
// ARGV[3] claim token, unique per claim, without spaces: a claim run again
//
//	with the token of one of the shard's last claims (its answer was
//	lost) returns what that claim still holds instead of claiming another
//
// ARGV[4] look-ahead in ms (absent: 0): pending tasks due up to now + this
//
//	are claimed
//
// ARGV[5] byte budget (absent or 0: none): the claim stops taking pending
//
//	tasks once their bodies add up to this, one task at least, so that a
//	batch of big bodies does not hold Redis (see docs/performance.md)
//
// ARGV[6] the claiming instance's liveness id (absent or "": none): the
//
//	claim is recorded in KEYS[12] as "<id> <deadline>" with score =
//	deadline, and records of leases already run out are pruned (by one claim in 8), so that
//	the claims of an instance found dead can be handed out at once
//	(handBackScript)
//
// Returns {now_us, next_pending_score|"", next_lease_deadline|"", reaped,
// deadline, then per task: entry, body|nil, properties|nil} (nil: the
// member is its own body; no properties); reaped counts only re-leased entries that had no
// failed attempt and were not released, i.e. whose instance died or
// stalled, not retries whose backoff ran out.
var claimScript = redis.NewScript(luaPrelude + luaNow + `
local keep = 8 -- claimRecords
local limit = tonumber(ARGV[1])
local out = {nowUs, '', '', 0, ''}
if limit > 0 and redis.call('GET', KEYS[5]) then
  out[4] = -1
  limit = 0
end
-- The shard's earliest pending task and earliest lease, into out.
local function withNext()
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[2] then out[2] = first[2] end
  local lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if lease[2] then out[3] = lease[2] end
  return out
end
if limit == 0 then
  return withNext()
end
-- One EXISTS tells a queue without ids, properties or failed tasks (the
-- attempts hash) that it has none: such a claim costs what it did before
-- ids. Only if some exist are the attempts hash's type and which of the
-- others exist read.
local present = redis.call('EXISTS', KEYS[3], KEYS[6], KEYS[7], KEYS[8], KEYS[9])
local hasAttempts, idKeys = false, 0
if present > 0 then
  local got = redis.call('TYPE', KEYS[3])['ok']
  if got ~= 'none' and got ~= 'hash' then
    return redis.error_reply('WRONGTYPE key ' .. KEYS[3] .. ' holds a ' .. got .. ', not a hash; nothing changed')
  end
  hasAttempts = got == 'hash'
  idKeys = present - (hasAttempts and 1 or 0)
end
-- Values of fields of a hash, or none at all (one EXISTS) if it is absent.
local function fields(key, names, from, to)
  if to < from or redis.call('EXISTS', key) == 0 then return {} end
  return redis.call('HMGET', key, unpack(names, from, to))
end
-- The record is "<token> <deadline>" pairs, newest last: the last deadline
-- is the shard's latest (deadlines only grow), and a token among the pairs
-- is a claim run again.
-- (Patterns cost here: an unanchored '(%d+)$' took 17 µs on 8 pairs,
-- '^.* (%d+)$' and plain finds well under one.)
local record = redis.call('GET', KEYS[4]) or ''
local lastDeadline = string.match(record, '^.* (%d+)$')
local mine
local at = string.find(' ' .. record, ' ' .. ARGV[3] .. ' ', 1, true)
if at then mine = string.match(record, '^%d+', at + #ARGV[3] + 1) end
if mine then
  out[5] = mine
  local list = redis.call('ZRANGEBYSCORE', KEYS[2], mine, mine)
  local bodies, props = {}, {}
  if #list > 0 and idKeys > 0 and redis.call('EXISTS', KEYS[8], KEYS[9]) > 0 then
    bodies, props = fields(KEYS[8], list, 1, #list), fields(KEYS[9], list, 1, #list)
  end
  for i = 1, #list do
    out[#out + 1] = list[i]
    out[#out + 1] = bodies[i] or false
    out[#out + 1] = props[i] or false
  end
  return withNext()
end
-- Reads first: they prove the types before anything is written.
-- Deadlines only grow, so no two claims of the shard share one.
local deadline = math.max(now + tonumber(ARGV[2]), (tonumber(lastDeadline) or 0) + 1)
out[5] = string.format('%d', deadline)
local lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local expired = {}
if lease[2] and tonumber(lease[2]) <= now then
  -- Leases that ran out (score 0: released) are re-leased in place.
  expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #expired, 2 do
    if tonumber(expired[i + 1]) > 0 and not (hasAttempts and redis.call('HEXISTS', KEYS[3], expired[i]) == 1) then
      out[4] = out[4] + 1
    end
  end
end
local room = limit - #expired / 2
local upto = now + tonumber(ARGV[4] or '0')
local budget = tonumber(ARGV[5] or '0')
local new, members, bodies, props, taken, bytes = {}, {}, {}, {}, 0, 0
-- Which of the id keys exist: read only where the EXISTS above found some.
local withIDs, withProps, withClaimed = false, false, false
if idKeys > 0 then
  withIDs = redis.call('EXISTS', KEYS[6]) == 1
  withProps = redis.call('EXISTS', KEYS[7]) == 1
  withClaimed = true
end
-- With a byte budget, the first read takes one task to weigh the bodies;
-- each next read takes what the budget left holds at the bodies' mean
-- size so far, and at most 8 times as many as were read: big bodies stop
-- the claim at the budget before they are copied, and a batch of small
-- ones takes three or four reads.
local want = room
if budget > 0 then want = math.min(room, 1) end
local lastScore, lastDue
while want > 0 do
  local items = redis.call('ZRANGE', KEYS[1], '-inf', upto, 'BYSCORE', 'LIMIT', taken, want, 'WITHSCORES')
  -- Bodies and properties, read with their members: the budget weighs
  -- them too.
  local got, gotP = {}, {}
  if (withIDs or withProps) and #items > 0 then
    local names = {}
    for i = 1, #items, 2 do names[#names + 1] = items[i] end
    if withIDs then got = redis.call('HMGET', KEYS[6], unpack(names)) end
    if withProps then gotP = redis.call('HMGET', KEYS[7], unpack(names)) end
  end
  for i = 1, #items, 2 do
    -- A herd shares one due time: format it once. A score below -2^53
    -- (-inf too) is no integer ms: due at 0 (%d of it is undefined in C).
    if items[i + 1] ~= lastScore then
      lastScore = items[i + 1]
      local due = math.floor(tonumber(lastScore))
      if due < -9007199254740992 then due = 0 end
      lastDue = string.format('%d', due)
    end
    taken = taken + 1
    new[taken] = lastDue .. ':' .. items[i]
    members[taken] = items[i]
    bodies[taken] = got[(i + 1) / 2] or false
    props[taken] = gotP[(i + 1) / 2] or false
    bytes = bytes + #(bodies[taken] or items[i]) + #(props[taken] or '')
    if budget > 0 and bytes >= budget then break end
  end
  if #items < 2 * want or (budget > 0 and bytes >= budget) then break end
  want = room - taken
  if budget > 0 then
    want = math.min(want, 8 * taken)
    if bytes > 0 then
      want = math.min(want, math.max(1, math.floor((budget - bytes) * taken / bytes)))
    end
  end
end
-- The next pending task: the first not taken (its rank is the count taken).
local first = redis.call('ZRANGE', KEYS[1], taken, taken, 'WITHSCORES')
if first[2] then out[2] = first[2] end
local d = out[5]
local isFresh = {}
local moved = {} -- indexes whose body or properties move with the claim
local anyBody, anyProps = false, false
for i = 1, taken do
  if bodies[i] then anyBody = true end
  if props[i] then anyProps = true end
  if bodies[i] or props[i] then moved[#moved + 1] = i end
end
-- The re-leased entries' bodies, read before the first write.
local reLeased = {}
for i = 1, #expired, 2 do reLeased[#reLeased + 1] = expired[i] end
local reBodies, reProps = {}, {}
if withClaimed then
  reBodies, reProps = fields(KEYS[8], reLeased, 1, #reLeased), fields(KEYS[9], reLeased, 1, #reLeased)
end
-- A scheduling claimed again whose entry is a dead letter (the producer
-- scheduled the id anew at the same due time: the same message_id)
-- supersedes that dead letter, which would otherwise share its claimed
-- fields with the new entry. Only where claimed fields exist at all; a
-- dead-letter key of the wrong type does not hold up dispatching (the
-- dead letter, if any, is left as it is).
local deadHit, anyDead = {}, false
if withClaimed and taken > 0 then
  local hit = redis.pcall('ZMSCORE', KEYS[10], unpack(new, 1, taken))
  if type(hit) == 'table' then
    for i = 1, taken do
      if hit[i] then anyDead = true end
    end
    local rt = redis.call('TYPE', KEYS[11])['ok']
    if anyDead and rt ~= 'hash' and rt ~= 'none' then anyDead = false end
    if anyDead then deadHit = hit end
  end
end
if #moved > 0 or anyDead then
  local bad = wrongType({KEYS[8], 'hash', KEYS[9], 'hash'})
  if bad then return redis.error_reply(bad) end
end
local owner = ARGV[6] or ''
if owner ~= '' and (taken > 0 or #expired > 0) then
  -- The first write: on a wrong-type key it fails with nothing changed.
  -- (A claim whose pending tasks all turn out to be in flight already
  -- records a claim of nothing: the hand-back finds no entry under it.)
  redis.call('ZADD', KEYS[12], d, owner .. ' ' .. d)
  -- Records whose lease ran out are pruned by one claim in 8 (by its
  -- deadline): the hand-back reads only live ones, so the others cost
  -- memory alone, a few leases' worth of claims at most.
  if deadline % 8 == 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[12], '-inf', '(' .. now)
  end
end
if taken > 0 then
  -- Before the expired are re-leased: an entry both pending and expired in
  -- flight must not be counted as this claim's twice.
  -- The same member and due time already in flight is the same
  -- scheduling (one message_id), which its holder delivers with the body
  -- it was claimed with: the claim's own entries are those absent before
  -- its ZADD (NX leaves the others alone). Read before the write, not
  -- told apart by lease after it: another entry's lease may equal this
  -- claim's deadline. An empty in-flight set holds none (no read).
  for i = 1, taken do isFresh[i] = true end
  if lease[2] then
    for i = 1, taken, 500 do
      local held = redis.call('ZMSCORE', KEYS[2], unpack(new, i, math.min(i + 499, taken)))
      for j = 1, #held do
        if held[j] then isFresh[i + j - 1] = false end
      end
    end
  end
  for i = 1, taken, 500 do
    local args = {'NX'}
    for j = i, math.min(i + 499, taken) do
      args[#args + 1] = d
      args[#args + 1] = new[j]
    end
    redis.call('ZADD', KEYS[2], unpack(args))
  end
  if anyDead then
    local gone = {}
    for i = 1, taken do
      if deadHit[i] and isFresh[i] then gone[#gone + 1] = new[i] end
    end
    if #gone > 0 then
      redis.call('ZREM', KEYS[10], unpack(gone))
      redis.call('HDEL', KEYS[11], unpack(gone))
      redis.call('HDEL', KEYS[8], unpack(gone))
      redis.call('HDEL', KEYS[9], unpack(gone))
    end
  end
  if #moved > 0 then
    local hb, hp, del = {}, {}, {}
    for _, i in ipairs(moved) do
      if isFresh[i] then
        if bodies[i] then hb[#hb + 1] = new[i]; hb[#hb + 1] = bodies[i] end
        if props[i] then hp[#hp + 1] = new[i]; hp[#hp + 1] = props[i] end
      end
      del[#del + 1] = members[i]
    end
    if #hb > 0 then redis.call('HSET', KEYS[8], unpack(hb)) end
    if #hp > 0 then redis.call('HSET', KEYS[9], unpack(hp)) end
    if anyBody then redis.call('HDEL', KEYS[6], unpack(del)) end
    if anyProps then redis.call('HDEL', KEYS[7], unpack(del)) end
  end
  -- The claimed tasks are exactly the lowest ranks.
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, taken - 1)
end
for i = 1, #expired, 1000 do
  local args = {}
  for j = i, math.min(i + 999, #expired), 2 do
    args[#args + 1] = d
    args[#args + 1] = expired[j]
  end
  redis.call('ZADD', KEYS[2], unpack(args))
end
for i = 1, #reLeased do
  out[#out + 1] = reLeased[i]
  out[#out + 1] = reBodies[i] or false
  out[#out + 1] = reProps[i] or false
end
for i = 1, taken do
  if isFresh[i] then
    out[#out + 1] = new[i]
    out[#out + 1] = bodies[i]
    out[#out + 1] = props[i] or false
  end
end

if #out > 5 then
  -- This claim's pair goes last, after the last keep - 1 others: a
  -- record of keep pairs (2 keep - 1 spaces) or more loses its first; one
  -- that is not pairs is replaced.
  local spaces, at = 0, 0
  repeat
    at = string.find(record, ' ', at + 1, true)
    if at then spaces = spaces + 1 end
  until not at
  if not lastDeadline then
    record = ''
  elseif spaces >= 2 * keep - 1 then
    at = 0
    for _ = 1, spaces - 2 * keep + 3 do at = string.find(record, ' ', at + 1, true) end
    record = string.sub(record, at + 1)
  end
  if record ~= '' then record = record .. ' ' end
  redis.call('SET', KEYS[4], record .. ARGV[3] .. ' ' .. d)
end
if #expired > 0 then
  lease = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if lease[2] then out[3] = lease[2] end
elseif lease[2] then
  out[3] = lease[2]
  if #out > 5 and deadline < tonumber(lease[2]) then out[3] = d end
elseif #out > 5 then
  out[3] = d
end
return out
`)

// failScript records failed publishes of entries still under the caller's
// lease: a task to retry stays in flight with its lease pushed out by the
// backoff (a claim re-leases it then, with its original due time); a task
// that is poison, or has used up its attempts, moves with its reason to
// the dead-letter set.
//
// A retried entry is also indexed by its due time in the retrying set, so
// that how late the oldest retried task is can be read without a scan
// (internal/queuestate); the entry leaves it when it is confirmed (ackScript)
// or dead-lettered. An instance of a version without the index acks
// without removing it: such stale entries (no longer in the attempts hash)
// are skipped by the reads and trimmed from the front here.
//
// KEYS[1] in-flight set
// KEYS[2] attempts hash
// KEYS[3] dead-letter set P:{Q:i}:dead (member = entry, score = due ms)
// KEYS[4] dead-letter reasons hash P:{Q:i}:dead:reason (entry -> reason)
// KEYS[5] retrying set P:{Q:i}:retrying (member = entry, score = due ms)
// ARGV[1] first backoff ms, doubled per attempt
// ARGV[2] longest backoff ms
// ARGV[3] attempts after which a "poison" entry is dead-lettered
// ARGV[4] the lease deadline the caller's claim set
// ARGV[5..] triples: entry, mode, reason. mode "retry" never dead-letters,
//
//	"poison" dead-letters after ARGV[3] attempts, "dead" at once.
//
// Returns {retried, dead}. Entries no longer under that lease (settled, or
// reaped by another instance) are skipped.
var failScript = redis.NewScript(luaPrelude + luaNow + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'zset'})
if bad then return redis.error_reply(bad) end
local first, longest, maxAttempts = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local held = tonumber(ARGV[4])
local retried, dead = 0, 0
for i = 5, #ARGV, 3 do
  local e, mode, reason = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local score = redis.call('ZSCORE', KEYS[1], e)
  if score and tonumber(score) == held then
    local n = redis.call('HINCRBY', KEYS[2], e, 1)
    local sep = string.find(e, ':', 1, true)
    local due = sep and tonumber(string.sub(e, 1, sep - 1)) or 0
    if mode == 'dead' or (mode == 'poison' and n >= maxAttempts) then
      -- Written before the in-flight entry goes.
      redis.call('ZADD', KEYS[3], due, e)
      redis.call('HSET', KEYS[4], e, reason .. ' (after ' .. n .. ' attempts)')
      redis.call('ZREM', KEYS[1], e)
      redis.call('HDEL', KEYS[2], e)
      redis.call('ZREM', KEYS[5], e)
      dead = dead + 1
    else
      -- Half a ms on top: a retry's lease is never a claim's (whole ms)
      -- deadline, so no fence, and no claim run again, can match it.
      local until_ = now + math.min(first * math.pow(2, math.min(n - 1, 30)), longest) + 0.5
      redis.call('ZADD', KEYS[1], 'XX', string.format('%.1f', until_), e)
      redis.call('ZADD', KEYS[5], due, e)
      retried = retried + 1
    end
  end
end
-- Stale index entries at the front (acked by an older version), a few
-- per call: the reads skip them meanwhile.
for _, e in ipairs(redis.call('ZRANGE', KEYS[5], 0, 15)) do
  if redis.call('HEXISTS', KEYS[2], e) == 1 then break end
  redis.call('ZREM', KEYS[5], e)
end
return {retried, dead}
`)

// handBackScript hands out again at once (lease 0, as releaseScript
// does) the in-flight entries of the claims an instance recorded as its own
// in the claim (ARGV[6] there), once that instance is known dead: its
// liveness record went stale while no connection of it was left (see
// internal/liveness). Only claims whose lease has not run out are looked
// at (the others any claim re-leases anyway), and an entry moves only
// while its score is still that claim's deadline: an entry another
// instance re-leased, failed or settled meanwhile is left alone. Running
// it twice finds nothing the second time.
//
// KEYS[1] in-flight set P:{Q:i}:inflight
// KEYS[2] claim owners P:{Q:i}:owners
// ARGV[1] the dead instance's liveness id
// Returns how many entries were handed out.
var handBackScript = redis.NewScript(luaPrelude + luaNow + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'zset'})
if bad then return redis.error_reply(bad) end
local prefix = ARGV[1] .. ' '
local n = 0
for _, rec in ipairs(redis.call('ZRANGE', KEYS[2], now, '+inf', 'BYSCORE')) do
  if string.sub(rec, 1, #prefix) == prefix then
    local d = string.sub(rec, #prefix + 1)
    local es = redis.call('ZRANGE', KEYS[1], d, d, 'BYSCORE')
    for i = 1, #es, 500 do
      local args = {'XX'}
      for j = i, math.min(i + 499, #es) do
        args[#args + 1] = 0
        args[#args + 1] = es[j]
      end
      redis.call('ZADD', KEYS[1], unpack(args))
    end
    n = n + #es
    redis.call('ZREM', KEYS[2], rec)
  end
end
return n
`)

// releaseScript hands in-flight entries still under the caller's lease
// back at once, without counting an attempt: used on shutdown and when the
// broker connection is lost, neither of which is the task's fault. Their
// lease becomes 0, so the next claim on the shard, by any instance, takes
// them first; they stay in flight, so a producer's later ZADD of the same
// member stays a separate scheduling.
//
// KEYS[1] in-flight set
// ARGV[1] the lease deadline the caller's claim set
// ARGV[2..] entries
// Returns how many were released.
var releaseScript = redis.NewScript(luaPrelude + `
local bad = wrongType({KEYS[1], 'zset'})
if bad then return redis.error_reply(bad) end
local held = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == held then
    redis.call('ZADD', KEYS[1], 'XX', 0, ARGV[i])
    n = n + 1
  end
end
return n
`)

// unclaimScript puts tasks claimed ahead and never published back into
// pending, as if never claimed, when their instance stops: they can be
// cancelled again, and nothing is left in flight after a clean stop. An
// entry goes back only while it is still under the caller's lease (the
// fence) and has no failed attempt; and only if its member is not pending
// again (a producer scheduled it anew meanwhile: a second scheduling,
// which this one must not overwrite). Those that cannot go back are
// released instead (lease 0), as releaseScript does. A task that goes
// back takes its claimed body and properties back to the id's fields.
//
// KEYS[1] pending shard
// KEYS[2] in-flight set
// KEYS[3] attempts hash
// KEYS[4] bodies of ids P:{Q:i}:tasks
// KEYS[5] properties P:{Q:i}:props
// KEYS[6] claimed bodies
// KEYS[7] claimed properties
// ARGV[1] the lease deadline the caller's claim set
// ARGV[2..] entries
// Returns {back to pending, released}.
var unclaimScript = redis.NewScript(luaPrelude + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'zset', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash', KEYS[6], 'hash', KEYS[7], 'hash'})
if bad then return redis.error_reply(bad) end
local held = tonumber(ARGV[1])
local back, released = 0, 0
-- Field f of key k moves to field t of key to, if it exists.
local function moveField(k, f, to, t)
  local v = redis.call('HGET', k, f)
  if v then
    redis.call('HSET', to, t, v)
    redis.call('HDEL', k, f)
  end
end
for i = 2, #ARGV do
  local e = ARGV[i]
  local score = redis.call('ZSCORE', KEYS[2], e)
  if score and tonumber(score) == held then
    local sep = string.find(e, ':', 1, true)
    local member = string.sub(e, sep + 1)
    if redis.call('ZSCORE', KEYS[1], member) == false and redis.call('HEXISTS', KEYS[3], e) == 0 then
      moveField(KEYS[6], e, KEYS[4], member)
      moveField(KEYS[7], e, KEYS[5], member)
      redis.call('ZADD', KEYS[1], string.sub(e, 1, sep - 1), member)
      redis.call('ZREM', KEYS[2], e)
      back = back + 1
    else
      redis.call('ZADD', KEYS[2], 'XX', 0, e)
      released = released + 1
    end
  end
end
return {back, released}
`)

// ackScript forgets confirmed tasks: their in-flight entries and attempt
// counts, atomically. Whoever holds the lease now: the broker has the
// message with this message_id, and another holder's publish would only
// be a duplicate. A script rather than MULTI: Redis refuses every command
// queued in a MULTI while at maxmemory, even ZREM, which frees.
//
// One call acks several shards of a queue (an instance's acks of one
// moment, see acker): the call's fixed cost, paid once, is most of an
// ack's. Their keys must then be on one server; on Redis Cluster each
// shard is acked on its own (k = 1). A shard whose ack fails (a key of the
// wrong type) reports its error, and the others are acked all the same:
// one broken shard must not have every other shard's tasks sent again.
//
// An entry that failed before (in the attempts hash) also leaves the
// retrying index, and an entry with an id leaves its claimed body and
// properties (only those of entries still in flight: a dead letter keeps
// its own). One EXISTS over every shard's attempts and claimed fields
// tells whether there are any: a queue without ids whose tasks never
// failed pays that one command per call, and a ZREM per shard.
//
// KEYS five per shard, shard by shard:
//
//	in-flight set P:{Q:i}:inflight, attempts hash P:{Q:i}:attempts,
//	retrying set P:{Q:i}:retrying, claimed bodies P:{Q:i}:claimed:body,
//	claimed properties P:{Q:i}:claimed:props
//
// ARGV[1] k, the number of shards
// ARGV[2..k+1] how many entries each shard has
// ARGV[k+2..] the entries, shard by shard
//
// Returns per shard how many of its entries were still in flight, or the
// error (a string) that stopped its ack.
var ackScript = redis.NewScript(luaPrelude + `
local k = tonumber(ARGV[1])
local probe = {}
for s = 0, k - 1 do
  probe[#probe + 1] = KEYS[5 * s + 2]
  probe[#probe + 1] = KEYS[5 * s + 4]
  probe[#probe + 1] = KEYS[5 * s + 5]
end
local extra = redis.call('EXISTS', unpack(probe)) > 0
local out = {}
local at = k + 2
for s = 0, k - 1 do
  local kin, katt, kret, kb, kp = KEYS[5 * s + 1], KEYS[5 * s + 2], KEYS[5 * s + 3], KEYS[5 * s + 4], KEYS[5 * s + 5]
  local last = at + tonumber(ARGV[2 + s]) - 1
  local withIDs = extra and redis.call('EXISTS', kb, kp) > 0
  local n = 0
  for i = at, last, 1000 do
    local j = math.min(i + 999, last)
    -- Only the fields of entries still in flight go: one that is not may
    -- have been dead-lettered since, and a dead letter keeps its own.
    -- A wrong-type in-flight key fails here, before this shard changed.
    local held = {}
    if withIDs then
      local scores = redis.pcall('ZMSCORE', kin, unpack(ARGV, i, j))
      if scores.err then n = scores.err; break end
      for x = i, j do
        if scores[x - i + 1] then held[#held + 1] = ARGV[x] end
      end
    end
    local gone = redis.pcall('ZREM', kin, unpack(ARGV, i, j))
    if type(gone) ~= 'number' then n = gone.err; break end
    n = n + gone
    if #held > 0 then
      redis.pcall('HDEL', kb, unpack(held))
      redis.pcall('HDEL', kp, unpack(held))
    end
    -- A wrong-type attempts or retrying key must not keep delivered tasks
    -- in flight.
    if extra then
      local failed = redis.pcall('HDEL', katt, unpack(ARGV, i, j))
      if type(failed) == 'number' and failed > 0 then
        redis.pcall('ZREM', kret, unpack(ARGV, i, j))
      end
    end
  end
  out[s + 1] = n
  at = last + 1
end
return out
`)

// sweepScript reads, for the shards of one sweep, when each next needs a
// claim: its earliest pending task and its earliest lease, as the claim
// script with a limit of 0 does for one shard. One call per sweep of a
// queue on one Redis (not on a cluster, where the shards' keys live in
// different slots): a quiet queue's shards hold nothing, and one EXISTS
// over all their keys tells so, so an empty queue costs a sweep three
// commands however many shards it has, not two reads a shard.
//
// Like the claim script it is refused by a replica (READONLY), so that a
// sweep finds out about a failover as a claim would. A shard's read that
// fails (a key of the wrong type) is that shard's error in the reply; the
// other shards' reads stand.
//
// KEYS[2i-1], KEYS[2i] the pending set and the in-flight set of the
// sweep's i-th shard
// ARGV[1] "1": look with EXISTS first (the queue was found empty last);
// otherwise read every shard (a busy queue would pay the EXISTS for nothing)
// Returns {now_us, then per shard: earliest pending score|"", earliest
// lease|""} (an error in place of a shard's pair of values).
var sweepScript = redis.NewScript(`#!lua flags=allow-oom
local t = redis.call('TIME')
local out = {tonumber(t[1]) * 1000000 + tonumber(t[2])}
local any = ARGV[1] ~= '1'
for i = 1, #KEYS, 1000 do
  if any then break end
  if redis.call('EXISTS', unpack(KEYS, i, math.min(i + 999, #KEYS))) > 0 then
    any = true
    break
  end
end
for i = 1, #KEYS, 2 do
  local p, l = '', ''
  if any then
    p = redis.pcall('ZRANGE', KEYS[i], 0, 0, 'WITHSCORES')
    if not p.err then
      l = redis.pcall('ZRANGE', KEYS[i + 1], 0, 0, 'WITHSCORES')
    end
    if p.err then
      l = p
    elseif l.err then
      p = l
    else
      p, l = p[2] or '', l[2] or ''
    end
  end
  out[#out + 1] = p
  out[#out + 1] = l
end
return out
`)
