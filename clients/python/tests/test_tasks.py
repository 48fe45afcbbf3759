"""Tasks with an id and message properties: the client-side checks of the
properties (against the table the dispatcher's own parsing is checked
against too), and the writes against a real Redis, as in test_redis."""

import json
import os
import unittest

import dispatcher_producer as dp
from test_redis import HOUR_MS, RedisTestCase, member_moving, now_ms

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "testdata", "clients",
                     "properties.json")
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class PropertiesTest(unittest.TestCase):
    def test_the_dispatchers_table(self):
        with open(TABLE, encoding="utf-8") as f:
            cases = json.load(f)["cases"]
        self.assertGreater(len(cases), 10)
        for c in cases:
            with self.subTest(props=c["props"]):
                if c["ok"]:
                    dp.validate_properties(c["props"])
                else:
                    with self.assertRaises((ValueError, TypeError)) as cm:
                        dp.validate_properties(c["props"])
                    self.assertIn(c["field"], str(cm.exception))

    def test_python_values(self):
        limits = {"headers": {"min": -(1 << 63), "max": (1 << 63) - 1}}
        self.assertEqual(dp.validate_properties(limits), limits)
        for bad, field in [({"headers": {"n": 1 << 63}}, "'n'"), ({"headers": {"f": 1.5}}, "'f'"),
                           ({"headers": {"b": b"x"}}, "'b'"), ({"headers": {1: "x"}}, "1"),
                           ({"priority": True}, "priority"), ({"priority": 5.0}, "priority"),
                           ({"deadline_ms": 1 << 63}, "deadline_ms")]:
            with self.subTest(props=bad):
                with self.assertRaises((ValueError, TypeError)) as cm:
                    dp.validate_properties(bad)
                self.assertIn(field, str(cm.exception))
        with self.assertRaises(TypeError):
            dp.validate_properties([("routing_key", "x")])

    def test_header_vectors(self):
        # CONTRACT.md's header test vectors, written out here as Python
        # values (the Go and Node producers' tests have them in theirs): any
        # name but the reserved ones, integers in int64's range, and a float
        # only if it is a whole number within +-(2^53-1), stored as that
        # integer. None: refused, with an error naming the header.
        for name, value, want in [
            ("__proto__", "x", '{"headers":{"__proto__":"x"}}'),
            ("constructor", "y", '{"headers":{"constructor":"y"}}'),
            ("s", "", '{"headers":{"s":""}}'),
            ("b", True, '{"headers":{"b":true}}'),
            ("n", 2, '{"headers":{"n":2}}'),
            ("n", -128, '{"headers":{"n":-128}}'),
            ("n", 4294967295, '{"headers":{"n":4294967295}}'),
            ("max", (1 << 63) - 1, '{"headers":{"max":9223372036854775807}}'),
            ("min", -(1 << 63), '{"headers":{"min":-9223372036854775808}}'),
            ("over", 1 << 63, None),
            ("f", 2.0, '{"headers":{"f":2}}'),
            ("f", -9007199254740991.0, '{"headers":{"f":-9007199254740991}}'),
            ("f", 9007199254740992.0, None),
            ("f", 2.5, None),
            ("f", float("nan"), None),
            ("f", float("inf"), None),
            ("x-due-ms", 1, None),
            ("", "a", None),
            ("l", ["a"], None),
            ("o", {"a": 1}, None),
            ("z", None, None),
        ]:
            with self.subTest(name=name, value=value):
                props = {"headers": {name: value}}
                if want is None:
                    with self.assertRaises((ValueError, TypeError)) as cm:
                        dp.properties_json(props)
                    if name:
                        self.assertIn(repr(name), str(cm.exception))
                else:
                    self.assertEqual(dp.properties_json(props), want.encode("utf-8"))

    def test_json(self):
        self.assertIsNone(dp.properties_json(None))
        self.assertIsNone(dp.properties_json({"routing_key": "", "headers": {}, "type": None}),
                          "properties that set nothing are no entry")
        got = json.loads(dp.properties_json({"routing_key": "eu", "priority": 0, "headers": {"traceparent": TRACEPARENT,
                                                                                             "n": 3, "ok": False}}))
        self.assertEqual(got, {"routing_key": "eu", "priority": 0,
                               "headers": {"traceparent": TRACEPARENT, "n": 3, "ok": False}})
        self.assertEqual(json.loads(dp.properties_json({"type": "задача"}).decode("utf-8")), {"type": "задача"})

    def test_task_ids(self):
        self.assertEqual(dp.task_id_bytes("задача"), "задача".encode())
        self.assertEqual(len(dp.task_id_bytes(b"x" * 1024)), 1024)
        for bad in ("", b"x" * 1025):
            with self.assertRaisesRegex(ValueError, "task id of"):
                dp.task_id_bytes(bad)
        with self.assertRaises(TypeError):
            dp.task_id_bytes(42)


class TaskTest(RedisTestCase):
    def task(self, i, tid):
        """What Redis holds for an id in shard i: score, body, properties."""
        score = self.r.zscore(self.k.pending(i), tid)
        props = self.r.hget(self.k.props(i), tid)
        return (None if score is None else int(score), self.r.hget(self.k.tasks(i), tid),
                None if props is None else json.loads(props))

    def test_schedule_reschedule_cancel(self):
        self.set_layout(16)
        p = self.producer()
        due = now_ms() + HOUR_MS
        props = {"routing_key": "orders.eu", "priority": 5, "headers": {"traceparent": TRACEPARENT, "attempt": 1}}
        i = dp.shard_of("order:42", 16)
        self.assertEqual(p.schedule_task("order:42", b'{"order":42}', due, props), i)
        self.assertEqual(self.task(i, "order:42"), (due, b'{"order":42}', props))

        # Again: body, properties and due time replaced; no properties: none kept.
        self.assertEqual(p.schedule_task(b"order:42", "v2", due + 1000), i)
        self.assertEqual(self.task(i, "order:42"), (due + 1000, b"v2", None))
        p.schedule_task("order:42", "v3", due, {"type": "t"})
        self.assertEqual(self.task(i, "order:42"), (due, b"v3", {"type": "t"}))

        self.assertTrue(p.reschedule_task("order:42", due + 2000))
        self.assertEqual(self.task(i, "order:42"), (due + 2000, b"v3", {"type": "t"}), "body and properties stay")
        self.assertTrue(p.reschedule_task("order:42", due + 2000), "the same due time: still pending")
        self.assertFalse(p.reschedule_task("order:43", due), "reschedule of an id never scheduled")
        self.assertEqual(self.r.exists(self.k.pending(dp.shard_of("order:43", 16))), 0)

        self.assertTrue(p.cancel_task("order:42"))
        self.assertEqual(self.task(i, "order:42"), (None, None, None))
        self.assertFalse(p.cancel_task("order:42"), "second cancel")
        self.assertFalse(p.reschedule_task("order:42", due), "reschedule after cancel")

    def test_bad_properties_write_nothing(self):
        self.set_layout(16)
        p = self.producer()
        with self.assertRaisesRegex(ValueError, "X-Task-Id.*reserved"):
            p.schedule_task("t1", "body", now_ms() + HOUR_MS, {"headers": {"X-Task-Id": "forged"}})
        with self.assertRaisesRegex(ValueError, "unknown field 'routing'"):
            p.schedule_task("t1", "body", now_ms() + HOUR_MS, {"routing": "x"})
        with self.assertRaisesRegex(ValueError, "task id of 0 bytes"):
            p.schedule_task("", "body", now_ms() + HOUR_MS)
        self.assertEqual(list(self.r.scan_iter(match=self.prefix + ":{orders:*")), [])

    def test_wake_up_in_the_transaction(self):
        self.set_layout(4)
        p = self.producer(wake_within_ms=1000)
        sub = self.r.pubsub()
        sub.subscribe(self.k.wake())
        self.assertEqual(sub.get_message(timeout=2)["type"], "subscribe")
        due = now_ms()
        i = p.schedule_task("soon", "body", due)
        p.schedule_task("later", "body", due + HOUR_MS)
        msg = sub.get_message(timeout=2)
        self.assertEqual(msg and msg["data"], f"due:{i}:{due}".encode())
        self.assertIsNone(sub.get_message(timeout=0.2), "a task due in an hour woke the dispatchers")
        sub.close()

    def test_a_failed_transaction_is_an_error_naming_the_key(self):
        self.set_layout(4)
        i = dp.shard_of("t", 4)
        self.r.set(self.k.tasks(i), "not a hash")
        with self.assertRaisesRegex(dp.ProducerError, "task 't'.*" + self.k.pending(i).replace("{", r"\{")):
            self.producer().schedule_task("t", "body", now_ms() + HOUR_MS)


class TaskReshardTest(RedisTestCase):
    """A change from 4 to 8 shards in progress, its layout keys set by hand."""

    def setUp(self):
        super().setUp()
        self.set_layout(8, changing_from=4)
        self.id = member_moving(4, 8, "order")
        self.old, self.new = dp.shard_of(self.id, 4), dp.shard_of(self.id, 8)
        self.due = now_ms() + HOUR_MS

    def put(self, i, body, props=None, due=None):
        """The id as a producer on shard i wrote it."""
        self.r.zadd(self.k.pending(i), {self.id: due or self.due})
        self.r.hset(self.k.tasks(i), self.id, body)
        if props:
            self.r.hset(self.k.props(i), self.id, json.dumps(props))

    def held(self, i):
        return (self.r.zscore(self.k.pending(i), self.id), self.r.hget(self.k.tasks(i), self.id),
                self.r.hget(self.k.props(i), self.id))

    def test_schedule_goes_to_the_new_shard_and_leaves_the_old(self):
        self.put(self.old, b"old body", {"type": "old"}, self.due - 5000)
        self.r.hset(self.k.moving(self.new), self.id, self.due)  # listed by a move's first step
        self.assertEqual(self.producer().schedule_task(self.id, b"new body", self.due, {"type": "new"}), self.new)
        self.assertEqual(self.held(self.new), (self.due, b"new body", b'{"type":"new"}'))
        self.assertEqual(self.held(self.old), (None, None, None), "the old copy stays")
        self.assertFalse(self.r.hexists(self.k.moving(self.new), self.id),
                         "the schedule did not unlist the id from the moving hash")

    def test_cancel_removes_by_both_counts(self):
        p = self.producer()
        self.put(self.old, b"body", {"type": "t"})
        self.put(self.new, b"body")
        self.assertTrue(p.cancel_task(self.id))
        self.assertEqual(self.held(self.old), (None, None, None))
        self.assertEqual(self.held(self.new), (None, None, None))
        self.put(self.old, b"body")
        self.assertTrue(p.cancel_task(self.id), "a task only in its shard by the old count")
        self.assertFalse(p.cancel_task(self.id))

    def test_reschedule_moves_an_old_copy_with_its_body_and_properties(self):
        p = self.producer()
        self.put(self.old, b"body", {"type": "t"})
        self.assertTrue(p.reschedule_task(self.id, self.due + 1000))
        self.assertEqual(self.held(self.new), (self.due + 1000, b"body", b'{"type": "t"}'))
        self.assertEqual(self.held(self.old), (None, None, None))
        self.assertTrue(p.reschedule_task(self.id, self.due + 2000), "now in the new shard")
        self.assertEqual(self.held(self.new)[0], self.due + 2000)
        self.assertFalse(p.reschedule_task(member_moving(4, 8, "absent"), self.due))


if __name__ == "__main__":
    unittest.main()
