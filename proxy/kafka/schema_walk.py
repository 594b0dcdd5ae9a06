"""Step over a message laid out per a kio schema, building no object.

The rewriters change a few bytes of a response (the broker addresses in a Metadata
answer, the node endpoints after a Fetch answer's partitions) and must leave the rest,
records included, as it came: they find those bytes by stepping over what precedes
them. Stepping over a Fetch answer is per-partition work (a records field is one length
and a jump), never per-record work. Every length is checked against the buffer, so bad
input raises FrameError and never allocates.

The plan for each kio dataclass is built once from its fields' `kafka_type` metadata and
types, the same information kio's own readers are generated from.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any, get_args, get_origin

from kio.static.protocol import Entity

from proxy.kafka.frames import FrameError
from proxy.kafka.wire import (
    INT8,
    read_array_length,
    read_int16,
    read_int32,
    read_uvarint,
    skip,
    skip_tagged_fields,
)

Skipper = Callable[[memoryview, int], int]  # (buffer, offset) -> offset after the value

_FIXED_SIZES = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


def skip_entity(entity_type: type[Entity], buf: memoryview, offset: int = 0) -> int:
    """The offset just past an entity of this type encoded at `offset`."""
    return _entity_skipper(entity_type)(buf, offset)


def validate(entity_type: type[Entity], body: memoryview | bytes) -> None:
    """FrameError unless body is exactly one well-formed entity of this type.

    The safe way to check a body from the network (kio's reader is not: see `codec`).
    """
    body = memoryview(body)
    try:
        end = skip_entity(entity_type, body)
    except FrameError as exc:
        raise FrameError(f"malformed {_describe(entity_type)}: {exc}") from None
    if end != len(body):
        raise FrameError(f"{len(body) - end} bytes after the end of {_describe(entity_type)}")


def _describe(entity_type: type[Entity]) -> str:
    return f"{entity_type.__name__} v{entity_type.__version__}"


def item_type(entity_type: type[Entity], name: str) -> type[Entity]:
    """The entity type of the items of the array field `name` (a `tuple[Item, ...]`)."""
    return get_args(entity_type.__dataclass_fields__[name].type)[0]


def array_items(
    entity_type: type[Entity], buf: memoryview, name: str, offset: int = 0
) -> Iterator[int]:
    """Where each item of the array field `name` of the entity at `offset` starts, none if
    it is null: a reader takes what it needs of each item with `field_offset`."""
    item = item_type(entity_type, name)
    at = field_offset(entity_type, buf, name, offset)
    count, at = read_array_length(buf, at, entity_type.__flexible__)
    for _ in range(max(count, 0)):
        yield at
        at = skip_entity(item, buf, at)


def field_offset(entity_type: type[Entity], buf: memoryview, name: str, offset: int = 0) -> int:
    """Where the (untagged) field `name` of the entity encoded at `offset` starts."""
    for field_name, skipper in _plan(entity_type):
        if field_name == name:
            return offset
        offset = skipper(buf, offset)
    raise ValueError(f"{entity_type.__name__} has no untagged field {name!r}")


def field_span(
    entity_type: type[Entity], buf: memoryview, name: str, offset: int = 0
) -> tuple[int, int]:
    """(start, end) of the (untagged) field `name` of the entity encoded at `offset`."""
    for field_name, skipper in _plan(entity_type):
        if field_name == name:
            return offset, skipper(buf, offset)
        offset = skipper(buf, offset)
    raise ValueError(f"{entity_type.__name__} has no untagged field {name!r}")


def tagged_fields_offset(entity_type: type[Entity], buf: memoryview, offset: int = 0) -> int:
    """Where the tagged-field section of the (flexible) entity at `offset` starts."""
    if not entity_type.__flexible__:
        raise ValueError(f"{entity_type.__name__} v{entity_type.__version__} is not flexible")
    for _name, skipper in _plan(entity_type):
        offset = skipper(buf, offset)
    return offset


@cache
def _plan(entity_type: type[Entity]) -> tuple[tuple[str, Skipper], ...]:
    """(name, skipper) of each untagged field, in wire order."""
    flexible = entity_type.__flexible__
    return tuple(
        (field.name, _field_skipper(field, flexible))
        for field in dataclasses.fields(entity_type)
        if "tag" not in field.metadata  # tagged fields live in the trailing section
    )


@cache
def _entity_skipper(entity_type: type[Entity]) -> Skipper:
    skippers = _merge_fixed([skipper for _name, skipper in _plan(entity_type)])
    if entity_type.__flexible__:
        skippers.append(skip_tagged_fields)

    def skip_one(buf: memoryview, offset: int) -> int:
        for skipper in skippers:
            offset = skipper(buf, offset)
        return offset

    return skip_one


def _fixed(size: int) -> Skipper:
    """A run of fixed-size fields, skipped in one step."""

    def skip_fixed(buf: memoryview, offset: int) -> int:
        end = offset + size
        if end > len(buf):
            raise FrameError(f"truncated: {size} bytes at byte {offset} of {len(buf)}")
        return end

    skip_fixed.size = size  # type: ignore[attr-defined]  # read by _merge_fixed
    return skip_fixed


def _merge_fixed(skippers: list[Skipper]) -> list[Skipper]:
    merged: list[Skipper] = []
    for skipper in skippers:
        size = getattr(skipper, "size", None)
        previous = getattr(merged[-1], "size", None) if merged else None
        if size is not None and previous is not None:
            merged[-1] = _fixed(previous + size)
        else:
            merged.append(skipper)
    return merged


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) is types.UnionType:
        args = [arg for arg in get_args(annotation) if arg is not types.NoneType]
        if len(args) != 1:
            raise TypeError(f"unsupported union {annotation}")
        return args[0], True
    return annotation, False


def _field_skipper(field: dataclasses.Field, flexible: bool) -> Skipper:
    annotation, nullable = _unwrap_optional(field.type)
    if get_origin(annotation) is tuple:
        item_type = get_args(annotation)[0]
        if dataclasses.is_dataclass(item_type):
            return _array_skipper(_entity_skipper(item_type), None, flexible)
        kafka_type = field.metadata["kafka_type"]
        return _array_skipper(
            _primitive_skipper(kafka_type, flexible), _FIXED_SIZES.get(kafka_type), flexible
        )
    if dataclasses.is_dataclass(annotation):
        skip_struct = _entity_skipper(annotation)
        return _nullable_struct_skipper(skip_struct) if nullable else skip_struct
    return _primitive_skipper(field.metadata["kafka_type"], flexible)


def _primitive_skipper(kafka_type: str, flexible: bool) -> Skipper:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return _fixed(size)
    if kafka_type not in ("string", "bytes", "records"):
        raise TypeError(f"no skipper for kafka type {kafka_type!r}")
    if flexible:
        return _skip_compact_bytes
    return _skip_legacy_string if kafka_type == "string" else _skip_legacy_bytes


def _skip_compact_bytes(buf: memoryview, offset: int) -> int:
    length, offset = read_uvarint(buf, offset)  # length + 1; 0 is null
    return skip(buf, offset, length - 1) if length > 1 else offset


def _skip_legacy_string(buf: memoryview, offset: int) -> int:
    length, offset = read_int16(buf, offset)  # -1 is null
    return skip(buf, offset, length) if length > 0 else offset


def _skip_legacy_bytes(buf: memoryview, offset: int) -> int:
    length, offset = read_int32(buf, offset)  # -1 is null
    return skip(buf, offset, length) if length > 0 else offset


def _array_skipper(item: Skipper, item_size: int | None, flexible: bool) -> Skipper:
    def skip_array(buf: memoryview, offset: int) -> int:
        if flexible:
            count, offset = read_uvarint(buf, offset)
            count -= 1  # 0 on the wire is null
        else:
            count, offset = read_int32(buf, offset)  # -1 is null
        if count <= 0:
            return offset
        if item_size is not None:
            return skip(buf, offset, count * item_size)
        # Every item takes at least one byte: a larger count is a lie, and would loop long.
        if count > len(buf) - offset:
            raise FrameError(f"array of {count} items at byte {offset} of {len(buf)}")
        for _ in range(count):
            offset = item(buf, offset)
        return offset

    return skip_array


def _nullable_struct_skipper(skip_struct: Skipper) -> Skipper:
    def skip_nullable(buf: memoryview, offset: int) -> int:
        marker_end = skip(buf, offset, 1)
        if INT8.unpack_from(buf, offset)[0] < 0:  # KIP-893: -1 is null
            return marker_end
        return skip_struct(buf, marker_end)

    return skip_nullable
