package recurring

import "github.com/redis/go-redis/v9"

// The state of a schedule in the shard its body hashes to is one hash
// field, "<rev>:<cursor_ms>:<flag>": the definition's revision, the due
// time of the last occurrence materialised under it (0 if none), and a
// flag: "" live (the materialiser goes on from cursor), "f" frozen (moved
// to the shard of another shard count: the live state is there), "r"
// retired (the definition changed or was paused; cursor is the floor a
// fresh start must stay after). Every transition is a compare-and-set on
// the whole field, so two instances racing, or one running a script again
// after a lost reply, change it once.

// luaTypes proves the types of a script's keys before its first write:
// Redis does not undo a script's earlier writes when a later call fails.
const luaTypes = `
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

// stepScript materialises an occurrence, or only moves the state, if the
// state is still the one the caller read and the body is not pending.
// An occurrence is the body as a member of its own (no task id): any field
// the tasks hash has for it is removed (one there could only be left from
// an earlier task, the member not being pending), and its props field is
// set to the schedule's properties, or removed if it has none, in the same
// step as the ZADD (CONTRACT.md: schedule).
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] state hash P:{Q:i}:recurring
// KEYS[3] bodies of pending ids P:{Q:i}:tasks
// KEYS[4] properties of pending members P:{Q:i}:props
// ARGV[1] schedule name
// ARGV[2] body (the member)
// ARGV[3] expected state ("" = absent)
// ARGV[4] new state ("" = delete the field)
// ARGV[5] due ms to ZADD the body at ("" = none)
// ARGV[6] the occurrence's properties, JSON ("" = none)
// Returns {1} done, {0, state} the state differs (raced: read again),
// {2, score} the body is pending (the occurrence before has not left
// pending yet, or another task has the same body): nothing changed.
var stepScript = redis.NewScript(luaTypes + `
local cur = redis.call('HGET', KEYS[2], ARGV[1]) or ''
if cur ~= ARGV[3] then
  return {0, cur}
end
if ARGV[5] ~= '' then
  local s = redis.call('ZSCORE', KEYS[1], ARGV[2])
  if s then
    return {2, tostring(s)}
  end
  local bad = wrongType({KEYS[3], 'hash', KEYS[4], 'hash'})
  if bad then return redis.error_reply(bad) end
  redis.call('ZADD', KEYS[1], ARGV[5], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
  if ARGV[6] ~= '' then
    redis.call('HSET', KEYS[4], ARGV[2], ARGV[6])
  else
    redis.call('HDEL', KEYS[4], ARGV[2])
  end
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
end
return {1}
`)

// retireScript ends a state: the occurrence materialised under it is
// cancelled if it has not left pending yet (its body is pending at its due
// time), with its properties (and any body field, as a cancel); a body not
// pending loses any properties field left for it (by a bare ZREM); and the
// state becomes a retired one at rev ARGV[4] whose cursor
// is the floor a fresh start must stay after: the occurrence's due time if
// it left pending (it is delivered), 0 if it was cancelled here.
//
// KEYS[1] pending shard P:{Q:i}
// KEYS[2] state hash P:{Q:i}:recurring
// KEYS[3] bodies of pending ids P:{Q:i}:tasks
// KEYS[4] properties of pending members P:{Q:i}:props
// ARGV[1] schedule name
// ARGV[2] body the state's occurrence has
// ARGV[3] expected state (not "")
// ARGV[4] revision of the retired state
// Returns {1, cancelled (0/1), floor} or {0, state} if the state differs.
var retireScript = redis.NewScript(luaTypes + `
local cur = redis.call('HGET', KEYS[2], ARGV[1]) or ''
if cur ~= ARGV[3] then
  return {0, cur}
end
local bad = wrongType({KEYS[1], 'zset', KEYS[3], 'hash', KEYS[4], 'hash'})
if bad then return redis.error_reply(bad) end
local rev, cursor, flag = string.match(cur, '^(%d+):(%d+):(%a*)$')
local floor = cursor or '0'
local cancelled = 0
local s = redis.call('ZSCORE', KEYS[1], ARGV[2])
if flag == '' and cursor ~= '0' and s and tonumber(s) == tonumber(cursor) then
  redis.call('ZREM', KEYS[1], ARGV[2])
  redis.call('HDEL', KEYS[3], ARGV[2])
  redis.call('HDEL', KEYS[4], ARGV[2])
  cancelled = 1
  floor = '0'
elseif not s then
  -- Not pending: a claim took its properties along, so any left here are
  -- a bare ZREM's leftovers, which a later task with this body would carry.
  redis.call('HDEL', KEYS[4], ARGV[2])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4] .. ':' .. floor .. ':r')
return {1, cancelled, floor}
`)

// putScript writes a definition with the next revision, or removes it
// (ARGV[2] == ""), if its current value is still the one the caller read.
// A definition's value is "<rev> <JSON>": the revision of its last change,
// then the definition.
//
// KEYS[1] definitions hash P:{Q}:recurring
// KEYS[2] revision counter P:{Q}:recurring:rev
// ARGV[1] name
// ARGV[2] new JSON ("" = remove)
// ARGV[3] expected value ("" = absent)
// Returns {1, rev} or {0, current value}.
var putScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if cur ~= ARGV[3] then
  return {0, cur}
end
redis.call('GET', KEYS[2])
local rev = redis.call('INCR', KEYS[2])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], rev .. ' ' .. ARGV[2])
end
return {1, rev}
`)
