#!/usr/bin/python3
"""Schedules delayed tasks for the dispatcher, from Python, with the
producer package in clients/python (dispatcher_producer).

A task is one ZADD of its body (the member), scored with its due time in
milliseconds since the epoch, into shard i = XXH64(member, seed 0) mod M of
queue Q, the sorted set P:{Q:i} (CONTRACT.md). The package hashes with the
M the dispatcher recorded in Redis and follows a change of it (dispatcher
reshard). With --wake, a task due within a second also gets PUBLISH
P:{Q}:wake due:<i>:<due_ms> in the same pipeline, so that a quiet
dispatcher looks at that shard at once instead of at its next sweep.

Needs redis-py and python-xxhash; on Debian: apt-get install python3-redis
python3-xxhash, and run it with /usr/bin/python3. It imports the package
from this checkout (clients/python), so it needs no install. Examples:

    producer.py --queue orders --in 60 '{"order":42}' '{"order":43}'
    producer.py --queue orders --in 0 --wake --count 100
    producer.py --check-vectors

--shards is used only while no shard count is recorded (no dispatcher has
served the queue yet); it must then equal DISPATCHER_QUEUE_<NAME>_SHARDS.
--prefix must equal DISPATCHER_KEY_PREFIX. It prints one JSON object per
scheduled task, one a line: member, key, shard, due_ms and message_id, the
id the consumers will see on the message.
"""

import argparse
import json
import os
import secrets
import sys
import time

# The package from this checkout: clients/python, beside examples/.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))

try:
    import redis  # redis-py (Debian: python3-redis)
    import dispatcher_producer as dp  # needs xxhash (Debian: python3-xxhash)
except ImportError as e:
    sys.exit(f"producer.py: {e}: install python3-redis and python3-xxhash "
             "(scripts/dev.sh test does) and run with /usr/bin/python3")


def main() -> None:
    ap = argparse.ArgumentParser(description="Schedule delayed tasks for the dispatcher.")
    ap.add_argument("--redis", default="redis://localhost:6379/0", help="Redis URL")
    ap.add_argument("--prefix", default="dq", help="DISPATCHER_KEY_PREFIX (default dq)")
    ap.add_argument("--queue", help="queue name Q")
    ap.add_argument("--shards", type=int,
                    help="M to use while none is recorded in Redis (the recorded one wins, with a warning)")
    ap.add_argument("--in", dest="delay", type=float, default=0.0,
                    help="seconds from now until the tasks are due (default 0)")
    ap.add_argument("--wake", action="store_true",
                    help="wake the dispatchers for tasks due within 1 s")
    ap.add_argument("--count", type=int, default=0,
                    help="also schedule N generated bodies task-<tag>-<n>")
    ap.add_argument("--tag", default=secrets.token_hex(4),
                    help="tag of the generated bodies (default: random)")
    ap.add_argument("--check-vectors", action="store_true",
                    help="only check the contract's XXH64 test vectors")
    ap.add_argument("bodies", nargs="*", metavar="BODY", help="task bodies (UTF-8)")
    args = ap.parse_args()

    try:
        dp.check_vectors()  # fails loudly if this xxhash library disagrees with the contract
    except RuntimeError as e:
        sys.exit(f"producer.py: {e}")
    if args.check_vectors:
        print(f"XXH64 test vectors: {len(dp.VECTORS)} ok")
        return
    if not args.queue:
        ap.error("--queue is required")
    if args.shards is not None and not 1 <= args.shards <= 4096:
        ap.error("--shards must be 1 to 4096")

    due_ms = int(time.time() * 1000 + args.delay * 1000)
    members = [b.encode("utf-8") for b in args.bodies]
    members += [f"task-{args.tag}-{n}".encode() for n in range(args.count)]
    if not members:
        ap.error("give BODY arguments or --count")

    r = redis.Redis.from_url(args.redis)
    p = dp.Producer(r, args.queue, args.prefix, shards=args.shards,
                    wake_within_ms=1000 if args.wake else 0)
    shards = []
    try:
        for start in range(0, len(members), 1000):  # 1000 tasks a round trip
            shards += p.schedule_many([(m, due_ms) for m in members[start:start + 1000]])
    except dp.ProducerError as e:
        sys.exit(f"producer.py: {e}")
    for m, i in zip(members, shards):
        print(json.dumps({"member": m.decode("utf-8"), "key": p.keys.pending(i), "shard": i,
                          "due_ms": due_ms, "message_id": dp.message_id(m, due_ms)},
                         ensure_ascii=False))


if __name__ == "__main__":
    main()
