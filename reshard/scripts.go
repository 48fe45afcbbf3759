package reshard

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// A move of pending tasks between two shards cannot be atomic on Redis
// Cluster (the shards' hash tags {Q:i} and {Q:j} name different slots),
// so it goes in steps, each one script on one shard, ordered so that a
// task is never in neither shard. Each batch has a token of its own, and
// lists the members it works on under it in the shards' moving hashes
// (P:{Q:i}:moving, member -> token); a copy it writes carries a marker
// score, its due time plus half a millisecond, which no producer writes
// (the contract's scores are whole milliseconds). A producer's write
// therefore always changes what a batch wrote, even a ZADD of the very
// score already there, and a later step sees it:
//
//  0. markScript, on the source: each task still as scanned gets the
//     marker score (its due time is unchanged: claims floor it, so its
//     message_id is too) and is listed under the batch's token, and its
//     body and properties are read. A task changed or gone since the scan
//     is left out (the next pass moves it as it is then).
//  1. addScript, on the destination: add each task with the marker score,
//     listed under the token, unless its member is pending there already
//     (a producer on the new M wrote it, or another batch: the new
//     layout's copy wins). Such a copy is unlisted and its marker, if it
//     has one, turned into its whole due time: step 2 may now remove the
//     source's copy on the strength of it, so no undo may remove it.
//  2. takeScript, on the source: remove each task only if it still has
//     the marker and is still listed under the token: a producer that
//     rescheduled, cancelled or wrote the task again (even with the same
//     due time) meanwhile, or another batch that marked it since, leaves
//     it alone.
//  3. undoScript, on the destination: for what step 1 added and is still
//     listed under the token with the marker, remove it if step 2 left the
//     source's copy alone, else give it its whole due time; unlist the
//     batch's members.
//
// So no step removes a copy that a producer wrote after the batch's scan,
// or that another batch wrote: the task a producer scheduled last is never
// lost. (Without the marker, a raw ZADD of the score already there cannot
// be told from no write: an undo removed a same-score schedule that a
// producer on the new M wrote after an old-M producer cancelled the task,
// and a take removed a same-score schedule again in the source after the
// destination's copy was cancelled. Without the token, a batch of a mover
// that lost its lock removed, at its undo, the copy the next holder's
// batch had added with the same score, whose take then removed the source.)
// The layout-aware producers also unlist a member when they write it
// during a change (shard.Producer's scheduleScript): harmless now, and
// what older movers relied on.
//
// Scores beyond 2^52 ms (the year 144,000) have no room for the marker:
// their copies carry the score read, and only the token tells them apart.
//
// A process that dies between the steps leaves the task in both shards
// (with one due time and one message_id, which consumers deduplicate were
// both dispatched) or its copies marked: the next pass marks the source's
// copy again and finishes the move; a marker left on the only copy delays
// it by half a millisecond. A process that dies after step 1 also leaves
// the copies it added whose source was cancelled meanwhile: those tasks
// are delivered although cancelled. Only tasks due later than the mover's
// horizon are moved, so no dispatcher claims one between the steps.
//
// One mover runs at a time (the lock), but a mover that lost its lock
// (paused past its TTL) runs its page's steps to their end while the next
// holder moves: two batches of one task may interleave. The tokens keep
// each batch to its own copies, and a copy that a step 1 found is never
// undone (above). What two such movers still cost is what a mover that
// died costs: a copy that the other batch confirmed is not undone, so a
// task cancelled (or rescheduled) by an old-M producer during both
// batches may be delivered (at its old due time). A lock checked inside
// the step scripts cannot replace this: the lock's key {Q} and the
// shards' keys {Q:i} are in different slots on Redis Cluster, so no
// script sees both.

// movingTTL bounds how long the moving hash outlives a mover that died
// between its steps (its entries are harmless: each step acts only on its
// own batch's token).
const movingTTL = time.Hour

// A task's body and properties travel with it. A pending member's live in
// the fields named by the member of its shard's P:{Q:i}:tasks and
// P:{Q:i}:props; an in-flight or dead entry's in P:{Q:i}:claimed:body and
// P:{Q:i}:claimed:props, under the entry. The mover reads them on the
// source with the batch (pending tasks: in the mark), and each step
// carries them:
//
//   - step 1 writes the fields read into the destination with each task
//     it adds (and deletes a field the task had none of, so that nothing
//     left there attaches to it); a task already there keeps its own
//     fields, as it keeps its score;
//   - step 2 removes a task from the source only if its fields are still
//     the ones read (compared by SHA1), and removes its fields with it: a
//     schedule again with another body or properties by an old-count
//     producer meanwhile is left alone, and moves on the next pass, as a
//     reschedule does. Since step 1 ran first, a task's fields are never
//     deleted from the source before they are in the destination (the
//     destination's own, when its copy wins by the conflict rule);
//   - step 3 undoes an add only if its fields are still the ones step 1
//     wrote, and removes them with it (a producer's write in the
//     destination, which the contract's MULTI makes with a ZADD, already
//     took the marker away).
//
// In the scripts' arguments a task's fields are "has" (1: a body, 2:
// properties, 3: both, 0: none) and the values, or their SHA1 in hex
// ("": absent).

// luaMove is the prelude of the move's scripts: the check of the keys'
// types before the first write, and the helpers for a task's fields.
const luaMove = `#!lua flags=allow-oom
local function wrongType(kt)
  for i = 1, #kt, 2 do
    local got = redis.call('TYPE', kt[i])['ok']
    if got ~= 'none' and got ~= kt[i + 1] then
      return 'WRONGTYPE key ' .. kt[i] .. ' holds a ' .. got .. ', not a ' .. kt[i + 1] .. '; nothing moved'
    end
  end
  return nil
end
-- sum is the SHA1 of field f of hash h, '' if it has none.
local function sum(h, f)
  local v = redis.call('HGET', h, f)
  if v then return redis.sha1hex(v) end
  return ''
end
-- due is the whole due time of a score read (a marker's, or a score a
-- producer wrote out of contract, floored as claims floor it), marker the
-- batch's marker score for it (due itself where a double has no room for
-- half a millisecond); fmt formats a score exactly for ZADD.
local function due(r)
  return math.floor(tonumber(r))
end
local function marker(r)
  return due(r) + 0.5
end
local function fmt(x)
  return string.format('%.17g', x)
end
-- put writes field f's body (hb) and properties (hp) as has says, and
-- deletes the ones it has not.
local function put(hb, hp, f, has, body, props)
  has = tonumber(has)
  if has % 2 == 1 then redis.call('HSET', hb, f, body) else redis.call('HDEL', hb, f) end
  if has >= 2 then redis.call('HSET', hp, f, props) else redis.call('HDEL', hp, f) end
end
`

// markScript marks the batch's tasks on the source (step 0): each one
// still pending with the score scanned gets the marker score and is
// listed under the batch's token, and its body and properties are read.
//
// KEYS[1] source pending shard P:{Q:i}, KEYS[2] its moving hash
// KEYS[3] its bodies P:{Q:i}:tasks, KEYS[4] its properties P:{Q:i}:props
// ARGV[1] the moving hash's TTL (ms), ARGV[2] the batch's token
// ARGV    then score1, member1, ... (as scanned)
// Returns flag, body, properties per task: 1 marked (body and properties
// or nil), 0 gone or changed since the scan (nil, nil).
var markScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
local any = false
for i = 3, #ARGV, 2 do
  local m = ARGV[i + 1]
  local s = redis.call('ZSCORE', KEYS[1], m)
  if s and tonumber(s) == tonumber(ARGV[i]) then
    redis.call('ZADD', KEYS[1], 'XX', fmt(marker(ARGV[i])), m)
    redis.call('HSET', KEYS[2], m, ARGV[2])
    any = true
    out[#out + 1] = 1
    out[#out + 1] = redis.call('HGET', KEYS[3], m)
    out[#out + 1] = redis.call('HGET', KEYS[4], m)
  else
    out[#out + 1] = 0
    out[#out + 1] = false
    out[#out + 1] = false
  end
end
if any then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end
return out
`)

// addScript adds pending tasks to the destination shard with the marker
// score, their body and properties, each only if its member is not
// pending there, and lists those it adds under the batch's token. A
// member pending there already keeps its own copy and fields, is unlisted
// and loses its marker if it has one (another batch added it): this
// batch's step 2 may remove the source's copy on the strength of that
// one, so no undo may remove it.
//
// KEYS[1] destination pending shard P:{Q:j}
// KEYS[2] destination moving hash P:{Q:j}:moving
// KEYS[3] destination bodies P:{Q:j}:tasks, KEYS[4] properties P:{Q:j}:props
// ARGV[1] the moving hash's TTL (ms), ARGV[2] the batch's token
// ARGV    then score1, member1, has1, body1, props1, ... (scores as
// scanned)
// Returns one flag per task: 1 added, 0 already pending there.
var addScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for i = 3, #ARGV, 5 do
  local m = ARGV[i + 1]
  local s = redis.call('ZSCORE', KEYS[1], m)
  if s then
    local x = tonumber(s)
    if x ~= math.floor(x) then redis.call('ZADD', KEYS[1], 'XX', fmt(math.floor(x)), m) end
    redis.call('HDEL', KEYS[2], m)
    out[#out + 1] = 0
  else
    redis.call('ZADD', KEYS[1], fmt(marker(ARGV[i])), m)
    put(KEYS[3], KEYS[4], m, ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
    redis.call('HSET', KEYS[2], m, ARGV[2])
    out[#out + 1] = 1
  end
end
if #out > 0 then redis.call('PEXPIRE', KEYS[2], ARGV[1]) end
return out
`)

// takeScript removes pending tasks and their fields from the source
// shard, each only if it still has the marker, the fields read, and is
// still listed under the batch's token; it unlists the batch's members.
//
// KEYS[1] source pending shard P:{Q:i}, KEYS[2] its moving hash
// KEYS[3] source bodies P:{Q:i}:tasks, KEYS[4] properties P:{Q:i}:props
// ARGV[1] the batch's token
// ARGV    then score1, member1, bodySum1, propsSum1, ... (scores as
// scanned)
// Returns one flag per task: 1 removed, 0 gone, 2 written since the mark
// (rescheduled, scheduled again, or marked by another batch).
var takeScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for i = 2, #ARGV, 4 do
  local m = ARGV[i + 1]
  local s = redis.call('ZSCORE', KEYS[1], m)
  local own = redis.call('HGET', KEYS[2], m) == ARGV[1]
  if not s then
    out[#out + 1] = 0
  elseif own and tonumber(s) == marker(ARGV[i]) and sum(KEYS[3], m) == ARGV[i + 2] and sum(KEYS[4], m) == ARGV[i + 3] then
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[3], m)
    redis.call('HDEL', KEYS[4], m)
    out[#out + 1] = 1
  else
    out[#out + 1] = 2
  end
  if own then redis.call('HDEL', KEYS[2], m) end
end
return out
`)

// undoScript settles what step 1 added, each only if it is still listed
// under the batch's token and still has the marker (nobody wrote it
// since): removed with its fields if step 2 left the source's copy alone
// (and its fields are still the ones step 1 wrote), else given its whole
// due time. It unlists the batch's members.
//
// KEYS[1] destination pending shard P:{Q:j}
// KEYS[2] destination moving hash P:{Q:j}:moving
// KEYS[3] destination bodies P:{Q:j}:tasks, KEYS[4] properties P:{Q:j}:props
// ARGV[1] the batch's token
// ARGV    then score1, member1, undo1, bodySum1, propsSum1, ... (undo: 1
// remove, 0 keep)
// Returns the number removed.
var undoScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply(bad) end
local n = 0
for i = 2, #ARGV, 5 do
  local m = ARGV[i + 1]
  if redis.call('HGET', KEYS[2], m) == ARGV[1] then
    local s = redis.call('ZSCORE', KEYS[1], m)
    if s and tonumber(s) == marker(ARGV[i]) then
      if ARGV[i + 2] == '1' and sum(KEYS[3], m) == ARGV[i + 3] and sum(KEYS[4], m) == ARGV[i + 4] then
        redis.call('ZREM', KEYS[1], m)
        redis.call('HDEL', KEYS[3], m)
        redis.call('HDEL', KEYS[4], m)
        n = n + 1
      else
        redis.call('ZADD', KEYS[1], 'XX', fmt(due(ARGV[i])), m)
      end
    end
    redis.call('HDEL', KEYS[2], m)
  end
end
return n
`)

// Dead letters (entries "<due_ms>:<member>" with a reason each, and the
// body and properties their claim kept under the entry) move in the same
// three steps, for the same reason, with a listing of their own
// (P:{Q:j}:dead:moving, entry -> score added): step 2 removes a letter
// from the source only if it is still there as read, with the reason and
// fields read, and step 3 undoes the adds step 2 did not confirm. An
// operator's requeue or purge (`dispatcher dead requeue|purge`) on the
// source between the read and step 2 then stays done: the letter is not
// left dead in the destination too (a requeued letter delivered and still
// dead, a purged one back). A letter requeued and dead-lettered again
// meanwhile (another reason) moves with its new reason on the next pass.

// addDeadScript adds dead letters, their reasons and fields to the
// destination shard, each unless already there, and lists those it adds;
// an entry already there is unlisted and keeps its own (step 2 may rely
// on it, as in addScript).
//
// KEYS[1] destination dead set P:{Q:j}:dead
// KEYS[2] destination reasons P:{Q:j}:dead:reason
// KEYS[3] destination listing P:{Q:j}:dead:moving
// KEYS[4] P:{Q:j}:claimed:body, KEYS[5] P:{Q:j}:claimed:props
// ARGV[1] the listing's TTL (ms)
// ARGV    then score1, entry1, reason1, has1, body1, props1, ... (reason
// "": none)
// Returns one flag per letter: 1 added, 0 already there.
var addDeadScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for i = 2, #ARGV, 6 do
  local e = ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[1], e) then
    redis.call('HDEL', KEYS[3], e)
    out[#out + 1] = 0
  else
    redis.call('ZADD', KEYS[1], ARGV[i], e)
    if ARGV[i + 2] ~= '' then redis.call('HSET', KEYS[2], e, ARGV[i + 2]) end
    put(KEYS[4], KEYS[5], e, ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
    redis.call('HSET', KEYS[3], e, ARGV[i])
    out[#out + 1] = 1
  end
end
if #out > 0 then redis.call('PEXPIRE', KEYS[3], ARGV[1]) end
return out
`)

// takeDeadScript removes dead letters with their reasons and fields from
// the source shard, each only if it is still there with the score, reason
// and fields read (a requeue or purge removed it, or it was dead-lettered
// again with another reason: left alone).
//
// KEYS[1] source dead set, KEYS[2] source reasons,
// KEYS[3] source claimed:body, KEYS[4] source claimed:props
// ARGV    score1, entry1, reason1, bodySum1, propsSum1, ...
// Returns one flag per letter: 1 removed, 0 gone, 2 changed.
var takeDeadScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for i = 1, #ARGV, 5 do
  local e = ARGV[i + 1]
  local s = redis.call('ZSCORE', KEYS[1], e)
  if not s then
    out[#out + 1] = 0
  elseif tonumber(s) == tonumber(ARGV[i]) and (redis.call('HGET', KEYS[2], e) or '') == ARGV[i + 2]
      and sum(KEYS[3], e) == ARGV[i + 3] and sum(KEYS[4], e) == ARGV[i + 4] then
    redis.call('ZREM', KEYS[1], e)
    redis.call('HDEL', KEYS[2], e)
    redis.call('HDEL', KEYS[3], e)
    redis.call('HDEL', KEYS[4], e)
    out[#out + 1] = 1
  else
    out[#out + 1] = 2
  end
end
return out
`)

// undoDeadScript unlists the batch's entries and removes from the
// destination, with their reasons and fields, those step 1 added and step
// 2 left in the source, each only if still listed and still as added
// (score, reason and fields).
//
// KEYS[1] destination dead set, KEYS[2] its reasons, KEYS[3] its listing,
// KEYS[4] its claimed:body, KEYS[5] its claimed:props
// ARGV    score1, entry1, reason1, undo1, bodySum1, propsSum1, ... (undo:
// 1 remove, 0 only unlist)
// Returns the number removed.
var undoDeadScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'hash', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return redis.error_reply(bad) end
local n = 0
for i = 1, #ARGV, 6 do
  local e = ARGV[i + 1]
  local listed = redis.call('HGET', KEYS[3], e)
  if ARGV[i + 3] == '1' and listed and tonumber(listed) == tonumber(ARGV[i]) then
    local s = redis.call('ZSCORE', KEYS[1], e)
    if s and tonumber(s) == tonumber(ARGV[i]) and (redis.call('HGET', KEYS[2], e) or '') == ARGV[i + 2]
        and sum(KEYS[4], e) == ARGV[i + 4] and sum(KEYS[5], e) == ARGV[i + 5] then
      redis.call('ZREM', KEYS[1], e)
      redis.call('HDEL', KEYS[2], e)
      redis.call('HDEL', KEYS[4], e)
      redis.call('HDEL', KEYS[5], e)
      n = n + 1
    end
  end
  if listed then redis.call('HDEL', KEYS[3], e) end
end
return n
`)

// In-flight entries left in a retired shard with their lease run out are
// handed to their member's shard by the current count in the same three
// steps (reshard/retired.go), with their body and properties (the
// claimed:* fields under the entry). Each hand-over run gives the entries
// it adds a lease of its own, a marker in (0, 1): run out, so any
// instance claims them at once, and unlike any other lease (claims'
// deadlines are whole ms, retries' end in half a ms, released entries
// have 0). The undo removes only an entry still at its own marker (not
// claimed since), and step 1 turns another run's marker it finds into 0
// (released): its step 2 may rely on that entry, so nobody may undo it.
// An entry's fields change only with its lease (a claim) or its removal
// (an ack, a dead-lettering), so the lease read stands for them too.

// handInScript adds in-flight entries to the destination shard with the
// marker lease, with their failed attempts and fields, each unless the
// entry is in flight there already (it then keeps its own fields).
//
// KEYS[1] destination in-flight set, KEYS[2] its attempts hash,
// KEYS[3] its retrying index, KEYS[4] its claimed:body,
// KEYS[5] its claimed:props
// ARGV[1] the marker lease
// ARGV    then entry1, attempts1 ("": none), due1, has1, body1, props1, ...
// Returns one flag per entry: 1 added, 0 in flight there already.
var handInScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return redis.error_reply(bad) end
local marker = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV, 6 do
  local e = ARGV[i]
  local s = redis.call('ZSCORE', KEYS[1], e)
  if s then
    local x = tonumber(s)
    if x > 0 and x < 1 and x ~= marker then redis.call('ZADD', KEYS[1], 'XX', 0, e) end
    out[#out + 1] = 0
  else
    redis.call('ZADD', KEYS[1], ARGV[1], e)
    if ARGV[i + 1] ~= '' then
      redis.call('HSET', KEYS[2], e, ARGV[i + 1])
      redis.call('ZADD', KEYS[3], ARGV[i + 2], e)
    end
    put(KEYS[4], KEYS[5], e, ARGV[i + 3], ARGV[i + 4], ARGV[i + 5])
    out[#out + 1] = 1
  end
end
return out
`)

// takeInflightScript removes in-flight entries, with their attempts and
// fields, from the retired shard, each only if its lease is still the one
// read (run out): one confirmed, dead-lettered, retried or claimed again
// meanwhile is left alone.
//
// KEYS[1] in-flight set, KEYS[2] attempts hash, KEYS[3] retrying index,
// KEYS[4] claimed:body, KEYS[5] claimed:props
// ARGV    lease1, entry1, lease2, entry2, ...
// Returns one flag per entry: 1 removed, 0 gone, 2 changed.
var takeInflightScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return redis.error_reply(bad) end
local out = {}
for i = 1, #ARGV, 2 do
  local e = ARGV[i + 1]
  local s = redis.call('ZSCORE', KEYS[1], e)
  if not s then
    out[#out + 1] = 0
  elseif tonumber(s) == tonumber(ARGV[i]) then
    redis.call('ZREM', KEYS[1], e)
    redis.call('HDEL', KEYS[2], e)
    redis.call('ZREM', KEYS[3], e)
    redis.call('HDEL', KEYS[4], e)
    redis.call('HDEL', KEYS[5], e)
    out[#out + 1] = 1
  else
    out[#out + 1] = 2
  end
end
return out
`)

// undoInflightScript removes the entries a hand-over added whose removal
// from the retired shard did not happen, with their attempts and fields,
// each only if still at the hand-over's marker lease (not claimed since).
//
// KEYS[1] destination in-flight set, KEYS[2] its attempts hash,
// KEYS[3] its retrying index, KEYS[4] its claimed:body,
// KEYS[5] its claimed:props
// ARGV[1] the marker lease, ARGV[2..] the entries
// Returns the number removed.
var undoInflightScript = redis.NewScript(luaMove + `
local bad = wrongType({KEYS[1], 'zset', KEYS[2], 'hash', KEYS[3], 'zset', KEYS[4], 'hash', KEYS[5], 'hash'})
if bad then return redis.error_reply(bad) end
local n = 0
for i = 2, #ARGV do
  local e = ARGV[i]
  local s = redis.call('ZSCORE', KEYS[1], e)
  if s and tonumber(s) == tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], e)
    redis.call('HDEL', KEYS[2], e)
    redis.call('ZREM', KEYS[3], e)
    redis.call('HDEL', KEYS[4], e)
    redis.call('HDEL', KEYS[5], e)
    n = n + 1
  end
end
return n
`)

// startScript starts a change of the shard count, atomically with the
// check that none is in progress. All keys carry the hash tag {Q}.
//
// KEYS[1] P:{Q}:shards, KEYS[2] P:{Q}:reshard, KEYS[3] P:{Q}:retired
// ARGV[1] the new shard count
// The change's start (started_ms) is the Redis clock as the script records
// it: reshard moves nothing until shard.LayoutSettle after it, so it must
// not be read before (a pause between the two would shorten the wait).
// Returns {"started", from}, {"resume", from} (the same change is in
// progress), {"busy", from, to} (another is), {"same", m} (nothing to
// change) or {"none"} (no shard count recorded).
var startScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if not cur then return {'none'} end
if redis.call('EXISTS', KEYS[2]) == 1 then
  local r = redis.call('HMGET', KEYS[2], 'from', 'to')
  if r[2] == ARGV[1] then return {'resume', r[1]} end
  return {'busy', r[1], r[2]}
end
if cur == ARGV[1] then return {'same', cur} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[2], 'from', cur, 'to', ARGV[1], 'started_ms', string.format('%d', now))
redis.call('SET', KEYS[1], ARGV[1])
return {'started', cur}
`)

// finishScript ends a change: the old shard count is no longer served.
// After a shrink, the retired count is recorded (the larger of it and any
// earlier one), so that tasks late producers still write to the retired
// shards are found and moved.
//
// KEYS[1] P:{Q}:shards, KEYS[2] P:{Q}:reshard, KEYS[3] P:{Q}:retired
// ARGV[1] the shard count the change is to
// Returns {"done", from}, {"none"} (no change in progress) or
// {"other", to} (a change to another count is).
var finishScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[2], 'from', 'to')
if not r[1] then return {'none'} end
if r[2] ~= ARGV[1] then return {'other', r[2]} end
local from, to = tonumber(r[1]), tonumber(r[2])
local retired = tonumber(redis.call('GET', KEYS[3]) or '0')
if from > to and from > retired then
  redis.call('SET', KEYS[3], from)
elseif retired ~= 0 and retired <= to then
  redis.call('DEL', KEYS[3])
end
redis.call('DEL', KEYS[2])
return {'done', r[1]}
`)

// lockScript renews or releases the mover's lock, only for its holder.
//
// KEYS[1] P:{Q}:reshard:lock
// ARGV[1] the holder's token, ARGV[2] new TTL in ms (0: release)
// Returns 1 if the caller held the lock.
var lockScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
`)
