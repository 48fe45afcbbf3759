#!/usr/bin/python3
"""A producer in another language, on Redis Cluster, written from CONTRACT.md only.

Run with Debian's /usr/bin/python3 and its python3-redis and python3-xxhash
(scripts/dev.sh installs them). It reads one JSON object on stdin:

    {"seeds": ["127.0.0.1:7000", ...], "prefix": "dq", "queue": "orders",
     "shards": 16, "count": 300, "due_ms": 1767225600000, "spread_ms": 1000}

checks the contract's XXH64 test vectors (exit 3 if any differs), then
schedules count tasks with plain ZADD P:{Q:i} <due_ms> <member>, i =
XXH64(member, seed 0) mod M, task n due at due_ms + n*spread_ms/count, and
prints one JSON object on stdout:

    {"tasks": [{"member": "...", "key": "...", "shard": i, "due_ms": ...,
                "message_id": "<16 hex>-<due_ms>"}, ...],
     "vectors": 5, "written_ms": <ms after the last ZADD>}

Members are UTF-8 text; some are Cyrillic, some JSON-like with braces, some
look like a hash tag themselves: none of that matters, as the tag is in the key.
"""

import json
import sys
import time

try:
    import xxhash
    from redis.cluster import ClusterNode, RedisCluster
except ImportError as e:  # the Go test says what to do about it
    print(f"missing Python module: {e}; run scripts/dev.sh test (it installs "
          "python3-redis python3-xxhash)", file=sys.stderr)
    sys.exit(2)

# CONTRACT.md: member (UTF-8), XXH64 seed 0 in hex, mod 16.
VECTORS = [
    ("", "ef46db3751d8e999", 9),
    ("a", "d24ec4f1a98c6e5b", 11),
    ("order:42", "aa1f6214e0a40ff4", 4),
    ('{"id":1}', "b7885ee991dfe823", 3),
    ("задача", "2cc77690f6f15f7a", 10),
]


def xxh64(member: bytes) -> int:
    return xxhash.xxh64_intdigest(member, seed=0)


def message_id(member: bytes, due_ms: int) -> str:
    return "%016x-%d" % (xxh64(member), due_ms)


def check_vectors() -> None:
    bad = []
    for text, want_hex, want_mod in VECTORS:
        h = xxh64(text.encode("utf-8"))
        if "%016x" % h != want_hex or h % 16 != want_mod:
            bad.append(f"{text!r}: got {h:016x} mod 16 = {h % 16}, "
                       f"want {want_hex} mod 16 = {want_mod}")
    if bad:
        print("XXH64 test vectors differ:\n" + "\n".join(bad), file=sys.stderr)
        sys.exit(3)


def member(n: int) -> bytes:
    kind = n % 4
    if kind == 0:
        s = f"задача-{n}"
    elif kind == 1:
        s = json.dumps({"id": n, "note": "тело {x}"}, ensure_ascii=False,
                       separators=(",", ":"))
    elif kind == 2:
        s = f"{{orders:{n % 16}}}-looks-like-a-tag-{n}"
    else:
        s = f"plain:{n}"
    return s.encode("utf-8")


def main() -> None:
    check_vectors()
    req = json.load(sys.stdin)
    prefix, queue, shards = req["prefix"], req["queue"], int(req["shards"])
    count, due0, spread = int(req["count"]), int(req["due_ms"]), int(req.get("spread_ms", 0))
    nodes = []
    for addr in req["seeds"]:
        host, port = addr.rsplit(":", 1)
        nodes.append(ClusterNode(host, int(port)))
    rc = RedisCluster(startup_nodes=nodes, decode_responses=False)
    out = []
    try:
        for n in range(count):
            m = member(n)
            i = xxh64(m) % shards
            key = f"{prefix}:{{{queue}:{i}}}"
            due = due0 + n * spread // count
            added = rc.zadd(key, {m: due})
            if added != 1:
                print(f"ZADD {key} {due} {m!r} added {added}, want 1", file=sys.stderr)
                sys.exit(4)
            out.append({"member": m.decode("utf-8"), "key": key, "shard": i,
                        "due_ms": due, "message_id": message_id(m, due)})
    finally:
        rc.close()
    json.dump({"tasks": out, "vectors": len(VECTORS),
               "written_ms": time.time_ns() // 1_000_000},
              sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
