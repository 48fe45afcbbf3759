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

    producer.py --queue orders --in 60 --id order-42 '{"order":42}' \
        --header traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
    producer.py --queue orders --reschedule-id order-42 --in 120
    producer.py --queue orders --cancel-id order-42
    producer.py --queue orders --in 60 '{"order":42}' '{"order":43}'
    producer.py --queue orders --in 0 --wake --count 100
    producer.py --check-vectors

With --id (once per BODY, in order), each task is scheduled by its id:
its body and message properties (--routing-key, --header NAME=VALUE, or
any of them as --properties JSON) go with it in one MULTI/EXEC, the
message carries header x-task-id, and --cancel-id and --reschedule-id
find it by the id alone (CONTRACT.md, tasks with an id).

--shards is used only while no shard count is recorded (no dispatcher has
served the queue yet); it must then equal DISPATCHER_QUEUE_<NAME>_SHARDS.
--prefix must equal DISPATCHER_KEY_PREFIX. It prints one JSON object per
scheduled task, one a line: member, key, shard, due_ms and message_id, the
id the consumers will see on the message (by id, also id and body, member
being the id); --cancel-id and --reschedule-id print id, the op and its
result (false: the task was not pending).
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
    ap.add_argument("--id", dest="ids", action="append", default=[], metavar="ID",
                    help="schedule the BODY at the same place by this task id (once per BODY)")
    ap.add_argument("--routing-key", help="by id: the message's routing key instead of the queue's")
    ap.add_argument("--header", dest="headers", action="append", default=[], metavar="NAME=VALUE",
                    help="by id: a message header (a string), e.g. traceparent=00-...-01")
    ap.add_argument("--properties", metavar="JSON",
                    help="by id: message properties as a JSON object (routing_key, headers, priority, ...)")
    ap.add_argument("--cancel-id", metavar="ID", help="only cancel the pending task with this id")
    ap.add_argument("--reschedule-id", metavar="ID", help="only move the pending task with this id to --in")
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
    if args.ids or args.cancel_id or args.reschedule_id:
        by_id(ap, args, due_ms)
        return
    if args.headers or args.routing_key or args.properties:
        ap.error("--routing-key, --header and --properties go with --id")
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


def properties(ap: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """The message properties from --properties, --routing-key and --header."""
    props = {}
    if args.properties:
        try:
            props = json.loads(args.properties)
        except ValueError as e:
            ap.error(f"--properties: not JSON: {e}")
        if not isinstance(props, dict):
            ap.error("--properties: want a JSON object")
    if args.routing_key:
        props["routing_key"] = args.routing_key
    for h in args.headers:
        name, eq, value = h.partition("=")
        if not eq:
            ap.error(f"--header {h!r}: want NAME=VALUE")
        props.setdefault("headers", {})[name] = value
    try:
        dp.validate_properties(props)  # the dispatcher's rules, checked before anything is written
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    return props


def by_id(ap: argparse.ArgumentParser, args: argparse.Namespace, due_ms: int) -> None:
    """Schedules, reschedules or cancels tasks by their id."""
    if sum(map(bool, (args.ids, args.cancel_id, args.reschedule_id))) != 1:
        ap.error("give one of --id, --cancel-id, --reschedule-id")
    if args.ids and (len(args.ids) != len(args.bodies) or args.count):
        ap.error(f"--id given {len(args.ids)} times for {len(args.bodies)} BODY arguments (and no --count)")
    props = properties(ap, args)
    p = dp.Producer(redis.Redis.from_url(args.redis), args.queue, args.prefix, shards=args.shards,
                    wake_within_ms=1000 if args.wake else 0)
    try:
        if args.cancel_id:
            print(json.dumps({"id": args.cancel_id, "op": "cancel", "result": p.cancel_task(args.cancel_id)},
                             ensure_ascii=False))
            return
        if args.reschedule_id:
            print(json.dumps({"id": args.reschedule_id, "op": "reschedule", "due_ms": due_ms,
                              "result": p.reschedule_task(args.reschedule_id, due_ms),
                              "message_id": dp.message_id(args.reschedule_id, due_ms)}, ensure_ascii=False))
            return
        for task_id, body in zip(args.ids, args.bodies):
            i = p.schedule_task(task_id, body.encode("utf-8"), due_ms, props)
            print(json.dumps({"id": task_id, "member": task_id, "body": body, "key": p.keys.pending(i), "shard": i,
                              "due_ms": due_ms, "message_id": dp.message_id(task_id, due_ms)}, ensure_ascii=False))
    except (dp.ProducerError, ValueError) as e:
        sys.exit(f"producer.py: {e}")


if __name__ == "__main__":
    main()
