'use strict';
// The producer against a real Redis: DISPATCHER_TEST_REDIS_URL, or
// redis://127.0.0.1:6379/0. Each test works under a prefix of its own and
// deletes its keys. No Redis is a failure, not a skip.

const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const Redis = require('ioredis');

const dp = require('..');

const REDIS_URL = process.env.DISPATCHER_TEST_REDIS_URL || 'redis://127.0.0.1:6379/0';
const HOUR_MS = 3600_000;
const Q = 'orders';

/** A monotonic clock (ms) that moves only when told to. */
function fakeClock() {
  const clock = () => clock.t;
  clock.t = 1_000_000;
  return clock;
}

/**
 * The real client, whose every round trip takes state.delay ms of clock:
 * a slow Redis, or a process paused mid-write.
 */
function slowClient(redis, clock) {
  const state = { delay: 0 };
  const timed = (fn) => async (...args) => {
    try {
      return await fn(...args);
    } finally {
      clock.t += state.delay;
    }
  };
  const proxy = new Proxy(redis, {
    get(target, prop) {
      if (prop === 'pipeline' || prop === 'multi') { // a transaction is a pipeline too
        return (...args) => {
          const pipe = target.pipeline(...args);
          pipe.exec = timed(pipe.exec.bind(pipe));
          return pipe;
        };
      }
      const v = Reflect.get(target, prop, target);
      return typeof v === 'function' ? timed(v.bind(target)) : v;
    },
  });
  return { proxy, state };
}

/** Connects, and gives a prefix of its own whose keys are deleted after the test. */
async function setup(t) {
  const r = new Redis(REDIS_URL, { maxRetriesPerRequest: 1, lazyConnect: true });
  try {
    await r.connect();
    await r.ping();
  } catch (err) {
    r.disconnect();
    assert.fail(`no Redis for tests at ${REDIS_URL} (set DISPATCHER_TEST_REDIS_URL): ${err.message}`);
  }
  const prefix = `nodeclient-${process.pid}-${crypto.randomBytes(4).toString('hex')}`;
  const k = new dp.Keys(prefix, Q);
  t.after(async () => {
    const keys = [];
    for await (const batch of r.scanStream({ match: `${prefix}:*`, count: 1000 })) keys.push(...batch);
    if (keys.length) await r.del(...keys);
    r.disconnect();
  });
  const setLayout = async (shards, changingFrom = 0, retired = 0) => {
    await r.set(k.shardCount(), shards);
    await r.del(k.reshard(), k.retired());
    if (changingFrom) await r.hset(k.reshard(), 'from', changingFrom, 'to', shards);
    if (retired) await r.set(k.retired(), retired);
  };
  const producer = (options = {}) => new dp.Producer(r, Q, { prefix, wakeWithinMs: 0, ...options });
  const score = async (i, m) => {
    const s = await r.zscore(k.pending(i), m);
    return s === null ? null : Number(s);
  };
  return { r, prefix, k, setLayout, producer, score };
}

/** A member whose shard differs by old and by new shards. */
async function memberMoving(old, next, start = 'task') {
  const h = await dp.loadHashing();
  for (let n = 0; n < 100000; n++) {
    const m = `${start}-${n}`;
    if (h.shardOf(m, old) !== h.shardOf(m, next)) return m;
  }
  throw new Error('no such member');
}

test('schedule, reschedule, cancel', async (t) => {
  const { r, k, setLayout, producer, score } = await setup(t);
  await setLayout(16);
  const p = producer();
  const due = Date.now() + HOUR_MS;
  assert.equal(await p.schedule('order:42', due), 4); // the contract's example: shard 4 of 16
  assert.deepEqual(await r.zrange(k.pending(4), 0, -1, 'WITHSCORES'), ['order:42', String(due)]);

  await p.schedule(Buffer.from('order:42'), new Date(due + 1000)); // again: moves it
  assert.equal(await score(4, 'order:42'), due + 1000);

  assert.equal(await p.reschedule('order:42', due + 2000), true);
  assert.equal(await score(4, 'order:42'), due + 2000);
  assert.equal(await p.reschedule('order:43', due), false, 'reschedule of a task never scheduled');
  assert.equal(await score(await dp.shardOf('order:43', 16), 'order:43'), null,
    'reschedule must not schedule a task that is not pending');

  assert.equal(await p.cancel('order:42'), true);
  assert.equal(await r.exists(k.pending(4)), 0);
  assert.equal(await p.cancel('order:42'), false, 'second cancel');
  assert.equal(await p.reschedule('order:42', due), false, 'reschedule after cancel');
});

test('cancel removes the properties of a plain member', async (t) => {
  // As a recurring occurrence has them: left behind, a later task with the
  // same body would carry them.
  const { r, k, setLayout, producer } = await setup(t);
  await setLayout(16);
  const p = producer();
  await r.hset(k.props(4), 'order:42', '{"routing_key":"cron"}');
  await p.schedule('order:42', Date.now() + HOUR_MS);
  assert.equal(await p.cancel('order:42'), true);
  assert.equal(await r.hlen(k.props(4)), 0, 'properties left behind by the cancel');
});

test('scheduleMany', async (t) => {
  const { r, k, setLayout, producer, score } = await setup(t);
  await setLayout(8);
  const p = producer();
  const due = Date.now() + HOUR_MS;
  const tasks = Array.from({ length: 100 }, (_, n) => [`many-${n}`, due + n]);
  tasks.push({ member: Buffer.from('задача'), due });
  const got = await p.scheduleMany(tasks);
  const h = await dp.loadHashing();
  const members = tasks.map((t) => (Array.isArray(t) ? t[0] : t.member));
  assert.deepEqual(got, members.map((m) => h.shardOf(m, 8)));
  for (const [n, m] of members.entries()) {
    assert.equal(await score(got[n], m), Array.isArray(tasks[n]) ? tasks[n][1] : tasks[n].due, String(m));
  }
  let total = 0;
  for (let i = 0; i < 8; i++) total += await r.zcard(k.pending(i));
  assert.equal(total, tasks.length);
  assert.deepEqual(await p.scheduleMany([]), []);
});

test('wake-ups', async (t) => {
  const { r, k, setLayout, producer } = await setup(t);
  await setLayout(16);
  const p = producer({ wakeWithinMs: 1000 });
  const sub = r.duplicate();
  t.after(() => sub.disconnect());
  const messages = [];
  let waiting = null;
  sub.on('message', (channel, msg) => {
    messages.push(msg);
    if (waiting) waiting();
  });
  await sub.subscribe(k.wake());
  const next = async () => {
    const deadline = Date.now() + 10_000;
    while (messages.length === 0) {
      if (Date.now() > deadline) assert.fail('no wake-up within 10 s');
      await new Promise((resolve) => {
        waiting = resolve;
        setTimeout(resolve, 1000);
      });
    }
    return messages.shift();
  };

  // A task due in an hour sends none: the first message is the next one's.
  await p.schedule('later', Date.now() + HOUR_MS);
  const soon = Date.now() + 300;
  await p.schedule('order:42', soon);
  assert.equal(await next(), `due:4:${soon}`);
  // scheduleMany: one per shard with tasks due soon, with its earliest due time.
  const base = Date.now();
  await p.scheduleMany([['order:42', base + 500], ['a', base + 200], ['a-later', base + HOUR_MS],
    ['order:42-b', base + 2 * HOUR_MS]]);
  assert.deepEqual(new Set([await next(), await next()]), new Set([`due:4:${base + 500}`, `due:11:${base + 200}`]));
  // wakeWithinMs 0 turns them off.
  await producer({ wakeWithinMs: 0 }).schedule('a', Date.now());
  await p.schedule('order:42', Date.now() + 100);
  assert.match(await next(), /^due:4:/);
});

test('no recorded shard count', async (t) => {
  const { setLayout, producer } = await setup(t);
  const p = producer();
  await assert.rejects(p.schedule('a', Date.now() + HOUR_MS),
    (err) => err instanceof dp.NoLayoutError && /no shard count recorded at .*:\{orders\}:shards/.test(err.message));
  await assert.rejects(p.layout(), dp.NoLayoutError);

  const warnings = [];
  const given = producer({ shards: 8, warn: (m) => warnings.push(m) });
  assert.equal(await given.schedule('a', Date.now() + HOUR_MS), await dp.shardOf('a', 8));
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /no shard count recorded.*shards 8/);

  // Once recorded, the recorded count wins, with a warning.
  await setLayout(16);
  const other = producer({ shards: 4, warn: (m) => warnings.push(m) });
  assert.equal(await other.schedule('order:42', Date.now() + HOUR_MS), 4); // by 16, not by 4 (0)
  assert.match(warnings[1], /16, not shards 4/);
  assert.deepEqual(await other.layout(), { shards: 16, changingFrom: 0, retired: 0 });
});

test('a bad recorded shard count', async (t) => {
  const { r, k, producer } = await setup(t);
  for (const value of ['0', '4097', 'sixteen', '-3']) {
    await r.set(k.shardCount(), value);
    await assert.rejects(producer().layout(),
      (err) => err instanceof dp.LayoutError && err.message.includes(`shards is "${value}", not a shard count`), value);
  }
});

test('the layout is read at most a second before a write', async (t) => {
  const { setLayout, producer } = await setup(t);
  const clock = fakeClock();
  await setLayout(4);
  const p = producer({ clock });
  assert.deepEqual(await p.layout(), { shards: 4, changingFrom: 0, retired: 0 });
  await setLayout(8, 4);
  clock.t += 900;
  assert.deepEqual(await p.layout(), { shards: 4, changingFrom: 0, retired: 0 }, 'read again within the second');
  clock.t += 100;
  assert.deepEqual(await p.layout(), { shards: 8, changingFrom: 4, retired: 0 });
  await setLayout(4, 0, 8);
  clock.t += 1000;
  assert.deepEqual(await p.layout(), { shards: 4, changingFrom: 0, retired: 8 });
  await setLayout(8, 0, 8); // a retired count not above the current one means nothing
  clock.t += 1000;
  assert.deepEqual(await p.layout(), { shards: 8, changingFrom: 0, retired: 0 });
});

test('during a change from 4 to 8 shards', async (t) => {
  const { r, k, setLayout, producer, score } = await setup(t);
  const h = await dp.loadHashing();
  await setLayout(8, 4);
  const m = await memberMoving(4, 8);
  const old = h.shardOf(m, 4);
  const nu = h.shardOf(m, 8);
  const due = Date.now() + HOUR_MS;
  const p = producer();

  await t.test('schedule goes to the new shard and leaves the old', async () => {
    await r.zadd(k.pending(old), due - 5000, m); // written by an old-count producer
    await r.hset(k.moving(nu), m, due); // a move's first step listed it in the new shard
    assert.equal(await p.schedule(m, due), nu);
    assert.equal(await score(nu, m), due);
    assert.equal(await r.exists(k.pending(old)), 0, 'the old copy stays');
    assert.equal(await r.hexists(k.moving(nu), m), 0, 'the schedule did not unlist the member from the moving hash');
    await r.del(k.pending(nu));
  });

  await t.test('scheduleMany', async () => {
    const members = [];
    for (let n = 0; n < 20; n++) members.push(await memberMoving(4, 8, `many${n}`));
    for (const x of members) await r.zadd(k.pending(h.shardOf(x, 4)), due - 5000, x);
    await p.scheduleMany(members.map((x) => [x, due]));
    for (const x of members) {
      assert.equal(await score(h.shardOf(x, 8), x), due, x);
      assert.equal(await score(h.shardOf(x, 4), x), null, x);
    }
    for (const x of members) await r.zrem(k.pending(h.shardOf(x, 8)), x);
  });

  await t.test('cancel removes by both counts', async () => {
    await r.zadd(k.pending(old), due, m);
    await r.zadd(k.pending(nu), due, m);
    assert.equal(await p.cancel(m), true);
    assert.equal(await r.exists(k.pending(old), k.pending(nu)), 0);
    await r.zadd(k.pending(old), due, m);
    assert.equal(await p.cancel(m), true, 'a task only in its shard by the old count');
    assert.equal(await p.cancel(m), false);
  });

  await t.test('reschedule moves an old copy to the new shard', async () => {
    await r.zadd(k.pending(old), due, m);
    assert.equal(await p.reschedule(m, due + 1000), true);
    assert.equal(await score(nu, m), due + 1000);
    assert.equal(await r.exists(k.pending(old)), 0);
    assert.equal(await p.reschedule(m, due + 2000), true, 'now in the new shard');
    assert.equal(await score(nu, m), due + 2000);
    assert.equal(await p.reschedule(await memberMoving(4, 8, 'absent'), due), false);
    await r.del(k.pending(nu));
  });

  await t.test('after a shrink, schedules unlist from the moving hash', async () => {
    await setLayout(4, 0, 8);
    const i = h.shardOf(m, 4);
    await r.hset(k.moving(i), m, due);
    assert.equal(await producer().schedule(m, due), i);
    assert.equal(await r.hexists(k.moving(i), m), 0);
    assert.equal(await score(i, m), due);
    // Without a change or a shrink, a plain ZADD: the moving hash is not touched.
    await setLayout(4);
    await r.hset(k.moving(i), m, due);
    await producer().schedule(m, due + 1);
    assert.equal(await r.hexists(k.moving(i), m), 1);
  });
});

test('a slow write is written again by the new layout', async (t) => {
  // Each write uses a layout by 4 shards, read just before a change to 8
  // was recorded, and its round trips take state.delay ms.
  const { r, prefix, k, setLayout, score } = await setup(t);
  const h = await dp.loadHashing();
  const clock = fakeClock();
  const { proxy, state } = slowClient(r, clock);
  const p = new dp.Producer(proxy, Q, { prefix, wakeWithinMs: 0, clock });
  const m = await memberMoving(4, 8);
  const old = h.shardOf(m, 4);
  const nu = h.shardOf(m, 8);
  const due = Date.now() + HOUR_MS;
  const stale = async (delay) => {
    state.delay = 0;
    await setLayout(4);
    clock.t += 10_000; // the last read is old: read it now
    assert.deepEqual(await p.layout(), { shards: 4, changingFrom: 0, retired: 0 });
    await setLayout(8, 4);
    state.delay = delay;
  };

  await stale(4000);
  await p.schedule(m, due);
  assert.equal(await score(nu, m), due, 'schedule with a stale layout');
  assert.equal(await r.exists(k.pending(old)), 0);

  // As a move would have left it: in its new shard only.
  await stale(4000);
  assert.equal(await p.reschedule(m, due + 1000), true);
  assert.equal(await score(nu, m), due + 1000);

  await stale(4000);
  assert.equal(await p.cancel(m), true);
  assert.equal(await r.exists(k.pending(old), k.pending(nu)), 0);

  await stale(4000);
  await p.scheduleMany([[m, due]]);
  assert.equal(await score(nu, m), due, 'scheduleMany with a stale layout');
  assert.equal(await r.exists(k.pending(old)), 0);

  // A write within 3 s trusts the layout it used.
  await r.del(k.pending(nu));
  await stale(2500);
  await p.schedule(m, due);
  assert.equal(await score(old, m), due, 'written by the layout it read');
  assert.equal(await r.exists(k.pending(nu)), 0);
});

const TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

/** What Redis holds for an id in shard i: score, body, properties. */
async function held(r, k, i, id) {
  const s = await r.zscore(k.pending(i), id);
  const props = await r.hget(k.props(i), id);
  return [s === null ? null : Number(s), await r.hget(k.tasks(i), id), props === null ? null : JSON.parse(props)];
}

test('tasks by id: schedule, reschedule, cancel', async (t) => {
  const { r, k, setLayout, producer } = await setup(t);
  await setLayout(16);
  const p = producer();
  const due = Date.now() + HOUR_MS;
  const props = { routing_key: 'orders.eu', priority: 5, headers: { traceparent: TRACEPARENT, attempt: 1 } };
  const i = await dp.shardOf('order:42', 16);
  assert.equal(await p.scheduleTask('order:42', '{"order":42}', due, props), i);
  assert.deepEqual(await held(r, k, i, 'order:42'), [due, '{"order":42}', props]);

  // Again: body, properties and due time replaced; no properties: none kept.
  assert.equal(await p.scheduleTask(Buffer.from('order:42'), Buffer.from('v2'), new Date(due + 1000)), i);
  assert.deepEqual(await held(r, k, i, 'order:42'), [due + 1000, 'v2', null]);
  await p.scheduleTask('order:42', 'v3', due, { type: 't' });
  assert.deepEqual(await held(r, k, i, 'order:42'), [due, 'v3', { type: 't' }]);

  assert.equal(await p.rescheduleTask('order:42', due + 2000), true);
  assert.deepEqual(await held(r, k, i, 'order:42'), [due + 2000, 'v3', { type: 't' }], 'body and properties stay');
  assert.equal(await p.rescheduleTask('order:42', due + 2000), true, 'the same due time: still pending');
  assert.equal(await p.rescheduleTask('order:43', due), false, 'reschedule of an id never scheduled');
  assert.equal(await r.exists(k.pending(await dp.shardOf('order:43', 16))), 0);

  assert.equal(await p.cancelTask('order:42'), true);
  assert.deepEqual(await held(r, k, i, 'order:42'), [null, null, null]);
  assert.equal(await p.cancelTask('order:42'), false, 'second cancel');
  assert.equal(await p.rescheduleTask('order:42', due), false, 'reschedule after cancel');
});

test('tasks by id: bad properties write nothing', async (t) => {
  const { r, k, prefix, setLayout, producer } = await setup(t);
  await setLayout(16);
  const p = producer();
  const due = Date.now() + HOUR_MS;
  await assert.rejects(p.scheduleTask('t1', 'body', due, { headers: { 'X-Task-Id': 'forged' } }), /X-Task-Id.*reserved/);
  await assert.rejects(p.scheduleTask('t1', 'body', due, { routing: 'x' }), /unknown field "routing"/);
  await assert.rejects(p.scheduleTask('t1', 'body', due, { priority: 300 }), /priority 300 is not 0 to 255/);
  await assert.rejects(p.scheduleTask('', 'body', due), /task id of 0 bytes/);
  assert.deepEqual(await r.keys(`${prefix}:{${Q}:*`), []);
  // A failed write is an error naming the key.
  const i = await dp.shardOf('t', 16);
  await r.set(k.tasks(i), 'not a hash');
  await assert.rejects(p.scheduleTask('t', 'body', due),
    (err) => err instanceof dp.ProducerError && err.message.includes(`task "t" on ${k.pending(i)}`));
});

test('tasks by id: the wake-up in the transaction', async (t) => {
  const { r, k, setLayout, producer } = await setup(t);
  await setLayout(4);
  const p = producer({ wakeWithinMs: 1000 });
  const sub = r.duplicate();
  t.after(() => sub.disconnect());
  const got = [];
  sub.on('message', (_channel, message) => got.push(message));
  await sub.subscribe(k.wake());
  const due = Date.now();
  const i = await p.scheduleTask('soon', 'body', due);
  await p.scheduleTask('later', 'body', due + HOUR_MS);
  const until = Date.now() + 2000;
  while (got.length === 0 && Date.now() < until) await new Promise((res) => setTimeout(res, 10));
  await new Promise((res) => setTimeout(res, 200));
  assert.deepEqual(got, [`due:${i}:${due}`], 'one wake-up, for the task due now');
});

test('tasks by id during a change from 4 to 8 shards', async (t) => {
  const { r, k, setLayout, producer } = await setup(t);
  const h = await dp.loadHashing();
  await setLayout(8, 4);
  const id = await memberMoving(4, 8, 'order');
  const old = h.shardOf(id, 4);
  const nu = h.shardOf(id, 8);
  const due = Date.now() + HOUR_MS;
  const p = producer();
  const put = async (i, body, props, d = due) => { // the id as a producer on shard i wrote it
    await r.zadd(k.pending(i), d, id);
    await r.hset(k.tasks(i), id, body);
    if (props) await r.hset(k.props(i), id, JSON.stringify(props));
  };
  const none = [null, null, null];

  await t.test('schedule goes to the new shard and leaves the old', async () => {
    await put(old, 'old body', { type: 'old' }, due - 5000);
    await r.hset(k.moving(nu), id, due); // listed by a move's first step
    assert.equal(await p.scheduleTask(id, 'new body', due, { type: 'new' }), nu);
    assert.deepEqual(await held(r, k, nu, id), [due, 'new body', { type: 'new' }]);
    assert.deepEqual(await held(r, k, old, id), none, 'the old copy stays');
    assert.equal(await r.hexists(k.moving(nu), id), 0, 'the schedule did not unlist the id from the moving hash');
  });

  await t.test('cancel removes by both counts', async () => {
    await put(old, 'body', { type: 't' });
    assert.equal(await p.cancelTask(id), true);
    assert.deepEqual(await held(r, k, old, id), none);
    assert.deepEqual(await held(r, k, nu, id), none);
    await put(old, 'body');
    assert.equal(await p.cancelTask(id), true, 'a task only in its shard by the old count');
    assert.equal(await p.cancelTask(id), false);
  });

  await t.test('reschedule moves an old copy with its body and properties', async () => {
    await put(old, Buffer.from([0xff, 0x00, 0x01]), { type: 't' });
    assert.equal(await p.rescheduleTask(id, due + 1000), true);
    assert.deepEqual(await r.hgetBuffer(k.tasks(nu), id), Buffer.from([0xff, 0x00, 0x01]), 'the body, byte for byte');
    assert.deepEqual(await held(r, k, nu, id), [due + 1000, (await r.hget(k.tasks(nu), id)), { type: 't' }]);
    assert.deepEqual(await held(r, k, old, id), none);
    assert.equal(await p.rescheduleTask(id, due + 2000), true, 'now in the new shard');
    assert.equal((await held(r, k, nu, id))[0], due + 2000);
    assert.equal(await p.rescheduleTask(await memberMoving(4, 8, 'absent'), due), false);
  });
});
