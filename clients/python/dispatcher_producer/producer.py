"""The producer: schedules, reschedules and cancels tasks of one queue,
following the shard layout recorded in Redis. It mirrors the Go producer
(shard/producer.go in the dispatcher's repository)."""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Union

from redis.exceptions import NoScriptError, RedisError

from .contract import (DEFAULT_PREFIX, Keys, check_queue_name, check_shards, due_ms, member_bytes,
                       shard_of, wake_due)
from .layout import Layout, LayoutError, NoLayoutError, ProducerError, read_layout
from .properties import properties_json, task_id_bytes

log = logging.getLogger("dispatcher_producer")

Member = Union[bytes, bytearray, memoryview, str]
Due = Union[int, _dt.datetime]

# A layout read is used for at most this long before a write (CONTRACT.md).
LAYOUT_TTL_S = 1.0
# Nothing moves between shards until 5 s after a change is recorded, so a
# write whose reply comes within 3 s of sending the layout read it used is
# safe whatever it read; a later one reads the layout again (the 2 s allow
# for clocks running at slightly different rates and the read's own trip).
LAYOUT_RECHECK_S = 3.0
# Tasks due sooner than this after their ZADD also wake the dispatchers,
# as the Go producer does.
DEFAULT_WAKE_WITHIN_MS = 1000

# ZADD of tasks while tasks may move between shards: also unlists each
# member from the shard's moving hash, so that a move whose first step
# added the member to this shard does not undo this later write.
# KEYS[1] pending shard P:{Q:i}, KEYS[2] its moving hash P:{Q:i}:moving
# ARGV    score1, member1, score2, member2, ...
SCHEDULE_LUA = """
local n = 0
for i = 1, #ARGV, 2 do
  n = n + redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  redis.call('HDEL', KEYS[2], ARGV[i + 1])
end
return n
"""

# Moves a pending member to a new due time, only if it is still pending.
# KEYS[1] pending shard, KEYS[2] its moving hash; ARGV[1] due ms, ARGV[2] member.
# Returns 1 if moved, 0 if the member was not pending.
RESCHEDULE_LUA = """
if redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
  return 1
end
return 0
"""
_RESCHEDULE_SHA = hashlib.sha1(RESCHEDULE_LUA.encode()).hexdigest()


class _Read:
    """A layout and when its read was sent (by the producer's clock); read is
    False for a layout kept after a failed read."""

    __slots__ = ("layout", "sent", "read")

    def __init__(self, layout: Layout, sent: float, read: bool):
        self.layout, self.sent, self.read = layout, sent, read


def _check_client(r) -> None:
    module = type(r).__module__
    if module.startswith("redis.asyncio"):
        raise TypeError(f"redis client {type(r).__name__} from {module}: this producer needs the "
                        "synchronous client, redis.Redis")
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # redis-py before 4.1 has no cluster client
        RedisCluster = ()
    if isinstance(r, RedisCluster):
        raise TypeError("redis.cluster.RedisCluster: Redis Cluster is not supported by this package yet "
                        "(on a cluster the wake-up must wait for the ZADD's reply, and that path is not "
                        "built or tested here); use a single server or a Sentinel primary")
    if not callable(getattr(r, "pipeline", None)):
        raise TypeError(f"redis client {r!r}: want a redis.Redis")


class Producer:
    """Schedules tasks of one queue. Safe to share between threads (as the
    redis.Redis client is).

    The shard count is the one the dispatcher recorded in Redis
    (P:{Q}:shards), read at most a second before each write, so a change of
    it (dispatcher reshard) is followed without a restart. shards= is used
    only while no count is recorded (a queue no dispatcher has served yet),
    with a warning; once one is recorded it wins, with a warning if it
    differs from shards=. Without shards=, a write to a queue with no
    recorded count raises NoLayoutError.

    clock is the monotonic clock (seconds) that times layout reads; tests
    inject one."""

    def __init__(self, redis_client, queue: str, prefix: str = DEFAULT_PREFIX, *, shards: int | None = None,
                 wake_within_ms: int = DEFAULT_WAKE_WITHIN_MS, clock: Callable[[], float] = time.monotonic):
        _check_client(redis_client)
        check_queue_name(queue)
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix {prefix!r}: want a non-empty key prefix (DISPATCHER_KEY_PREFIX)")
        if shards is not None:
            check_shards(shards, "shards")
        if isinstance(wake_within_ms, bool) or not isinstance(wake_within_ms, int) or wake_within_ms < 0:
            raise ValueError(f"wake_within_ms {wake_within_ms!r}: want an int >= 0 (0 turns wake-ups off)")
        self._r = redis_client
        self.keys = Keys(prefix, queue)
        self._shards = shards
        self._wake_within_ms = wake_within_ms
        self._clock = clock
        self._cached: _Read | None = None
        self._warned: set[tuple] = set()

    @property
    def queue(self) -> str:
        return self.keys.queue

    @property
    def prefix(self) -> str:
        return self.keys.prefix

    # --- the layout -------------------------------------------------------

    def layout(self) -> Layout:
        """The queue's layout as recorded in Redis, read at most once a
        second (see the class's doc for shards=)."""
        return self._read_layout(fresh=False).layout

    def _warn_once(self, key: tuple, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", msg)

    def _read_layout(self, fresh: bool) -> _Read:
        cur = self._cached
        if cur is not None and not fresh and self._clock() - cur.sent < LAYOUT_TTL_S:
            return cur
        sent = self._clock()
        try:
            layout, ok = read_layout(self._r, self.keys), True
            if self._shards is not None and layout.shards != self._shards:
                self._warn_once(("differs", layout.shards), (
                    f"queue {self.queue}: hashing with the shard count recorded at {self.keys.shard_count()}, "
                    f"{layout.shards}, not shards={self._shards} given to Producer (shards= applies only while "
                    "no count is recorded)"))
        except NoLayoutError as e:
            if self._shards is None:
                raise NoLayoutError(f"{e}: start a dispatcher for the queue, or give Producer shards= "
                                    f"(its DISPATCHER_QUEUE_<NAME>_SHARDS)") from None
            layout, ok = Layout(self._shards), True
            self._warn_once(("unrecorded",), (
                f"queue {self.queue}: no shard count recorded at {self.keys.shard_count()}; hashing with "
                f"shards={self._shards} given to Producer: it must equal the dispatcher's "
                "DISPATCHER_QUEUE_<NAME>_SHARDS, or tasks go to shards nobody serves"))
        except (RedisError, LayoutError) as e:
            # Keep writing by the last layout read (or shards=): on its own,
            # a failed read of the layout need not stop the writes.
            if cur is not None:
                layout = cur.layout
            elif self._shards is not None:
                layout = Layout(self._shards)
            elif isinstance(e, LayoutError):
                raise
            else:
                raise ProducerError(f"queue {self.queue}: read the shard layout at {self.keys.shard_count()}: "
                                    f"{e}") from e
            ok = False
        nxt = _Read(layout, sent, ok)
        self._cached = nxt
        return nxt

    def _settled(self, write: Callable[[Layout], object]):
        """Runs write with the queue's layout. If write's reply came
        LAYOUT_RECHECK_S or more after that layout's read was sent (a slow
        Redis, a paused process), a change of the shard count may have started
        and a move may undo the write: the layout is read again and, if it
        changed, write runs again by the new one, until one completes in time
        or the layout holds. Every write here is idempotent."""
        cur = self._read_layout(fresh=False)
        result = write(cur.layout)
        while self._clock() - cur.sent >= LAYOUT_RECHECK_S:
            took = self._clock() - cur.sent
            nxt = self._read_layout(fresh=True)
            if not nxt.read:
                raise ProducerError(f"queue {self.queue}: the write took {took:.3f} s, and the shard layout could "
                                    "not be read again to check that it still holds (write it again)")
            if nxt.layout == cur.layout:
                break
            cur = nxt
            result = write(cur.layout)
        return result

    # --- writes -----------------------------------------------------------

    def _wake_soon(self, due: int) -> bool:
        return self._wake_within_ms > 0 and due <= int(time.time() * 1000) + self._wake_within_ms

    def schedule(self, member: Member, due: Due) -> int:
        """Schedules a task: ZADD of member with its due time (int ms since
        the epoch, or an aware datetime) into its shard. Scheduling a member
        that is pending moves it to the new due time. A task due within
        wake_within_ms also wakes the dispatchers (PUBLISH in the ZADD's
        pipeline). Returns the shard index written."""
        return self.schedule_many([(member, due)])[0]

    def schedule_many(self, tasks: Iterable[tuple[Member, Due]]) -> list[int]:
        """Schedules many tasks in one pipelined round trip (see schedule).
        If a shard's ZADD fails, the other shards' tasks are still scheduled,
        and ProducerError names the failed shard's key. Returns the shard
        index of each task, in order."""
        items = [(member_bytes(m), due_ms(d)) for m, d in tasks]
        if not items:
            return []
        return self._settled(lambda layout: self._schedule_by(layout, items))

    def _schedule_by(self, layout: Layout, items: list[tuple[bytes, int]]) -> list[int]:
        by_shard: dict[int, list[tuple[int, bytes]]] = {}
        earliest: dict[int, int] = {}
        # During a change: by new shard, the members to remove from their
        # shard by the old count once their ZADD has succeeded.
        old: dict[int, dict[int, list[bytes]]] = {}
        indexes = []
        for member, due in items:
            i = shard_of(member, layout.shards)
            indexes.append(i)
            if layout.changing:
                j = shard_of(member, layout.changing_from)
                if j != i:
                    old.setdefault(i, {}).setdefault(j, []).append(member)
            by_shard.setdefault(i, []).append((due, member))
            earliest[i] = min(earliest.get(i, due), due)

        pipe = self._r.pipeline(transaction=False)
        positions = {}
        for i, zs in by_shard.items():
            positions[i] = len(pipe)
            if layout.moves:
                args = [a for due, member in zs for a in (str(due), member)]
                pipe.eval(SCHEDULE_LUA, 2, self.keys.pending(i), self.keys.moving(i), *args)
            else:
                pipe.zadd(self.keys.pending(i), {member: due for due, member in zs})
            if self._wake_soon(earliest[i]):
                # One server runs a pipeline in order, so the wake-up never
                # reaches a dispatcher before the ZADD has run. Its own error
                # is ignored: a lost wake-up costs a poll interval.
                pipe.publish(self.keys.wake(), wake_due(i, earliest[i]))
        try:
            results = pipe.execute(raise_on_error=False)
        except RedisError as e:
            raise ProducerError(f"schedule {len(items)} tasks on queue {self.queue}: {e}") from e

        first_err = None
        rm_old: dict[int, list[bytes]] = {}
        for i, pos in positions.items():
            res = results[pos]
            if isinstance(res, Exception):
                if first_err is None:
                    first_err = ProducerError(f"schedule {len(items)} tasks on queue {self.queue}: "
                                              f"{len(by_shard[i])} on {self.keys.pending(i)}: {res}")
                continue
            for j, members in old.get(i, {}).items():
                rm_old.setdefault(j, []).extend(members)
        if rm_old:
            # After the ZADDs' replies, and only for the tasks whose ZADD
            # succeeded, so that a task is never in neither shard.
            rm = self._r.pipeline(transaction=False)
            for j, members in rm_old.items():
                rm.zrem(self.keys.pending(j), *members)
            try:
                for res in rm.execute(raise_on_error=False):
                    if isinstance(res, Exception):
                        raise res
            except RedisError as e:
                if first_err is None:
                    first_err = ProducerError(
                        f"schedule {len(items)} tasks on queue {self.queue}: remove their copies by the old shard "
                        f"count {layout.changing_from}: {e} (run it again: a copy left there is dispatched at its "
                        "old due time)")
        if first_err is not None:
            raise first_err
        return indexes

    def _reschedule_in(self, i: int, member: bytes, due: int) -> int:
        keys = (self.keys.pending(i), self.keys.moving(i))
        try:
            try:
                return self._r.evalsha(_RESCHEDULE_SHA, 2, *keys, str(due), member)
            except NoScriptError:
                return self._r.eval(RESCHEDULE_LUA, 2, *keys, str(due), member)
        except RedisError as e:
            raise ProducerError(f"reschedule on {keys[0]}: {e}") from e

    def reschedule(self, member: Member, due: Due) -> bool:
        """Moves a pending task to a new due time, only if it is still
        pending: False if it is not (never scheduled, cancelled, or already
        claimed by a dispatcher, which it may be up to DISPATCHER_LOOKAHEAD
        before its due time). During a change of the shard count, a task
        pending in its shard by the old count moves to its shard by the new."""
        m, d = member_bytes(member), due_ms(due)

        def write(layout: Layout) -> bool:
            for i in layout.indexes(m):
                if int(self._reschedule_in(i, m, d)) == 0:
                    continue
                if i != shard_of(m, layout.shards):
                    self._schedule_by(layout, [(m, d)])  # to the new count's shard, then out of this one
                return True
            return False

        return self._settled(write)

    def cancel(self, member: Member) -> bool:
        """Removes a pending task. False if it was not pending: never
        scheduled, or already claimed by a dispatcher (up to
        DISPATCHER_LOOKAHEAD before its due time), and then it is delivered.
        During a change of the shard count it is removed from its shards by
        both counts."""
        m = member_bytes(member)
        removed = False

        def write(layout: Layout) -> None:
            nonlocal removed
            idx = layout.indexes(m)
            for i in idx:
                # Its properties (a recurring occurrence's) go with it, in
                # the same MULTI: left behind, a later task with this
                # member would carry them.
                pipe = self._r.pipeline(transaction=True)
                pipe.zrem(self.keys.pending(i), m)
                pipe.hdel(self.keys.props(i), m)
                try:
                    n, _ = pipe.execute()
                except RedisError as e:
                    raise ProducerError(f"cancel on {self.keys.pending(i)}: {e}") from e
                removed = removed or int(n) > 0

        self._settled(write)
        return removed

    # --- tasks with an id -------------------------------------------------

    def schedule_task(self, task_id: Member, body: Member, due: Due,
                      properties: Mapping[str, Any] | None = None) -> int:
        """Schedules a task by its id (1 to 1024 bytes; str as UTF-8): in
        one MULTI/EXEC on shard XXH64(id) mod M, HSET of the body in
        P:{Q:i}:tasks, HSET of the properties in P:{Q:i}:props (HDEL when
        there are none) and ZADD of the id with its due time. Scheduling a
        pending id again replaces its body, properties and due time. The
        properties (routing_key, headers, content_type, ...) are checked
        first by the dispatcher's rules: ValueError or TypeError names the
        field. The message's message_id is message_id(task_id, due), its
        header x-task-id the id. Returns the shard index written."""
        tid, b, d = task_id_bytes(task_id), member_bytes(body), due_ms(due)
        props = properties_json(properties)
        return self._settled(lambda layout: self._schedule_task_by(layout, tid, b, props, d))

    def _schedule_task_by(self, layout: Layout, tid: bytes, body: bytes | None, props: bytes | None,
                          due: int) -> int:
        """Writes the task to its shard by layout.shards and then, during a
        change, removes it from its shard by the old count (after the
        reply, so that it is never in neither). body None leaves the tasks
        hash alone (a plain member moved by reschedule_task)."""
        i = shard_of(tid, layout.shards)
        key = self.keys.pending(i)
        pipe = self._r.pipeline(transaction=True)
        if body is not None:
            pipe.hset(self.keys.tasks(i), tid, body)
        if props is None:
            pipe.hdel(self.keys.props(i), tid)
        else:
            pipe.hset(self.keys.props(i), tid, props)
        pipe.zadd(key, {tid: due})
        if layout.moves:
            # Unlisted in the same transaction: a move whose first step
            # added the id here does not undo this write.
            pipe.hdel(self.keys.moving(i), tid)
        writes = len(pipe)
        if self._wake_soon(due):
            # After the ZADD, inside the transaction; its own error is
            # ignored (a lost wake-up costs a poll interval).
            pipe.publish(self.keys.wake(), wake_due(i, due))
        try:
            results = pipe.execute(raise_on_error=False)
        except RedisError as e:
            raise ProducerError(f"schedule task {_show(tid)} on {key}: {e}") from e
        for res in results[:writes]:
            if isinstance(res, Exception):
                raise ProducerError(f"schedule task {_show(tid)} on {key}: {res}")
        if layout.changing:
            j = shard_of(tid, layout.changing_from)
            if j != i:
                try:
                    self._remove_task_in(j, tid)
                except ProducerError as e:
                    raise ProducerError(f"schedule task {_show(tid)}: remove its copy by the old shard count "
                                        f"{layout.changing_from}: {e} (run it again: a copy left there is "
                                        "dispatched at its old due time)") from e
        return i

    def _remove_task_in(self, i: int, tid: bytes) -> bool:
        """MULTI, ZREM of the id, HDEL of its body and properties, EXEC, on
        shard i: True if the ZREM removed it."""
        key = self.keys.pending(i)
        pipe = self._r.pipeline(transaction=True)
        pipe.zrem(key, tid)
        pipe.hdel(self.keys.tasks(i), tid)
        pipe.hdel(self.keys.props(i), tid)
        try:
            results = pipe.execute(raise_on_error=False)
        except RedisError as e:
            raise ProducerError(f"cancel task {_show(tid)} on {key}: {e}") from e
        for res in results:
            if isinstance(res, Exception):
                raise ProducerError(f"cancel task {_show(tid)} on {key}: {res}")
        return int(results[0]) > 0

    def reschedule_task(self, task_id: Member, due: Due) -> bool:
        """Moves a pending task to a new due time (ZADD XX CH of its id; its
        body and properties stay): False if it is not pending (never
        scheduled, cancelled, or already claimed by a dispatcher, up to
        DISPATCHER_LOOKAHEAD before its due time). During a change of the
        shard count, a task pending in its shard by the old count moves,
        with its body and properties, to its shard by the new."""
        tid, d = task_id_bytes(task_id), due_ms(due)

        def write(layout: Layout) -> bool:
            new = shard_of(tid, layout.shards)
            for i in layout.indexes(tid):
                key = self.keys.pending(i)
                pipe = self._r.pipeline(transaction=True)
                pipe.zscore(key, tid)  # pending: the ZADD XX below moved it
                pipe.zadd(key, {tid: d}, xx=True, ch=True)
                if layout.moves:
                    pipe.hdel(self.keys.moving(i), tid)
                if i != new:
                    pipe.hget(self.keys.tasks(i), tid)
                    pipe.hget(self.keys.props(i), tid)
                try:
                    results = pipe.execute()
                except RedisError as e:
                    raise ProducerError(f"reschedule task {_show(tid)} on {key}: {e}") from e
                if results[0] is None:
                    continue
                if i != new:
                    # To the new count's shard, then out of this one.
                    self._schedule_task_by(layout, tid, results[-2], results[-1], d)
                return True
            return False

        return self._settled(write)

    def cancel_task(self, task_id: Member) -> bool:
        """Cancels a pending task by its id: MULTI, ZREM, HDEL of its body
        and properties, EXEC. False if it was not pending (never scheduled,
        or already claimed by a dispatcher, up to DISPATCHER_LOOKAHEAD before
        its due time, and then it is delivered). During a change of the
        shard count it is removed from its shards by both counts."""
        tid = task_id_bytes(task_id)
        removed = False

        def write(layout: Layout) -> None:
            nonlocal removed
            for i in layout.indexes(tid):
                removed = self._remove_task_in(i, tid) or removed

        self._settled(write)
        return removed


def _show(tid: bytes) -> str:
    """A task id for an error message: quoted, at most 64 characters."""
    text = tid.decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= 64 else text[:61] + "...")
