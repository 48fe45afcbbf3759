#!/usr/bin/python3
"""Steady load for the resharding test: RATE tasks a second for SECONDS,
each due a uniform 0..SPREAD seconds after it is scheduled. For the first
half it ZADDs by a fixed --shards, as a producer that never switched does;
then it schedules through the Python package (clients/python), which
follows the count recorded in Redis. Prints one line per task: message_id
due_ms."""

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
import dispatcher_producer as dp  # noqa: E402
import redis  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--redis", required=True)
ap.add_argument("--prefix", required=True)
ap.add_argument("--queue", required=True)
ap.add_argument("--shards", type=int, required=True)
ap.add_argument("--rate", type=int, default=2000)
ap.add_argument("--seconds", type=float, default=20)
ap.add_argument("--spread", type=float, default=30)
a = ap.parse_args()

r = redis.Redis.from_url(a.redis)
keys = dp.Keys(a.prefix, a.queue)


class Fixed:
    """A producer with a fixed shard count: plain ZADDs and wake-ups."""

    def schedule_many(self, batch):
        pipe = r.pipeline(transaction=False)
        now_ms = int(time.time() * 1000)
        for m, due in batch:
            i = dp.shard_of(m, a.shards)
            pipe.zadd(keys.pending(i), {m: due})
            if due - now_ms < 1000:
                pipe.publish(keys.wake(), f"due:{i}:{due}")
        pipe.execute()


fixed = Fixed()
follow = dp.Producer(r, a.queue, a.prefix)
rng = random.Random(7)
start = time.monotonic()
n = 0
out = sys.stdout
while True:
    el = time.monotonic() - start
    if el >= a.seconds:
        break
    p = fixed if el < a.seconds / 2 else follow
    want = int(el * a.rate) + 1
    batch = []
    now_ms = int(time.time() * 1000)
    while n < want:
        m = f"load-{n}".encode()
        due = now_ms + int(rng.random() * a.spread * 1000)
        batch.append((m, due))
        n += 1
    if batch:
        p.schedule_many(batch)
        for m, due in batch:
            out.write(f"{dp.message_id(m, due)} {due}\n")
    time.sleep(0.01)
out.flush()
layout = follow.layout()
print(f"switched {p is follow} layout ({layout.shards}, {layout.changing_from})", file=sys.stderr)
