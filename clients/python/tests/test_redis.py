"""The producer against a real Redis: DISPATCHER_TEST_REDIS_URL, or
redis://127.0.0.1:6379/0. Each test works under a prefix of its own and
deletes its keys. No Redis is a failure, not a skip."""

import datetime as dt
import os
import secrets
import time
import unittest

import redis
from redis.client import Pipeline

import dispatcher_producer as dp

REDIS_URL = os.environ.get("DISPATCHER_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
HOUR_MS = 3600_000


def now_ms() -> int:
    return int(time.time() * 1000)


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class SlowPipeline(Pipeline):
    def execute(self, raise_on_error=True):
        try:
            return super().execute(raise_on_error)
        finally:
            self.owner.clock.t += self.owner.delay


class SlowRedis(redis.Redis):
    """A real client whose every round trip takes `delay` seconds of a fake
    clock: a slow Redis, or a process paused mid-write."""

    clock: FakeClock
    delay = 0.0

    def execute_command(self, *args, **options):
        try:
            return super().execute_command(*args, **options)
        finally:
            self.clock.t += self.delay

    def pipeline(self, transaction=True, shard_hint=None):
        p = SlowPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        p.owner = self
        return p


def member_moving(old: int, new: int, start: str = "task") -> bytes:
    """A member whose shard differs by old and by new shards."""
    for n in range(100000):
        m = f"{start}-{n}".encode()
        if dp.shard_of(m, old) != dp.shard_of(m, new):
            return m
    raise AssertionError("no such member")


class RedisTestCase(unittest.TestCase):
    def setUp(self):
        self.r = redis.Redis.from_url(REDIS_URL)
        try:
            self.r.ping()
        except redis.RedisError as e:
            self.fail(f"no Redis for tests at {REDIS_URL} (set DISPATCHER_TEST_REDIS_URL): {e}")
        self.prefix = f"pyclient-{os.getpid()}-{secrets.token_hex(4)}"
        self.q = "orders"
        self.k = dp.Keys(self.prefix, self.q)
        self.addCleanup(self.clean)

    def clean(self):
        keys = list(self.r.scan_iter(match=self.prefix + ":*", count=1000))
        if keys:
            self.r.delete(*keys)
        self.r.close()

    def set_layout(self, shards, changing_from=None, retired=None):
        """Records a layout by hand, as dispatcher reshard would."""
        self.r.set(self.k.shard_count(), shards)
        self.r.delete(self.k.reshard(), self.k.retired())
        if changing_from:
            self.r.hset(self.k.reshard(), mapping={"from": changing_from, "to": shards})
        if retired:
            self.r.set(self.k.retired(), retired)

    def producer(self, **kw):
        kw.setdefault("wake_within_ms", 0)
        return dp.Producer(self.r, self.q, self.prefix, **kw)

    def pending(self, i):
        return {m.decode(): int(s) for m, s in self.r.zrange(self.k.pending(i), 0, -1, withscores=True)}


class ScheduleTest(RedisTestCase):
    def test_schedule_reschedule_cancel(self):
        self.set_layout(16)
        p = self.producer()
        due = now_ms() + HOUR_MS
        self.assertEqual(p.schedule("order:42", due), 4)  # the contract's example: shard 4 of 16
        self.assertEqual(self.pending(4), {"order:42": due})

        # Scheduling again moves it; a datetime due time is the same ms.
        later = dt.datetime.fromtimestamp((due + 1000) / 1000, dt.timezone.utc)
        p.schedule(b"order:42", later)
        self.assertEqual(self.pending(4), {"order:42": due + 1000})

        self.assertTrue(p.reschedule("order:42", due + 2000))
        self.assertEqual(self.pending(4), {"order:42": due + 2000})
        self.assertFalse(p.reschedule("order:43", due), "reschedule of a task never scheduled")
        self.assertEqual(self.r.zscore(self.k.pending(dp.shard_of("order:43", 16)), "order:43"), None,
                         "reschedule must not schedule a task that is not pending")

        self.assertTrue(p.cancel("order:42"))
        self.assertEqual(self.r.exists(self.k.pending(4)), 0)
        self.assertFalse(p.cancel("order:42"), "second cancel")
        self.assertFalse(p.reschedule("order:42", due), "reschedule after cancel")

    def test_cancel_removes_properties(self):
        # A plain member with properties, as a recurring occurrence has:
        # cancelled by its body, its properties go too, or a later task
        # with that body would carry them.
        self.set_layout(16)
        p = self.producer()
        self.r.hset(self.k.props(4), "order:42", '{"routing_key":"cron"}')
        p.schedule("order:42", now_ms() + HOUR_MS)
        self.assertTrue(p.cancel("order:42"))
        self.assertEqual(self.r.hlen(self.k.props(4)), 0, "properties left behind by the cancel")

    def test_schedule_many(self):
        self.set_layout(8)
        p = self.producer()
        due = now_ms() + HOUR_MS
        tasks = [(f"many-{n}", due + n) for n in range(100)] + [("задача".encode(), due)]
        got = p.schedule_many(tasks)
        want = [dp.shard_of(m, 8) for m, _ in tasks]
        self.assertEqual(got, want)
        for (m, d), i in zip(tasks, want):
            member = m if isinstance(m, bytes) else m.encode()
            self.assertEqual(self.r.zscore(self.k.pending(i), member), d, m)
        self.assertEqual(sum(self.r.zcard(self.k.pending(i)) for i in range(8)), len(tasks))
        self.assertEqual(p.schedule_many([]), [])

    def test_wake_ups(self):
        self.set_layout(16)
        p = self.producer(wake_within_ms=1000)
        sub = self.r.pubsub(ignore_subscribe_messages=True)
        self.addCleanup(sub.close)
        sub.subscribe(self.k.wake())
        sub.get_message(timeout=5)  # the subscription's confirmation

        def next_message():
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                msg = sub.get_message(timeout=1)
                if msg:
                    return msg["data"].decode()
            self.fail("no wake-up within 10 s")

        # A task due in an hour sends none: the first message is the next one's.
        p.schedule("later", now_ms() + HOUR_MS)
        soon = now_ms() + 300
        p.schedule("order:42", soon)
        self.assertEqual(next_message(), f"due:4:{soon}")
        # ScheduleMany: one per shard with tasks due soon, with its earliest due time.
        base = now_ms()
        tasks = [("order:42", base + 500), ("a", base + 200), ("a-later", base + HOUR_MS)]
        p.schedule_many(tasks + [("order:42-b", base + 2 * HOUR_MS)])
        got = {next_message(), next_message()}
        self.assertEqual(got, {f"due:4:{base + 500}", f"due:11:{base + 200}"})
        # wake_within_ms=0 turns them off.
        quiet = self.producer(wake_within_ms=0)
        quiet.schedule("a", now_ms())
        p.schedule("order:42", now_ms() + 100)
        self.assertTrue(next_message().startswith("due:4:"))


class ShardCountTest(RedisTestCase):
    def test_no_recorded_count(self):
        p = self.producer()
        with self.assertRaisesRegex(dp.NoLayoutError, r"no shard count recorded at .*:\{orders\}:shards"):
            p.schedule("a", now_ms() + HOUR_MS)
        with self.assertRaises(dp.NoLayoutError):
            p.layout()

        given = self.producer(shards=8)
        with self.assertLogs("dispatcher_producer", "WARNING") as logs:
            self.assertEqual(given.schedule("a", now_ms() + HOUR_MS), dp.shard_of("a", 8))
        self.assertIn("no shard count recorded", logs.output[0])
        self.assertIn("shards=8", logs.output[0])

    def test_recorded_count_wins(self):
        self.set_layout(16)
        p = self.producer(shards=4)
        with self.assertLogs("dispatcher_producer", "WARNING") as logs:
            self.assertEqual(p.schedule("order:42", now_ms() + HOUR_MS), 4)  # by 16, not by 4 (0)
        self.assertIn("16, not shards=4", logs.output[0])
        self.assertEqual(p.layout(), dp.Layout(16))

    def test_bad_recorded_count(self):
        for value in ["0", "4097", "sixteen", "-3"]:
            with self.subTest(value=value):
                self.r.set(self.k.shard_count(), value)
                with self.assertRaisesRegex(dp.LayoutError, f"shards is '{value}', not a shard count"):
                    self.producer().layout()

    def test_layout_is_read_at_most_a_second_before_a_write(self):
        clock = FakeClock()
        self.set_layout(4)
        p = self.producer(clock=clock)
        self.assertEqual(p.layout(), dp.Layout(4))
        self.set_layout(8, changing_from=4)
        clock.t += 0.9
        self.assertEqual(p.layout(), dp.Layout(4), "read again within the second")
        clock.t += 0.1
        self.assertEqual(p.layout(), dp.Layout(8, changing_from=4))
        self.set_layout(4, retired=8)
        clock.t += 1
        self.assertEqual(p.layout(), dp.Layout(4, retired=8))
        self.set_layout(8, retired=8)  # a retired count not above the current one means nothing
        clock.t += 1
        self.assertEqual(p.layout(), dp.Layout(8))


class ReshardTest(RedisTestCase):
    """A change from 4 to 8 shards in progress, its layout keys set by hand."""

    def setUp(self):
        super().setUp()
        self.set_layout(8, changing_from=4)
        self.m = member_moving(4, 8)
        self.old, self.new = dp.shard_of(self.m, 4), dp.shard_of(self.m, 8)
        self.due = now_ms() + HOUR_MS

    def test_schedule_goes_to_the_new_shard_and_leaves_the_old(self):
        self.r.zadd(self.k.pending(self.old), {self.m: self.due - 5000})  # written by an old-count producer
        # A move's first step listed the member in the new shard's moving hash.
        self.r.hset(self.k.moving(self.new), self.m, self.due)
        p = self.producer()
        self.assertEqual(p.schedule(self.m, self.due), self.new)
        self.assertEqual(self.r.zscore(self.k.pending(self.new), self.m), self.due)
        self.assertEqual(self.r.exists(self.k.pending(self.old)), 0, "the old copy stays")
        self.assertFalse(self.r.hexists(self.k.moving(self.new), self.m),
                         "the schedule did not unlist the member from the moving hash")

    def test_schedule_many_during_a_change(self):
        members = [member_moving(4, 8, f"many{n}") for n in range(20)]
        for m in members:
            self.r.zadd(self.k.pending(dp.shard_of(m, 4)), {m: self.due - 5000})
        p = self.producer()
        p.schedule_many([(m, self.due) for m in members])
        for m in members:
            self.assertEqual(self.r.zscore(self.k.pending(dp.shard_of(m, 8)), m), self.due, m)
            self.assertIsNone(self.r.zscore(self.k.pending(dp.shard_of(m, 4)), m), m)

    def test_cancel_removes_by_both_counts(self):
        p = self.producer()
        self.r.zadd(self.k.pending(self.old), {self.m: self.due})
        self.r.zadd(self.k.pending(self.new), {self.m: self.due})
        self.assertTrue(p.cancel(self.m))
        self.assertEqual(self.r.exists(self.k.pending(self.old), self.k.pending(self.new)), 0)
        self.r.zadd(self.k.pending(self.old), {self.m: self.due})
        self.assertTrue(p.cancel(self.m), "a task only in its shard by the old count")
        self.assertFalse(p.cancel(self.m))

    def test_reschedule_moves_an_old_copy_to_the_new_shard(self):
        p = self.producer()
        self.r.zadd(self.k.pending(self.old), {self.m: self.due})
        self.assertTrue(p.reschedule(self.m, self.due + 1000))
        self.assertEqual(self.r.zscore(self.k.pending(self.new), self.m), self.due + 1000)
        self.assertEqual(self.r.exists(self.k.pending(self.old)), 0)
        self.assertTrue(p.reschedule(self.m, self.due + 2000), "now in the new shard")
        self.assertEqual(self.r.zscore(self.k.pending(self.new), self.m), self.due + 2000)
        self.assertFalse(p.reschedule(member_moving(4, 8, "absent"), self.due))

    def test_after_a_shrink_schedules_unlist_from_the_moving_hash(self):
        self.set_layout(4, retired=8)
        p = self.producer()
        i = dp.shard_of(self.m, 4)
        self.r.hset(self.k.moving(i), self.m, self.due)
        self.assertEqual(p.schedule(self.m, self.due), i)
        self.assertFalse(self.r.hexists(self.k.moving(i), self.m))
        self.assertEqual(self.r.zscore(self.k.pending(i), self.m), self.due)
        # Without a change or a shrink, a plain ZADD: the moving hash is not touched.
        self.set_layout(4)
        p = self.producer()
        self.r.hset(self.k.moving(i), self.m, self.due)
        p.schedule(self.m, self.due + 1)
        self.assertTrue(self.r.hexists(self.k.moving(i), self.m))


class SlowWriteTest(RedisTestCase):
    """A write whose reply comes 3 s or more after its layout read was sent
    reads the layout again and, if it changed, writes again by the new one.
    Each write here uses a layout by 4 shards, read just before a change to
    8 was recorded, and its round trips take `delay` s."""

    def setUp(self):
        super().setUp()
        self.clock = FakeClock()
        self.slow = SlowRedis.from_url(REDIS_URL)
        self.slow.clock = self.clock
        self.addCleanup(self.slow.close)
        self.p = dp.Producer(self.slow, self.q, self.prefix, wake_within_ms=0, clock=self.clock)
        self.m = member_moving(4, 8)
        self.old, self.new = self.k.pending(dp.shard_of(self.m, 4)), self.k.pending(dp.shard_of(self.m, 8))
        self.due = now_ms() + HOUR_MS

    def stale(self, delay):
        """The producer reads the layout by 4 now; then the change to 8 is
        recorded, and every round trip takes delay seconds."""
        self.slow.delay = 0
        self.set_layout(4)
        self.clock.t += 10  # the last read is old: read it now
        self.assertEqual(self.p.layout(), dp.Layout(4))
        self.set_layout(8, changing_from=4)
        self.slow.delay = delay

    def test_slow_writes_are_written_again_by_the_new_layout(self):
        self.stale(4)
        self.p.schedule(self.m, self.due)
        self.assertEqual(self.r.zscore(self.new, self.m), self.due, "schedule with a stale layout")
        self.assertEqual(self.r.exists(self.old), 0)

        # As a move would have left it: in its new shard only.
        self.stale(4)
        self.assertTrue(self.p.reschedule(self.m, self.due + 1000))
        self.assertEqual(self.r.zscore(self.new, self.m), self.due + 1000)

        self.stale(4)
        self.assertTrue(self.p.cancel(self.m))
        self.assertEqual(self.r.exists(self.old, self.new), 0)

        self.stale(4)
        self.p.schedule_many([(self.m, self.due)])
        self.assertEqual(self.r.zscore(self.new, self.m), self.due, "schedule_many with a stale layout")
        self.assertEqual(self.r.exists(self.old), 0)

    def test_a_write_within_3_s_trusts_its_layout(self):
        self.r.delete(self.new)
        self.stale(2.5)
        self.p.schedule(self.m, self.due)
        self.assertEqual(self.r.zscore(self.old, self.m), self.due, "written by the layout it read")
        self.assertEqual(self.r.exists(self.new), 0)


if __name__ == "__main__":
    unittest.main()
