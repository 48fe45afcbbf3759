"""The contract's rules, without Redis: test vectors, message ids, due
times, argument checks."""

import datetime as dt
import unittest

import redis

import dispatcher_producer as dp


class VectorsTest(unittest.TestCase):
    def test_vectors(self):
        # CONTRACT.md's table, written out here rather than read from the
        # package, so that a wrong table in the package fails too.
        table = [
            ("", "ef46db3751d8e999", 9),
            ("a", "d24ec4f1a98c6e5b", 11),
            ("order:42", "aa1f6214e0a40ff4", 4),
            ('{"id":1}', "b7885ee991dfe823", 3),
            ("задача", "2cc77690f6f15f7a", 10),
        ]
        self.assertEqual(list(dp.VECTORS), table)
        for text, want_hex, want_shard in table:
            with self.subTest(member=text):
                self.assertEqual("%016x" % dp.xxh64(text), want_hex)
                self.assertEqual("%016x" % dp.xxh64(text.encode("utf-8")), want_hex)
                self.assertEqual(dp.shard_of(text, 16), want_shard)
                self.assertEqual(dp.message_id(text, 1767225600000), f"{want_hex}-1767225600000")
        dp.check_vectors()

    def test_message_id_pads_to_16_digits(self):
        # Find a member whose hash has a leading zero nibble: the id must
        # still have 16 hex digits.
        for n in range(10000):
            m = f"pad-{n}".encode()
            if dp.xxh64(m) < 1 << 60:
                break
        else:
            self.fail("no member with a small hash found")
        mid = dp.message_id(m, 1767225600000)
        self.assertRegex(mid, r"^0[0-9a-f]{15}-1767225600000$")

    def test_keys(self):
        k = dp.Keys("dq", "orders")
        self.assertEqual(k.pending(7), "dq:{orders:7}")
        self.assertEqual(k.moving(7), "dq:{orders:7}:moving")
        self.assertEqual(k.shard_count(), "dq:{orders}:shards")
        self.assertEqual(k.reshard(), "dq:{orders}:reshard")
        self.assertEqual(k.retired(), "dq:{orders}:retired")
        self.assertEqual(k.wake(), "dq:{orders}:wake")


class DueTest(unittest.TestCase):
    def test_int_ms(self):
        self.assertEqual(dp.due_ms(1767225600000), 1767225600000)

    def test_aware_datetime(self):
        utc = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
        self.assertEqual(dp.due_ms(utc), 1767225600000)
        berlin = dt.datetime(2026, 1, 1, 1, 0, 0, 123456, tzinfo=dt.timezone(dt.timedelta(hours=1)))
        self.assertEqual(dp.due_ms(berlin), 1767225600123)  # microseconds cut to ms

    def test_refused(self):
        cases = [
            (dt.datetime(2026, 1, 1), ValueError, "no time zone"),
            (1767225600, ValueError, "seconds"),
            (0, ValueError, "seconds"),
            (-5, ValueError, "before March 1973"),
            (1767225600000.0, TypeError, "want int"),
            ("1767225600000", TypeError, "want int"),
            (True, TypeError, "want int"),
        ]
        for due, exc, words in cases:
            with self.subTest(due=due):
                with self.assertRaisesRegex(exc, words):
                    dp.due_ms(due)


class ArgumentsTest(unittest.TestCase):
    def setUp(self):
        # Never connects: the constructor talks to no server.
        self.r = redis.Redis(host="127.0.0.1", port=1)

    def test_queue_names(self):
        for q in ["orders", "a", "A-z_0.9", "x" * 64]:
            dp.Producer(self.r, q)
        for q in ["", "x" * 65, "or ders", "orders:1", "{orders}", "задача", None]:
            with self.subTest(queue=q):
                with self.assertRaisesRegex(ValueError, "queue name"):
                    dp.Producer(self.r, q)

    def test_shards(self):
        dp.Producer(self.r, "q", shards=1)
        dp.Producer(self.r, "q", shards=4096)
        for m in [0, 4097, -1, True, "16", 1.0]:
            with self.subTest(shards=m):
                with self.assertRaisesRegex(ValueError, "shards"):
                    dp.Producer(self.r, "q", shards=m)

    def test_other_arguments(self):
        with self.assertRaisesRegex(ValueError, "prefix"):
            dp.Producer(self.r, "q", prefix="")
        with self.assertRaisesRegex(ValueError, "wake_within_ms"):
            dp.Producer(self.r, "q", wake_within_ms=-1)
        with self.assertRaisesRegex(TypeError, "redis.Redis"):
            dp.Producer(object(), "q")

    def test_async_client_refused(self):
        import redis.asyncio
        with self.assertRaisesRegex(TypeError, "synchronous"):
            dp.Producer(redis.asyncio.Redis(host="127.0.0.1", port=1), "q")

    def test_member_types(self):
        p = dp.Producer(self.r, "q", shards=16)
        with self.assertRaisesRegex(TypeError, "member"):
            p.schedule(42, 1767225600000)


if __name__ == "__main__":
    unittest.main()
