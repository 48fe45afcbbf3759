#!/usr/bin/python3
"""Steady load for the resharding test: RATE tasks a second for SECONDS,
each due a uniform 0..SPREAD seconds after it is scheduled, through
examples/python/producer.py's Producer. For the first half it hashes with
a fixed --shards (a producer not yet switched); then it follows the count
recorded in Redis. Prints one line per task: message_id due_ms."""

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import producer  # noqa: E402
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
fixed = producer.Producer(r, a.prefix, a.queue, a.shards, wake=True)
follow = producer.Producer(r, a.prefix, a.queue, None, wake=True)
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
        p.schedule(batch)
        for m, due in batch:
            out.write(f"{producer.message_id(m, due)} {due}\n")
    time.sleep(0.01)
out.flush()
print(f"switched {p is follow} layout {follow.layout()}", file=sys.stderr)
