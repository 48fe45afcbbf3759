'use strict';
// Drives the installed Node package (dispatcher-producer) for
// tests/clients_test.go: reads a request as JSON on stdin, runs its
// operations in order and prints one JSON line per operation. Due times are
// given in ms from the driver's start ("in_ms") and printed as due_ms.

const Redis = require('ioredis');
const dp = require('dispatcher-producer');

async function main() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  const req = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  await dp.checkVectors();
  const redis = new Redis(req.redis, { maxRetriesPerRequest: 1 });
  const h = await dp.loadHashing();
  const p = new dp.Producer(redis, req.queue, { prefix: req.prefix });
  const base = Date.now();
  const module = require.resolve('dispatcher-producer');
  try {
    for (const op of req.ops) {
      const res = { op: op.op, module };
      if (op.op === 'schedule_many') {
        const tasks = op.tasks.map((t) => [t.member, base + t.in_ms]);
        res.shards = await p.scheduleMany(tasks);
        res.due_ms = tasks.map(([, d]) => d);
        res.message_ids = tasks.map(([m, d]) => h.messageId(m, d));
      } else if (op.op === 'schedule') {
        const due = base + op.in_ms;
        res.shards = [await p.schedule(op.member, due)];
        res.due_ms = [due];
        res.message_ids = [h.messageId(op.member, due)];
      } else if (op.op === 'reschedule') {
        const due = base + op.in_ms;
        res.result = await p.reschedule(op.member, due);
        res.due_ms = [due];
        res.message_ids = [h.messageId(op.member, due)];
      } else if (op.op === 'cancel') {
        res.result = await p.cancel(op.member);
      } else {
        throw new Error(`driver.js: unknown op ${op.op}`);
      }
      process.stdout.write(`${JSON.stringify(res)}\n`);
    }
  } finally {
    redis.disconnect();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
