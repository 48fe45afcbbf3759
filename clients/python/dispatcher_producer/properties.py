"""Task ids and message properties (the contract's task-id extension).

A task scheduled with an id keeps its body in the hash P:{Q:i}:tasks and
its properties, a JSON object, in P:{Q:i}:props, both under the id. The
dispatcher validates the properties again when it publishes, and
dead-letters a task whose properties break a rule; checking them here turns
that into an error at the call instead."""

from __future__ import annotations

import json
import math
from typing import Any, Mapping

MAX_ID_BYTES = 1024
MAX_PROPERTIES_BYTES = 32 << 10  # the stored JSON; AMQP's header frame must hold it
MAX_SHORT_STRING = 255  # AMQP: routing key, basic properties, header names
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
MAX_WHOLE_FLOAT = (1 << 53) - 1  # beyond it a float no longer holds every integer

_STRING_FIELDS = ("routing_key", "content_type", "content_encoding", "correlation_id", "reply_to", "type")
_INT_FIELDS = ("priority", "expiration_ms", "deadline_ms")
FIELDS = frozenset(_STRING_FIELDS + _INT_FIELDS + ("headers",))


def task_id_bytes(task_id: bytes | bytearray | memoryview | str) -> bytes:
    """A task id as the bytes stored (str as UTF-8): 1 to 1024 bytes."""
    if isinstance(task_id, str):
        b = task_id.encode("utf-8")
    elif isinstance(task_id, (bytes, bytearray, memoryview)):
        b = bytes(task_id)
    else:
        raise TypeError(f"task id {task_id!r}: want bytes or str")
    if not 1 <= len(b) <= MAX_ID_BYTES:
        raise ValueError(f"task id of {len(b)} bytes: must be 1 to {MAX_ID_BYTES} bytes")
    return b


def reserved_header(name: str) -> bool:
    """Whether a header name is the dispatcher's own: x-dispatcher-*, x-task-id, x-due-ms."""
    low = name.lower()
    return low.startswith("x-dispatcher-") or low in ("x-task-id", "x-due-ms")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def validate_properties(props: Mapping[str, Any] | None) -> dict:
    """Checks properties by the dispatcher's rules and returns them as the
    dict to store, without the fields that are None (absent). Raises
    ValueError (TypeError for a value of the wrong type) naming the field:
    an unknown field, a non-string where a string goes, priority outside
    0..255, a negative expiration_ms, a header named x-dispatcher-*,
    x-task-id or x-due-ms, or a header value that is not a string, an
    integer (64-bit), a float that is a whole number within +-(2^53-1)
    (stored as that integer) or a bool."""
    if props is None:
        return {}
    if not isinstance(props, Mapping):
        raise TypeError(f"properties {props!r}: want a dict")
    out: dict = {}
    for name in sorted(props, key=str):  # the same error for the same input
        value = props[name]
        if name not in FIELDS:
            raise ValueError(f"properties: unknown field {name!r} (known: {', '.join(sorted(FIELDS))})")
        if value is None:
            continue
        if name in _STRING_FIELDS:
            if not isinstance(value, str):
                raise TypeError(f"properties: field {name!r}: {value!r} is not a string")
            if len(value.encode("utf-8")) > MAX_SHORT_STRING:
                raise ValueError(f"properties: {name} is {len(value.encode('utf-8'))} bytes, over AMQP's {MAX_SHORT_STRING}")
        elif name in _INT_FIELDS:
            if not _is_int(value) or not INT64_MIN <= value <= INT64_MAX:
                raise TypeError(f"properties: field {name!r}: {value!r} is not a 64-bit integer")
            if name == "priority" and not 0 <= value <= 255:
                raise ValueError(f"properties: priority {value} is not 0 to 255")
            if name == "expiration_ms" and value < 0:
                raise ValueError(f"properties: expiration_ms {value} is negative")
        else:
            value = _validate_headers(value)
        out[name] = value
    return out


def _validate_headers(headers: Any) -> dict:
    if not isinstance(headers, Mapping):
        raise TypeError(f"properties: field 'headers': {headers!r} is not a dict")
    out = {}
    for name in sorted(headers, key=str):
        value = headers[name]
        if not isinstance(name, str):
            raise TypeError(f"properties: headers: name {name!r} is not a string")
        if name == "":
            raise ValueError("properties: headers: empty header name")
        if reserved_header(name):
            raise ValueError(f"properties: headers: {name!r} is reserved for the dispatcher")
        if len(name.encode("utf-8")) > MAX_SHORT_STRING:
            raise ValueError(f"properties: headers: a name of {len(name.encode('utf-8'))} bytes, over AMQP's {MAX_SHORT_STRING}")
        if isinstance(value, float):
            # Whole floats are integers, as in the Go and Node producers
            # (where 2.0 and 2 are one number): CONTRACT.md's header vectors.
            if not (math.isfinite(value) and value.is_integer() and abs(value) <= MAX_WHOLE_FLOAT):
                raise ValueError(f"properties: headers: {name!r}: {value!r} is not an integer within +-(2^53-1) "
                                 "(strings, 64-bit integers and booleans only)")
            value = int(value)
        ok = isinstance(value, (str, bool)) or (_is_int(value) and INT64_MIN <= value <= INT64_MAX)
        if not ok:
            raise TypeError(f"properties: headers: {name!r}: {value!r} is a {type(value).__name__} "
                            "(strings, 64-bit integers and booleans only)")
        out[name] = value
    return out


def properties_json(props: Mapping[str, Any] | None) -> bytes | None:
    """The properties as the JSON object stored in P:{Q:i}:props, after
    validate_properties; None when they set nothing (no entry is written)."""
    checked = validate_properties(props)
    if not any(v not in ("", {}) for v in checked.values()):
        return None
    out = json.dumps(checked, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if len(out) > MAX_PROPERTIES_BYTES:
        raise ValueError(f"properties are {len(out)} bytes, over {MAX_PROPERTIES_BYTES}")
    return out
