"""A queue's shard layout as recorded in Redis (CONTRACT.md, "Changing the
shard count")."""

from __future__ import annotations

from dataclasses import dataclass

from .contract import MAX_SHARDS, Keys, shard_of


class ProducerError(Exception):
    """A write or read of the producer failed; the message names the key."""


class NoLayoutError(ProducerError):
    """No shard count is recorded for the queue (no dispatcher has served it)."""


class LayoutError(ProducerError):
    """A recorded layout key holds something that is not a shard count."""


@dataclass(frozen=True)
class Layout:
    """shards is the M producers hash with (P:{Q}:shards). While the count
    changes, changing_from is the old M (P:{Q}:reshard field from); after a
    shrink, retired is the M it shrank from (P:{Q}:retired). 0 otherwise."""

    shards: int
    changing_from: int = 0
    retired: int = 0

    @property
    def changing(self) -> bool:
        return self.changing_from != 0

    @property
    def moves(self) -> bool:
        """Whether tasks may be moved between shards (during a change, or out
        of the shards a shrink retired): schedules then also unlist the
        member from the shard's moving hash."""
        return self.changing or self.retired != 0

    def indexes(self, member: bytes) -> list[int]:
        """The shards a member may be pending in: by M and, during a change,
        by the old M if that differs."""
        i = shard_of(member, self.shards)
        if self.changing_from:
            j = shard_of(member, self.changing_from)
            if j != i:
                return [i, j]
        return [i]


def _count(value, key: str) -> int:
    """A recorded shard count: 0 if absent."""
    if value is None:
        return 0
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_SHARDS:
        raise LayoutError(f"{key} is {text!r}, not a shard count 1..{MAX_SHARDS}")
    return n


def read_layout(r, keys: Keys) -> Layout:
    """Reads a queue's layout in one round trip (its keys share the hash tag
    {Q}). Raises NoLayoutError when no shard count is recorded."""
    pipe = r.pipeline(transaction=False)
    pipe.get(keys.shard_count())
    pipe.hget(keys.reshard(), "from")
    pipe.get(keys.retired())
    m, old, retired = pipe.execute()
    shards = _count(m, keys.shard_count())
    if shards == 0:
        raise NoLayoutError(f"queue {keys.queue}: no shard count recorded at {keys.shard_count()} "
                            "(no dispatcher has served the queue yet)")
    retired_n = _count(retired, keys.retired())
    return Layout(shards, _count(old, keys.reshard() + " from"), retired_n if retired_n > shards else 0)
