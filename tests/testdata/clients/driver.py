#!/usr/bin/python3
"""Drives the installed Python package (dispatcher_producer) for
tests/clients_test.go: reads a request as JSON on stdin, runs its
operations in order and prints one JSON line per operation. Due times are
given in ms from the driver's start ("in_ms") and printed as due_ms."""

import json
import sys
import time

import redis

import dispatcher_producer as dp

req = json.load(sys.stdin)
dp.check_vectors()
p = dp.Producer(redis.Redis.from_url(req["redis"]), req["queue"], req["prefix"])
base = int(time.time() * 1000)
out = sys.stdout
for op in req["ops"]:
    kind = op["op"]
    res = {"op": kind, "module": dp.__file__}
    if kind == "schedule_many":
        tasks = [(t["member"], base + t["in_ms"]) for t in op["tasks"]]
        res["shards"] = p.schedule_many(tasks)
        res["due_ms"] = [d for _, d in tasks]
        res["message_ids"] = [dp.message_id(m, d) for m, d in tasks]
    elif kind == "schedule":
        due = base + op["in_ms"]
        res.update(shards=[p.schedule(op["member"], due)], due_ms=[due], message_ids=[dp.message_id(op["member"], due)])
    elif kind == "reschedule":
        due = base + op["in_ms"]
        res.update(result=p.reschedule(op["member"], due), due_ms=[due],
                   message_ids=[dp.message_id(op["member"], due)])
    elif kind == "cancel":
        res["result"] = p.cancel(op["member"])
    else:
        sys.exit(f"driver.py: unknown op {kind!r}")
    out.write(json.dumps(res, ensure_ascii=False) + "\n")
