"""Producer for the dispatcher: schedules delayed tasks straight into Redis
by the dispatcher's public contract (CONTRACT.md), so that the dispatcher
publishes them to RabbitMQ at their due time.

    import redis
    from dispatcher_producer import Producer

    p = Producer(redis.Redis.from_url("redis://localhost:6379/0"), "orders")
    p.schedule_task("order-42", b'{"order":42}', due,   # due: int ms since the epoch, or an aware datetime
                    properties={"headers": {"traceparent": traceparent}})
    p.cancel_task("order-42")
"""

from .contract import (DEFAULT_PREFIX, MAX_SHARDS, VECTORS, Keys, check_vectors, due_ms, message_id,
                       shard_of, xxh64)
from .layout import Layout, LayoutError, NoLayoutError, ProducerError, read_layout
from .properties import MAX_ID_BYTES, properties_json, reserved_header, task_id_bytes, validate_properties
from .producer import DEFAULT_WAKE_WITHIN_MS, LAYOUT_RECHECK_S, LAYOUT_TTL_S, Producer

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PREFIX", "DEFAULT_WAKE_WITHIN_MS", "LAYOUT_RECHECK_S", "LAYOUT_TTL_S", "MAX_ID_BYTES", "MAX_SHARDS",
    "VECTORS", "Keys", "Layout", "LayoutError", "NoLayoutError", "Producer", "ProducerError",
    "check_vectors", "due_ms", "message_id", "properties_json", "read_layout", "reserved_header", "shard_of",
    "task_id_bytes", "validate_properties", "xxh64",
]
