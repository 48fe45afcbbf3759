'use strict';
// The contract's fixed rules (CONTRACT.md): key names, the XXH64 shard
// choice, message ids and due times. Nothing here talks to Redis.

const loadXXHash = require('xxhash-wasm');

const DEFAULT_PREFIX = 'dq';
const MAX_SHARDS = 4096;
// A due time under 10^11 ms (March 1973) is almost surely seconds, not ms:
// read as ms it is long past and would go out at once.
const SECONDS_SCORE_BELOW = 100_000_000_000;
const QUEUE_NAME = /^[A-Za-z0-9_.-]{1,64}$/;

// CONTRACT.md's test vectors: member (UTF-8), XXH64 in hex, shard of 16.
const VECTORS = Object.freeze([
  ['', 'ef46db3751d8e999', 9],
  ['a', 'd24ec4f1a98c6e5b', 11],
  ['order:42', 'aa1f6214e0a40ff4', 4],
  ['{"id":1}', 'b7885ee991dfe823', 3],
  ['задача', '2cc77690f6f15f7a', 10],
]);

function checkQueueName(queue) {
  if (typeof queue !== 'string' || !QUEUE_NAME.test(queue)) {
    throw new TypeError(`queue name ${JSON.stringify(queue)}: want 1 to 64 characters of A-Z a-z 0-9 _ . -`);
  }
}

function checkShards(shards, what) {
  if (!Number.isInteger(shards) || shards < 1 || shards > MAX_SHARDS) {
    throw new RangeError(`${what} ${JSON.stringify(shards)}: want a shard count 1..${MAX_SHARDS}`);
  }
}

/** A task body as the bytes stored: a string is encoded as UTF-8. */
function memberBytes(member) {
  if (Buffer.isBuffer(member)) return member;
  if (member instanceof Uint8Array) return Buffer.from(member.buffer, member.byteOffset, member.byteLength);
  if (typeof member === 'string') return Buffer.from(member, 'utf8');
  throw new TypeError(`member ${String(member)}: want a Buffer, Uint8Array or string`);
}

/**
 * A due time as the contract's score, integer ms since the Unix epoch: a
 * Date or an integer number of ms. An integer below 10^11 is refused as
 * seconds (read as ms it is 1973 or earlier).
 */
function dueMs(due) {
  let ms;
  if (due instanceof Date) {
    ms = due.getTime();
    if (Number.isNaN(ms)) throw new RangeError('due is an invalid Date');
  } else if (typeof due === 'number' && Number.isSafeInteger(due)) {
    ms = due;
  } else {
    throw new TypeError(`due ${String(due)}: want a Date or integer ms since the Unix epoch`);
  }
  if (ms < SECONDS_SCORE_BELOW) {
    throw new RangeError(`due ${ms}: want milliseconds since the Unix epoch; this is before March 1973 ` +
      'if read as ms (seconds given instead?)');
  }
  return ms;
}

/** Every Redis key of one queue that a producer touches. */
class Keys {
  constructor(prefix, queue) {
    this.prefix = prefix;
    this.queue = queue;
  }

  /** The pending shard P:{Q:i}, e.g. dq:{orders:4}. */
  pending(i) { return `${this.prefix}:{${this.queue}:${i}}`; }

  /** The shard's moving hash during a change of the shard count. */
  moving(i) { return `${this.pending(i)}:moving`; }

  /** The bodies of the shard's tasks scheduled with an id (hash: id -> body). */
  tasks(i) { return `${this.pending(i)}:tasks`; }

  /** The message properties of the shard's pending tasks (hash: id -> JSON). */
  props(i) { return `${this.pending(i)}:props`; }

  shardCount() { return `${this.prefix}:{${this.queue}}:shards`; }

  reshard() { return `${this.prefix}:{${this.queue}}:reshard`; }

  retired() { return `${this.prefix}:{${this.queue}}:retired`; }

  wake() { return `${this.prefix}:{${this.queue}}:wake`; }
}

/** The wake-up a producer publishes after scheduling on shard i: due:<i>:<due_ms>. */
function wakeDue(i, due) {
  return `due:${i}:${due}`;
}

let loading;

/**
 * Loads XXH64 (WebAssembly, once per process) and returns the contract's
 * hashing rules as synchronous functions.
 */
function loadHashing() {
  if (!loading) {
    loading = loadXXHash().then((h) => {
      const xxh64 = (member) => h.h64Raw(memberBytes(member), 0n);
      const shardOf = (member, shards) => Number(xxh64(member) % BigInt(shards));
      const messageId = (member, due) => `${xxh64(member).toString(16).padStart(16, '0')}-${due}`;
      return Object.freeze({ xxh64, shardOf, messageId });
    });
  }
  return loading;
}

/** XXH64 of the member with seed 0, as an unsigned 64-bit bigint. */
async function xxh64(member) {
  return (await loadHashing()).xxh64(member);
}

/** The contract's shard choice: XXH64(member, seed 0) mod M. */
async function shardOf(member, shards) {
  return (await loadHashing()).shardOf(member, shards);
}

/** The message_id consumers see: 16 lowercase hex digits of XXH64(member), '-', due ms. */
async function messageId(member, due) {
  return (await loadHashing()).messageId(member, due);
}

/** Throws if the XXH64 implementation disagrees with the contract's test vectors. */
async function checkVectors() {
  const h = await loadHashing();
  for (const [text, wantHex, wantShard] of VECTORS) {
    const gotHex = h.xxh64(text).toString(16).padStart(16, '0');
    const gotShard = h.shardOf(text, 16);
    if (gotHex !== wantHex || gotShard !== wantShard) {
      throw new Error(`XXH64 test vector ${JSON.stringify(text)}: got ${gotHex} (shard ${gotShard} of 16), ` +
        `the contract says ${wantHex} (shard ${wantShard}): this XXH64 does not compute the contract's hash`);
    }
  }
}

module.exports = {
  DEFAULT_PREFIX, MAX_SHARDS, SECONDS_SCORE_BELOW, VECTORS, Keys,
  checkQueueName, checkShards, checkVectors, dueMs, loadHashing, memberBytes, messageId, shardOf, wakeDue, xxh64,
};
