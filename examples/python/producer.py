#!/usr/bin/python3
"""Schedules delayed tasks for the dispatcher, from Python.

It follows CONTRACT.md only: a task is one ZADD of its body (the member),
scored with its due time in milliseconds since the epoch, into shard
i = XXH64(member, seed 0) mod M of queue Q, the sorted set P:{Q:i}. With
--wake, a task due within a second also gets PUBLISH P:{Q}:wake
due:<i>:<due_ms> in the same pipeline, so that a quiet dispatcher looks at
that shard at once instead of at its next sweep.

Needs redis-py and python-xxhash; on Debian: apt-get install python3-redis
python3-xxhash, and run it with /usr/bin/python3. Examples:

    producer.py --queue orders --shards 16 --in 60 '{"order":42}' '{"order":43}'
    producer.py --queue orders --shards 16 --in 0 --wake --count 100
    producer.py --check-vectors

Without --shards it hashes with the shard count the dispatcher recorded in
Redis and follows a change of it (dispatcher reshard). A --shards given must
equal that count (it warns if not): tasks hashed with a larger one land in
shards no dispatcher serves and wait up to a minute to be moved. --prefix must equal
DISPATCHER_KEY_PREFIX. It prints one JSON object per scheduled
task, one a line: member, key, shard, due_ms and message_id, the id the
consumers will see on the message.
"""

import argparse
import json
import secrets
import sys
import time

try:
    import redis  # redis-py (Debian: python3-redis)
    import xxhash  # python-xxhash (Debian: python3-xxhash)
except ImportError as e:
    sys.exit(f"producer.py: {e}: install python3-redis and python3-xxhash "
             "(scripts/dev.sh test does) and run with /usr/bin/python3")

# The Go producer sends a wake-up for tasks due within 1 s; so does this one.
WAKE_WITHIN_MS = 1000


def shard_of(member: bytes, shards: int) -> int:
    """The contract's shard choice: XXH64(member, seed 0) mod M, unsigned."""
    return xxhash.xxh64_intdigest(member, seed=0) % shards


def pending_key(prefix: str, queue: str, i: int) -> str:
    return f"{prefix}:{{{queue}:{i}}}"  # e.g. dq:{orders:4}


def message_id(member: bytes, due_ms: int) -> str:
    """The message_id consumers see: 16 hex digits of XXH64(member), '-', due ms."""
    return "%016x-%d" % (xxhash.xxh64_intdigest(member, seed=0), due_ms)


def read_layout(r: redis.Redis, prefix: str, queue: str) -> tuple[int, int]:
    """The queue's shard count M as recorded in Redis, and, while it changes
    (dispatcher reshard), the count it changes from (0 otherwise)."""
    pipe = r.pipeline(transaction=False)
    pipe.get(f"{prefix}:{{{queue}}}:shards")
    pipe.hget(f"{prefix}:{{{queue}}}:reshard", "from")
    m, old = pipe.execute()
    if m is None:
        raise SystemExit(f"producer.py: no shard count recorded for queue {queue}: "
                         "start a dispatcher for it, or give --shards")
    return int(m), int(old or 0)


class Producer:
    """shards=None follows the count recorded in Redis (read again every
    second), as CONTRACT.md asks of producers that live through a change of
    the shard count; an int fixes it."""

    def __init__(self, r: redis.Redis, prefix: str, queue: str, shards: int | None, wake: bool = True):
        self.r, self.prefix, self.queue, self.fixed, self.wake = r, prefix, queue, shards, wake
        self._layout, self._read_at = (shards or 0, 0), 0.0

    def layout(self) -> tuple[int, int]:
        if self.fixed:
            return self.fixed, 0
        if time.monotonic() - self._read_at >= 1.0:
            self._layout, self._read_at = read_layout(self.r, self.prefix, self.queue), time.monotonic()
        return self._layout

    def schedule(self, tasks: list[tuple[bytes, int]]) -> list[int]:
        """ZADDs (member, due_ms) pairs in one round trip; also reschedules.
        During a change of the shard count, each goes to its shard by the new
        count and a copy pending in its shard by the old one is removed after
        it. Returns the shard of each task."""
        m, old = self.layout()
        now_ms = int(time.time() * 1000)
        pipe = self.r.pipeline(transaction=False)
        shards = []
        for member, due_ms in tasks:
            i = shard_of(member, m)
            shards.append(i)
            pipe.zadd(pending_key(self.prefix, self.queue, i), {member: due_ms})
            if self.wake and due_ms - now_ms < WAKE_WITHIN_MS:
                pipe.publish(f"{self.prefix}:{{{self.queue}}}:wake", f"due:{i}:{due_ms}")
            if old and shard_of(member, old) != i:
                pipe.zrem(pending_key(self.prefix, self.queue, shard_of(member, old)), member)
        pipe.execute()
        return shards

    def cancel(self, member: bytes) -> bool:
        """False if the task is no longer pending (a dispatcher took it).
        During a change of the shard count, it is removed by both counts."""
        m, old = self.layout()
        shards = {shard_of(member, m)} | ({shard_of(member, old)} if old else set())
        return sum(self.r.zrem(pending_key(self.prefix, self.queue, i), member) for i in shards) > 0


# CONTRACT.md's test vectors: member, XXH64 in hex, shard of 16.
VECTORS = [
    ("", "ef46db3751d8e999", 9),
    ("a", "d24ec4f1a98c6e5b", 11),
    ("order:42", "aa1f6214e0a40ff4", 4),
    ('{"id":1}', "b7885ee991dfe823", 3),
    ("задача", "2cc77690f6f15f7a", 10),
]


def check_vectors() -> None:
    """Fails loudly if this xxhash library disagrees with the contract."""
    for text, want_hex, want_shard in VECTORS:
        member = text.encode("utf-8")
        got_hex = message_id(member, 0)[:16]
        got_shard = shard_of(member, 16)
        if (got_hex, got_shard) != (want_hex, want_shard):
            sys.exit(f"producer.py: XXH64 test vector {text!r}: got {got_hex} (shard {got_shard} of 16), "
                     f"the contract says {want_hex} (shard {want_shard}): this xxhash library "
                     "does not compute the contract's XXH64 with seed 0")


def warn_count(r: redis.Redis, prefix: str, queue: str, shards: int) -> None:
    """Warns on stderr when a fixed --shards differs from the recorded count."""
    recorded = r.get(f"{prefix}:{{{queue}}}:shards")
    if recorded is None or int(recorded) == shards:
        return
    if shards > int(recorded):
        why = ("tasks hashed to shards beyond it wait up to a minute for the dispatcher "
               "to move them to their shards")
    else:
        why = "tasks land outside their shards (dispatched, counted as misplaced)"
    print(f"producer.py: warning: --shards {shards}, but queue {queue} has {int(recorded)} "
          f"shards recorded: {why}; leave --shards out to use the recorded count",
          file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description="Schedule delayed tasks for the dispatcher.")
    ap.add_argument("--redis", default="redis://localhost:6379/0", help="Redis URL")
    ap.add_argument("--prefix", default="dq", help="DISPATCHER_KEY_PREFIX (default dq)")
    ap.add_argument("--queue", help="queue name Q")
    ap.add_argument("--shards", type=int,
                    help="M, which must equal the count recorded in Redis "
                         "(default: that count, followed through a change)")
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

    check_vectors()
    if args.check_vectors:
        print(f"XXH64 test vectors: {len(VECTORS)} ok")
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
    if args.shards is not None:
        warn_count(r, args.prefix, args.queue, args.shards)
    p = Producer(r, args.prefix, args.queue, args.shards, args.wake)
    shards = []
    for start in range(0, len(members), 1000):  # 1000 tasks a round trip
        shards += p.schedule([(m, due_ms) for m in members[start:start + 1000]])
    for m, i in zip(members, shards):
        print(json.dumps({"member": m.decode("utf-8"), "key": pending_key(args.prefix, args.queue, i),
                          "shard": i, "due_ms": due_ms, "message_id": message_id(m, due_ms)},
                         ensure_ascii=False))


if __name__ == "__main__":
    main()
