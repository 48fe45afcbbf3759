#!/usr/bin/python3
"""A producer in another language that wakes the dispatchers, written from
CONTRACT.md only ("Waking the dispatchers").

Run with Debian's /usr/bin/python3 and its python3-redis and python3-xxhash
(scripts/dev.sh installs them). It reads one JSON object on stdin:

    {"url": "redis://127.0.0.1:6379/0", "prefix": "dq", "queue": "orders",
     "shards": 4, "count": 5}

and, for each of count tasks due now, sends in one pipeline
ZADD P:{Q:i} <due_ms> <member> and PUBLISH P:{Q}:wake due:<i>:<due_ms>,
i = XXH64(member, seed 0) mod M. It prints one JSON object on stdout:

    {"tasks": [{"member": "...", "due_ms": ..., "message_id": "<16 hex>-<due_ms>"}, ...]}
"""

import json
import sys
import time

try:
    import redis
    import xxhash
except ImportError as e:  # the Go test says what to do about it
    print(f"missing Python module: {e}; run scripts/dev.sh test (it installs "
          "python3-redis python3-xxhash)", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    req = json.load(sys.stdin)
    prefix, queue, shards = req["prefix"], req["queue"], int(req["shards"])
    r = redis.Redis.from_url(req["url"])
    tasks = []
    for n in range(int(req["count"])):
        member = f"woken-{n}".encode()
        h = xxhash.xxh64_intdigest(member, seed=0)
        i = h % shards
        due_ms = int(time.time() * 1000)
        pipe = r.pipeline(transaction=False)
        pipe.zadd(f"{prefix}:{{{queue}:{i}}}", {member: due_ms})
        pipe.publish(f"{prefix}:{{{queue}}}:wake", f"due:{i}:{due_ms}")
        pipe.execute()
        tasks.append({"member": member.decode(), "due_ms": due_ms,
                      "message_id": "%016x-%d" % (h, due_ms)})

    json.dump({"tasks": tasks}, sys.stdout)


if __name__ == "__main__":
    main()
