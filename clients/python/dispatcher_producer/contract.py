"""The contract's fixed rules (CONTRACT.md): key names, the XXH64 shard
choice, message ids and due times. Nothing here talks to Redis."""

from __future__ import annotations

import datetime as _dt
import re

import xxhash

DEFAULT_PREFIX = "dq"
MAX_SHARDS = 4096

# A due time under 10^11 ms (March 1973) is almost surely seconds, not ms:
# read as ms it is long past and would go out at once.
SECONDS_SCORE_BELOW = 100_000_000_000

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")

# CONTRACT.md's test vectors: member (UTF-8), XXH64 in hex, shard of 16.
VECTORS = (
    ("", "ef46db3751d8e999", 9),
    ("a", "d24ec4f1a98c6e5b", 11),
    ("order:42", "aa1f6214e0a40ff4", 4),
    ('{"id":1}', "b7885ee991dfe823", 3),
    ("задача", "2cc77690f6f15f7a", 10),
)


def check_queue_name(queue: str) -> None:
    """Raises ValueError unless queue is 1 to 64 characters of A-Z a-z 0-9 _ . -"""
    if not isinstance(queue, str) or not _QUEUE_NAME.fullmatch(queue):
        raise ValueError(f"queue name {queue!r}: want 1 to 64 characters of A-Z a-z 0-9 _ . -")


def check_shards(shards: int, what: str) -> None:
    """Raises ValueError unless shards is a shard count 1..4096."""
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"{what} {shards!r}: want a shard count 1..{MAX_SHARDS}")


def member_bytes(member: bytes | bytearray | memoryview | str) -> bytes:
    """A task body as the bytes stored: str is encoded as UTF-8."""
    if isinstance(member, bytes):
        return member
    if isinstance(member, (bytearray, memoryview)):
        return bytes(member)
    if isinstance(member, str):
        return member.encode("utf-8")
    raise TypeError(f"member {member!r}: want bytes or str")


def xxh64(member: bytes | str) -> int:
    """XXH64 of the member with seed 0, as an unsigned 64-bit int."""
    return xxhash.xxh64_intdigest(member_bytes(member), seed=0)


def shard_of(member: bytes | str, shards: int) -> int:
    """The contract's shard choice: XXH64(member, seed 0) mod M."""
    return xxh64(member) % shards


def message_id(member: bytes | str, due_ms: int) -> str:
    """The message_id consumers see: 16 lowercase hex digits of XXH64(member), '-', due ms."""
    return "%016x-%d" % (xxh64(member), due_ms)


def due_ms(due: int | _dt.datetime) -> int:
    """A due time as the contract's score, integer ms since the Unix epoch.

    due is an int (ms) or a timezone-aware datetime. A naive datetime is
    refused: it would be read in the machine's local time zone. An int below
    10^11 is refused as seconds (read as ms it is 1973 or earlier)."""
    if isinstance(due, _dt.datetime):
        if due.tzinfo is None or due.tzinfo.utcoffset(due) is None:
            raise ValueError(f"due {due!r} has no time zone: give an aware datetime, "
                             "e.g. datetime.now(timezone.utc) + timedelta(minutes=5)")
        delta = due - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
        ms = delta // _dt.timedelta(milliseconds=1)
    elif isinstance(due, int) and not isinstance(due, bool):
        ms = due
    else:
        raise TypeError(f"due {due!r}: want int milliseconds since the Unix epoch or an aware datetime")
    if ms < SECONDS_SCORE_BELOW:
        raise ValueError(f"due {ms}: want milliseconds since the Unix epoch; this is before March 1973 "
                         "if read as ms (seconds given instead?)")
    return ms


class Keys:
    """Every Redis key of one queue that a producer touches."""

    def __init__(self, prefix: str, queue: str):
        self.prefix, self.queue = prefix, queue

    def pending(self, i: int) -> str:
        """The pending shard P:{Q:i}, e.g. dq:{orders:4}."""
        return f"{self.prefix}:{{{self.queue}:{i}}}"

    def moving(self, i: int) -> str:
        """The shard's moving hash during a change of the shard count."""
        return self.pending(i) + ":moving"

    def tasks(self, i: int) -> str:
        """The bodies of the shard's tasks scheduled with an id (hash: id -> body)."""
        return self.pending(i) + ":tasks"

    def props(self, i: int) -> str:
        """The message properties of the shard's pending tasks (hash: id -> JSON)."""
        return self.pending(i) + ":props"

    def shard_count(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}:shards"

    def reshard(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}:reshard"

    def retired(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}:retired"

    def wake(self) -> str:
        return f"{self.prefix}:{{{self.queue}}}:wake"


def wake_due(i: int, due: int) -> str:
    """The wake-up a producer publishes after scheduling on shard i: due:<i>:<due_ms>."""
    return f"due:{i}:{due}"


def check_vectors() -> None:
    """Raises RuntimeError if the xxhash library disagrees with the contract."""
    for text, want_hex, want_shard in VECTORS:
        got_hex, got_shard = "%016x" % xxh64(text), shard_of(text, 16)
        if (got_hex, got_shard) != (want_hex, want_shard):
            raise RuntimeError(f"XXH64 test vector {text!r}: got {got_hex} (shard {got_shard} of 16), "
                               f"the contract says {want_hex} (shard {want_shard}): this xxhash library "
                               "does not compute the contract's XXH64 with seed 0")
