'use strict';
// The contract's rules, without Redis: test vectors, message ids, due
// times, argument checks.

const test = require('node:test');
const assert = require('node:assert/strict');
const Redis = require('ioredis');

const dp = require('..');

// CONTRACT.md's table, written out here rather than read from the package,
// so that a wrong table in the package fails too.
const TABLE = [
  ['', 'ef46db3751d8e999', 9],
  ['a', 'd24ec4f1a98c6e5b', 11],
  ['order:42', 'aa1f6214e0a40ff4', 4],
  ['{"id":1}', 'b7885ee991dfe823', 3],
  ['задача', '2cc77690f6f15f7a', 10],
];

test('the contract\'s XXH64 test vectors', async () => {
  assert.deepEqual(dp.VECTORS.map((v) => [...v]), TABLE);
  for (const [text, hex, shard] of TABLE) {
    assert.equal((await dp.xxh64(text)).toString(16).padStart(16, '0'), hex, text);
    assert.equal(await dp.shardOf(Buffer.from(text, 'utf8'), 16), shard, text);
    assert.equal(await dp.shardOf(new Uint8Array(Buffer.from(text, 'utf8')), 16), shard, text);
    assert.equal(await dp.messageId(text, 1767225600000), `${hex}-1767225600000`, text);
  }
  await dp.checkVectors();
});

test('message ids have 16 hex digits', async () => {
  const h = await dp.loadHashing();
  let m;
  for (let n = 0; n < 10000; n++) {
    if (h.xxh64(`pad-${n}`) < 1n << 60n) {
      m = `pad-${n}`;
      break;
    }
  }
  assert.ok(m, 'no member with a small hash found');
  assert.match(h.messageId(m, 1767225600000), /^0[0-9a-f]{15}-1767225600000$/);
});

test('keys', () => {
  const k = new dp.Keys('dq', 'orders');
  assert.equal(k.pending(7), 'dq:{orders:7}');
  assert.equal(k.moving(7), 'dq:{orders:7}:moving');
  assert.equal(k.shardCount(), 'dq:{orders}:shards');
  assert.equal(k.reshard(), 'dq:{orders}:reshard');
  assert.equal(k.retired(), 'dq:{orders}:retired');
  assert.equal(k.wake(), 'dq:{orders}:wake');
});

test('due times', () => {
  assert.equal(dp.dueMs(1767225600000), 1767225600000);
  assert.equal(dp.dueMs(new Date(Date.UTC(2026, 0, 1))), 1767225600000);
  for (const [due, words] of [
    [1767225600, /seconds/], [0, /seconds/], [-5, /before March 1973/], [1767225600000.5, /integer ms/],
    ['1767225600000', /integer ms/], [new Date('nope'), /invalid Date/], [null, /integer ms/],
  ]) {
    assert.throws(() => dp.dueMs(due), words, String(due));
  }
});

test('arguments', async (t) => {
  // Never connects: the constructor talks to no server.
  const r = new Redis({ port: 1, lazyConnect: true });
  t.after(() => r.disconnect());
  for (const q of ['orders', 'a', 'A-z_0.9', 'x'.repeat(64)]) new dp.Producer(r, q);
  for (const q of ['', 'x'.repeat(65), 'or ders', 'orders:1', '{orders}', 'задача', null]) {
    assert.throws(() => new dp.Producer(r, q), /queue name/, String(q));
  }
  new dp.Producer(r, 'q', { shards: 1 });
  new dp.Producer(r, 'q', { shards: 4096 });
  for (const m of [0, 4097, -1, true, '16', 1.5]) {
    assert.throws(() => new dp.Producer(r, 'q', { shards: m }), /shards/, String(m));
  }
  assert.throws(() => new dp.Producer(r, 'q', { prefix: '' }), /prefix/);
  assert.throws(() => new dp.Producer(r, 'q', { wakeWithinMs: -1 }), /wakeWithinMs/);
  assert.throws(() => new dp.Producer({}, 'q'), /ioredis/);
  const prefixed = new Redis({ port: 1, lazyConnect: true, keyPrefix: 'app:' });
  t.after(() => prefixed.disconnect());
  assert.throws(() => new dp.Producer(prefixed, 'q'), /keyPrefix "app:"/);
  const cluster = new Redis.Cluster([{ port: 1 }], { lazyConnect: true });
  t.after(() => cluster.disconnect());
  assert.throws(() => new dp.Producer(cluster, 'q'), /Redis Cluster is not supported/);
  const p = new dp.Producer(r, 'q', { shards: 16 });
  await assert.rejects(p.schedule(42, 1767225600000), /member 42/);
  await assert.rejects(p.scheduleMany([[Buffer.from('a'), 1767225600]]), /seconds/);
});
