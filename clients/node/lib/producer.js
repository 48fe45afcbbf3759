'use strict';
// The producer: schedules, reschedules and cancels tasks of one queue,
// following the shard layout recorded in Redis. It mirrors the Go producer
// (shard/producer.go in the dispatcher's repository).

const crypto = require('node:crypto');
const { performance } = require('node:perf_hooks');

const {
  DEFAULT_PREFIX, Keys, checkQueueName, checkShards, dueMs, loadHashing, memberBytes, wakeDue,
} = require('./contract');
const {
  LayoutError, NoLayoutError, ProducerError, indexes, layout, moves, readLayout, sameLayout,
} = require('./layout');
const { propertiesJson, taskIdBytes } = require('./properties');

// A layout read is used for at most this long before a write (CONTRACT.md).
const LAYOUT_TTL_MS = 1000;
// Nothing moves between shards until 5 s after a change is recorded, so a
// write whose reply comes within 3 s of sending the layout read it used is
// safe whatever it read; a later one reads the layout again (the 2 s allow
// for clocks running at slightly different rates and the read's own trip).
const LAYOUT_RECHECK_MS = 3000;
// Tasks due sooner than this after their ZADD also wake the dispatchers,
// as the Go producer does.
const DEFAULT_WAKE_WITHIN_MS = 1000;

// ZADD of tasks while tasks may move between shards: also unlists each
// member from the shard's moving hash, so that a move whose first step
// added the member to this shard does not undo this later write.
// KEYS[1] pending shard P:{Q:i}, KEYS[2] its moving hash P:{Q:i}:moving
// ARGV    score1, member1, score2, member2, ...
const SCHEDULE_LUA = `
local n = 0
for i = 1, #ARGV, 2 do
  n = n + redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HDEL', KEYS[2], ARGV[i + 1])
end
return n
`;

// Moves a pending member to a new due time, only if it is still pending.
// KEYS[1] pending shard, KEYS[2] its moving hash; ARGV[1] due ms, ARGV[2] member.
// Returns 1 if moved, 0 if the member was not pending.
const RESCHEDULE_LUA = `
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
  return 1
end
return 0
`;
const RESCHEDULE_SHA = crypto.createHash('sha1').update(RESCHEDULE_LUA).digest('hex');

function checkClient(redis) {
  if (!redis || typeof redis.pipeline !== 'function') {
    throw new TypeError('redis client: want an ioredis Redis client');
  }
  if (redis.isCluster) {
    throw new TypeError('ioredis Cluster: Redis Cluster is not supported by this package yet (on a cluster the ' +
      'wake-up must wait for the ZADD\'s reply, and that path is not built or tested here); use a single server ' +
      'or a Sentinel primary');
  }
  const keyPrefix = redis.options && redis.options.keyPrefix;
  if (keyPrefix) {
    throw new TypeError(`ioredis client with keyPrefix ${JSON.stringify(keyPrefix)}: the contract's keys must be ` +
      'written as they are; give the key prefix as the Producer\'s prefix option instead');
  }
}

function toTask(t) {
  if (Array.isArray(t)) return [memberBytes(t[0]), dueMs(t[1])];
  if (t && typeof t === 'object') return [memberBytes(t.member), dueMs(t.due)];
  throw new TypeError(`task ${String(t)}: want [member, due] or {member, due}`);
}

/**
 * Schedules tasks of one queue. Every method is async.
 *
 * The shard count is the one the dispatcher recorded in Redis
 * (P:{Q}:shards), read at most a second before each write, so a change of it
 * (dispatcher reshard) is followed without a restart. options.shards is
 * used only while no count is recorded (a queue no dispatcher has served
 * yet), with a warning; once one is recorded it wins, with a warning if it
 * differs. Without it, a write to a queue with no recorded count rejects
 * with NoLayoutError.
 */
class Producer {
  /**
   * @param redis an ioredis client (one server or a Sentinel primary)
   * @param queue the queue name Q
   * @param options prefix (DISPATCHER_KEY_PREFIX, default dq); shards (see
   *   above); wakeWithinMs (default 1000, 0 turns wake-ups off); warn
   *   (function(message), default process.emitWarning); clock (monotonic
   *   ms, default performance.now; tests inject one)
   */
  constructor(redis, queue, options = {}) {
    checkClient(redis);
    checkQueueName(queue);
    const {
      prefix = DEFAULT_PREFIX, shards, wakeWithinMs = DEFAULT_WAKE_WITHIN_MS,
      warn = (message) => process.emitWarning(message, 'DispatcherProducerWarning'),
      clock = () => performance.now(),
    } = options;
    if (typeof prefix !== 'string' || prefix === '') {
      throw new TypeError(`prefix ${JSON.stringify(prefix)}: want a non-empty key prefix (DISPATCHER_KEY_PREFIX)`);
    }
    if (shards !== undefined && shards !== null) checkShards(shards, 'shards');
    if (!Number.isInteger(wakeWithinMs) || wakeWithinMs < 0) {
      throw new RangeError(`wakeWithinMs ${JSON.stringify(wakeWithinMs)}: want an integer >= 0 (0 turns wake-ups off)`);
    }
    this.redis = redis;
    this.keys = new Keys(prefix, queue);
    this.shards = shards ?? null;
    this.wakeWithinMs = wakeWithinMs;
    this.warn = warn;
    this.clock = clock;
    this.cached = null; // {layout, sent, read}
    this.warned = new Set();
  }

  get queue() { return this.keys.queue; }

  get prefix() { return this.keys.prefix; }

  /** The queue's layout as recorded in Redis, read at most once a second. */
  async layout() {
    return (await this.readLayout(false)).layout;
  }

  warnOnce(key, message) {
    if (!this.warned.has(key)) {
      this.warned.add(key);
      this.warn(message);
    }
  }

  async readLayout(fresh) {
    const cur = this.cached;
    if (cur && !fresh && this.clock() - cur.sent < LAYOUT_TTL_MS) return cur;
    const sent = this.clock();
    let l;
    let read = true;
    try {
      l = await readLayout(this.redis, this.keys);
      if (this.shards !== null && l.shards !== this.shards) {
        this.warnOnce(`differs:${l.shards}`, `queue ${this.queue}: hashing with the shard count recorded at ` +
          `${this.keys.shardCount()}, ${l.shards}, not shards ${this.shards} given to Producer (it applies only ` +
          'while no count is recorded)');
      }
    } catch (err) {
      if (err instanceof NoLayoutError) {
        if (this.shards === null) {
          throw new NoLayoutError(`${err.message}: start a dispatcher for the queue, or give Producer the shards ` +
            'option (its DISPATCHER_QUEUE_<NAME>_SHARDS)');
        }
        l = layout(this.shards);
        this.warnOnce('unrecorded', `queue ${this.queue}: no shard count recorded at ${this.keys.shardCount()}; ` +
          `hashing with shards ${this.shards} given to Producer: it must equal the dispatcher's ` +
          'DISPATCHER_QUEUE_<NAME>_SHARDS, or tasks go to shards nobody serves');
      } else {
        // Keep writing by the last layout read (or the shards option): on
        // its own, a failed read of the layout need not stop the writes.
        if (cur) l = cur.layout;
        else if (this.shards !== null) l = layout(this.shards);
        else if (err instanceof LayoutError) throw err;
        else {
          throw new ProducerError(`queue ${this.queue}: read the shard layout at ${this.keys.shardCount()}: ` +
            `${err.message}`, { cause: err });
        }
        read = false;
      }
    }
    const next = { layout: l, sent, read };
    this.cached = next;
    return next;
  }

  /**
   * Runs write with the queue's layout. If write's reply came
   * LAYOUT_RECHECK_MS or more after that layout's read was sent (a slow
   * Redis, a paused process), a change of the shard count may have started
   * and a move may undo the write: the layout is read again and, if it
   * changed, write runs again by the new one, until one completes in time or
   * the layout holds. Every write here is idempotent.
   */
  async settled(write) {
    let cur = await this.readLayout(false);
    let result = await write(cur.layout);
    while (this.clock() - cur.sent >= LAYOUT_RECHECK_MS) {
      const took = this.clock() - cur.sent;
      const next = await this.readLayout(true);
      if (!next.read) {
        throw new ProducerError(`queue ${this.queue}: the write took ${Math.round(took)} ms, and the shard layout ` +
          'could not be read again to check that it still holds (write it again)');
      }
      if (sameLayout(next.layout, cur.layout)) break;
      cur = next;
      result = await write(cur.layout);
    }
    return result;
  }

  wakeSoon(due) {
    return this.wakeWithinMs > 0 && due <= Date.now() + this.wakeWithinMs;
  }

  /**
   * Schedules a task: ZADD of member (Buffer, Uint8Array or UTF-8 string)
   * with its due time (Date, or integer ms since the epoch) into its shard.
   * Scheduling a member that is pending moves it to the new due time. A task
   * due within wakeWithinMs also wakes the dispatchers (PUBLISH in the ZADD's
   * pipeline). Resolves to the shard index written.
   */
  async schedule(member, due) {
    return (await this.scheduleMany([[member, due]]))[0];
  }

  /**
   * Schedules many tasks, [member, due] or {member, due}, in one pipelined
   * round trip (see schedule). If a shard's ZADD fails, the other shards'
   * tasks are still scheduled, and the ProducerError names the failed
   * shard's key. Resolves to the shard index of each task, in order.
   */
  async scheduleMany(tasks) {
    const items = Array.from(tasks, toTask);
    if (items.length === 0) return [];
    const hashing = await loadHashing();
    return this.settled((l) => this.scheduleBy(hashing, l, items));
  }

  async scheduleBy(hashing, l, items) {
    const byShard = new Map(); // shard -> [due, member, due, member, ...]
    const earliest = new Map();
    // During a change: by new shard, the members to remove from their shard
    // by the old count once their ZADD has succeeded.
    const old = new Map();
    const out = [];
    for (const [member, due] of items) {
      const i = hashing.shardOf(member, l.shards);
      out.push(i);
      if (l.changingFrom) {
        const j = hashing.shardOf(member, l.changingFrom);
        if (j !== i) {
          if (!old.has(i)) old.set(i, new Map());
          const byOld = old.get(i);
          if (!byOld.has(j)) byOld.set(j, []);
          byOld.get(j).push(member);
        }
      }
      if (!byShard.has(i)) byShard.set(i, []);
      byShard.get(i).push(String(due), member);
      earliest.set(i, Math.min(earliest.get(i) ?? due, due));
    }

    const pipe = this.redis.pipeline();
    const positions = new Map();
    let n = 0;
    for (const [i, args] of byShard) {
      positions.set(i, n++);
      if (moves(l)) pipe.eval(SCHEDULE_LUA, 2, this.keys.pending(i), this.keys.moving(i), ...args);
      else pipe.zadd(this.keys.pending(i), ...args);
      if (this.wakeSoon(earliest.get(i))) {
        // One server runs a pipeline in order, so the wake-up never reaches a
        // dispatcher before the ZADD has run. Its own error is ignored: a
        // lost wake-up costs a poll interval.
        pipe.publish(this.keys.wake(), wakeDue(i, earliest.get(i)));
        n++;
      }
    }
    let results;
    try {
      results = await pipe.exec();
    } catch (err) {
      throw new ProducerError(`schedule ${items.length} tasks on queue ${this.queue}: ${err.message}`, { cause: err });
    }

    let firstErr = null;
    const rmOld = new Map();
    for (const [i, pos] of positions) {
      const [err] = results[pos];
      if (err) {
        firstErr ??= new ProducerError(`schedule ${items.length} tasks on queue ${this.queue}: ` +
          `${byShard.get(i).length / 2} on ${this.keys.pending(i)}: ${err.message}`, { cause: err });
        continue;
      }
      for (const [j, members] of old.get(i) ?? []) {
        if (!rmOld.has(j)) rmOld.set(j, []);
        rmOld.get(j).push(...members);
      }
    }
    if (rmOld.size > 0) {
      // After the ZADDs' replies, and only for the tasks whose ZADD
      // succeeded, so that a task is never in neither shard.
      const rm = this.redis.pipeline();
      for (const [j, members] of rmOld) rm.zrem(this.keys.pending(j), ...members);
      let failed = null;
      try {
        failed = (await rm.exec()).find(([err]) => err)?.[0] ?? null;
      } catch (err) {
        failed = err;
      }
      if (failed) {
        firstErr ??= new ProducerError(`schedule ${items.length} tasks on queue ${this.queue}: remove their ` +
          `copies by the old shard count ${l.changingFrom}: ${failed.message} (run it again: a copy left there ` +
          'is dispatched at its old due time)', { cause: failed });
      }
    }
    if (firstErr) throw firstErr;
    return out;
  }

  async rescheduleIn(i, member, due) {
    const keys = [this.keys.pending(i), this.keys.moving(i)];
    try {
      try {
        return await this.redis.evalsha(RESCHEDULE_SHA, 2, ...keys, String(due), member);
      } catch (err) {
        if (!String(err && err.message).startsWith('NOSCRIPT')) throw err;
        return await this.redis.eval(RESCHEDULE_LUA, 2, ...keys, String(due), member);
      }
    } catch (err) {
      throw new ProducerError(`reschedule on ${keys[0]}: ${err.message}`, { cause: err });
    }
  }

  /**
   * Moves a pending task to a new due time, only if it is still pending:
   * resolves to false if it is not (never scheduled, cancelled, or already
   * claimed by a dispatcher, which it may be up to DISPATCHER_LOOKAHEAD
   * before its due time). During a change of the shard count, a task pending
   * in its shard by the old count moves to its shard by the new.
   */
  async reschedule(member, due) {
    const m = memberBytes(member);
    const d = dueMs(due);
    const hashing = await loadHashing();
    return this.settled(async (l) => {
      for (const i of indexes(hashing, l, m)) {
        if (Number(await this.rescheduleIn(i, m, d)) === 0) continue;
        if (i !== hashing.shardOf(m, l.shards)) {
          await this.scheduleBy(hashing, l, [[m, d]]); // to the new count's shard, then out of this one
        }
        return true;
      }
      return false;
    });
  }

  /**
   * Removes a pending task. Resolves to false if it was not pending: never
   * scheduled, or already claimed by a dispatcher (up to
   * DISPATCHER_LOOKAHEAD before its due time), and then it is delivered.
   * During a change of the shard count it is removed from its shards by
   * both counts.
   */
  async cancel(member) {
    const m = memberBytes(member);
    const hashing = await loadHashing();
    let removed = false;
    await this.settled(async (l) => {
      const idx = indexes(hashing, l, m);
      for (const i of idx) {
        // Its properties (a recurring occurrence's) go with it, in the same
        // MULTI: left behind, a later task with this member would carry them.
        const results = await execTx(this.redis.multi().zrem(this.keys.pending(i), m).hdel(this.keys.props(i), m),
          `cancel on ${this.keys.pending(i)}`);
        removed = removed || Number(results[0]) > 0;
      }
    });
    return removed;
  }

  // --- tasks with an id ----------------------------------------------------

  /**
   * Schedules a task by its id (1 to 1024 bytes; a string as UTF-8): in one
   * MULTI/EXEC on shard XXH64(id) mod M, HSET of the body in P:{Q:i}:tasks,
   * HSET of the properties in P:{Q:i}:props (HDEL when there are none) and
   * ZADD of the id with its due time. Scheduling a pending id again replaces
   * its body, properties and due time. The properties (routing_key,
   * headers, content_type, ...) are checked first by the dispatcher's rules:
   * the TypeError or RangeError names the field. The message's message_id is
   * messageId(id, due), its header x-task-id the id. Resolves to the shard
   * index written.
   */
  async scheduleTask(id, body, due, properties) {
    const tid = taskIdBytes(id);
    const b = memberBytes(body);
    const d = dueMs(due);
    const props = propertiesJson(properties);
    const hashing = await loadHashing();
    return this.settled((l) => this.scheduleTaskBy(hashing, l, tid, b, props, d));
  }

  /**
   * Writes the task to its shard by l.shards and then, during a change,
   * removes it from its shard by the old count (after the reply, so that it
   * is never in neither). body null leaves the tasks hash alone (a plain
   * member moved by rescheduleTask).
   */
  async scheduleTaskBy(hashing, l, tid, body, props, due) {
    const i = hashing.shardOf(tid, l.shards);
    const key = this.keys.pending(i);
    const tx = this.redis.multi();
    let writes = 0;
    if (body !== null) {
      tx.hset(this.keys.tasks(i), tid, body);
      writes++;
    }
    if (props === null) tx.hdel(this.keys.props(i), tid);
    else tx.hset(this.keys.props(i), tid, props);
    tx.zadd(key, String(due), tid);
    writes += 2;
    if (moves(l)) {
      // Unlisted in the same transaction: a move whose first step added the
      // id here does not undo this write.
      tx.hdel(this.keys.moving(i), tid);
      writes++;
    }
    // After the ZADD, inside the transaction; its own error is ignored (a
    // lost wake-up costs a poll interval).
    if (this.wakeSoon(due)) tx.publish(this.keys.wake(), wakeDue(i, due));
    await execTx(tx, `schedule task ${showId(tid)} on ${key}`, writes);
    if (l.changingFrom) {
      const j = hashing.shardOf(tid, l.changingFrom);
      if (j !== i) {
        try {
          await this.removeTaskIn(j, tid);
        } catch (err) {
          throw new ProducerError(`schedule task ${showId(tid)}: remove its copy by the old shard count ` +
            `${l.changingFrom}: ${err.message} (run it again: a copy left there is dispatched at its old due time)`,
          { cause: err });
        }
      }
    }
    return i;
  }

  /** MULTI, ZREM of the id, HDEL of its body and properties, EXEC, on shard i: true if the ZREM removed it. */
  async removeTaskIn(i, tid) {
    const key = this.keys.pending(i);
    const results = await execTx(this.redis.multi()
      .zrem(key, tid)
      .hdel(this.keys.tasks(i), tid)
      .hdel(this.keys.props(i), tid), `cancel task ${showId(tid)} on ${key}`);
    return Number(results[0]) > 0;
  }

  /**
   * Moves a pending task to a new due time (ZADD XX CH of its id; its body
   * and properties stay): resolves to false if it is not pending (never
   * scheduled, cancelled, or already claimed by a dispatcher, up to
   * DISPATCHER_LOOKAHEAD before its due time). During a change of the
   * shard count, a task pending in its shard by the old count moves, with
   * its body and properties, to its shard by the new.
   */
  async rescheduleTask(id, due) {
    const tid = taskIdBytes(id);
    const d = dueMs(due);
    const hashing = await loadHashing();
    return this.settled(async (l) => {
      const next = hashing.shardOf(tid, l.shards);
      for (const i of indexes(hashing, l, tid)) {
        const key = this.keys.pending(i);
        const tx = this.redis.multi()
          .zscore(key, tid) // pending: the ZADD XX below moved it
          .zadd(key, 'XX', 'CH', String(d), tid);
        if (moves(l)) tx.hdel(this.keys.moving(i), tid);
        if (i !== next) tx.hgetBuffer(this.keys.tasks(i), tid).hgetBuffer(this.keys.props(i), tid);
        const results = await execTx(tx, `reschedule task ${showId(tid)} on ${key}`);
        if (results[0] === null) continue;
        if (i !== next) {
          // To the new count's shard, then out of this one.
          const [body, props] = results.slice(-2);
          await this.scheduleTaskBy(hashing, l, tid, body, props, d);
        }
        return true;
      }
      return false;
    });
  }

  /**
   * Cancels a pending task by its id: MULTI, ZREM, HDEL of its body and
   * properties, EXEC. Resolves to false if it was not pending (never
   * scheduled, or already claimed by a dispatcher, up to
   * DISPATCHER_LOOKAHEAD before its due time, and then it is delivered).
   * During a change of the shard count it is removed from its shards by
   * both counts.
   */
  async cancelTask(id) {
    const tid = taskIdBytes(id);
    const hashing = await loadHashing();
    let removed = false;
    await this.settled(async (l) => {
      for (const i of indexes(hashing, l, tid)) {
        if (await this.removeTaskIn(i, tid)) removed = true;
      }
    });
    return removed;
  }
}

/**
 * Runs a MULTI/EXEC and returns its replies; a failure of the transaction,
 * or of one of its first `check` commands (all by default), is a
 * ProducerError that starts with what.
 */
async function execTx(tx, what, check = Infinity) {
  let results;
  try {
    results = await tx.exec();
  } catch (err) {
    throw new ProducerError(`${what}: ${err.message}`, { cause: err });
  }
  if (!results) throw new ProducerError(`${what}: the transaction was aborted`);
  const failed = results.slice(0, check).find(([err]) => err);
  if (failed) throw new ProducerError(`${what}: ${failed[0].message}`, { cause: failed[0] });
  return results.map(([, v]) => v);
}

/** A task id for an error message: quoted, at most 64 characters. */
function showId(tid) {
  const text = tid.toString('utf8');
  return JSON.stringify(text.length <= 64 ? text : `${text.slice(0, 61)}...`);
}

module.exports = { DEFAULT_WAKE_WITHIN_MS, LAYOUT_RECHECK_MS, LAYOUT_TTL_MS, Producer };
