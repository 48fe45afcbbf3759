'use strict';
// A queue's shard layout as recorded in Redis (CONTRACT.md, "Changing the
// shard count").

const { MAX_SHARDS } = require('./contract');

/** A write or read of the producer failed; the message names the key. */
class ProducerError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = 'ProducerError';
  }
}

/** No shard count is recorded for the queue (no dispatcher has served it). */
class NoLayoutError extends ProducerError {
  constructor(message, options) {
    super(message, options);
    this.name = 'NoLayoutError';
  }
}

/** A recorded layout key holds something that is not a shard count. */
class LayoutError extends ProducerError {
  constructor(message, options) {
    super(message, options);
    this.name = 'LayoutError';
  }
}

/**
 * shards is the M producers hash with (P:{Q}:shards). While the count
 * changes, changingFrom is the old M (P:{Q}:reshard field from); after a
 * shrink, retired is the M it shrank from (P:{Q}:retired). 0 otherwise.
 */
function layout(shards, changingFrom = 0, retired = 0) {
  return Object.freeze({ shards, changingFrom, retired });
}

function sameLayout(a, b) {
  return a.shards === b.shards && a.changingFrom === b.changingFrom && a.retired === b.retired;
}

/**
 * Whether tasks may be moved between shards (during a change, or out of the
 * shards a shrink retired): schedules then also unlist the member from the
 * shard's moving hash.
 */
function moves(l) {
  return l.changingFrom !== 0 || l.retired !== 0;
}

/** The shards a member may be pending in: by M and, during a change, by the old M if that differs. */
function indexes(hashing, l, member) {
  const i = hashing.shardOf(member, l.shards);
  if (l.changingFrom) {
    const j = hashing.shardOf(member, l.changingFrom);
    if (j !== i) return [i, j];
  }
  return [i];
}

/** A recorded shard count: 0 if absent. */
function count(value, key) {
  if (value === null || value === undefined) return 0;
  const text = String(value);
  const n = /^-?[0-9]+$/.test(text.trim()) ? Number(text.trim()) : 0;
  if (!(n >= 1 && n <= MAX_SHARDS)) {
    throw new LayoutError(`${key} is ${JSON.stringify(text)}, not a shard count 1..${MAX_SHARDS}`);
  }
  return n;
}

/**
 * Reads a queue's layout in one round trip (its keys share the hash tag
 * {Q}). Rejects with NoLayoutError when no shard count is recorded.
 */
async function readLayout(redis, keys) {
  const results = await redis.pipeline()
    .get(keys.shardCount())
    .hget(keys.reshard(), 'from')
    .get(keys.retired())
    .exec();
  for (const [err] of results) {
    if (err) throw err;
  }
  const [[, m], [, from], [, retired]] = results;
  const shards = count(m, keys.shardCount());
  if (shards === 0) {
    throw new NoLayoutError(`queue ${keys.queue}: no shard count recorded at ${keys.shardCount()} ` +
      '(no dispatcher has served the queue yet)');
  }
  const retiredN = count(retired, keys.retired());
  return layout(shards, count(from, `${keys.reshard()} from`), retiredN > shards ? retiredN : 0);
}

module.exports = { LayoutError, NoLayoutError, ProducerError, indexes, layout, moves, readLayout, sameLayout };
