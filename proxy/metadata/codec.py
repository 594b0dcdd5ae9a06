"""The bytes of metadata records (docs/metadata.md, "Records"): `encode` and `decode`.

A key is ``[u8 key version = 1][u8 record type]`` then the type's key fields, a value
``[u8 value version]`` then its value fields, both laid out as `LAYOUTS`
(metarecords.py) says. The value version is 1, or the version that added the newest of
the type's `OPTIONAL_FIELDS` the record holds (they follow the others, in order). A null
value is a tombstone. Pure: no I/O, no asyncio. `decode` raises nothing but
`MetadataRecordError`, whatever the bytes.
"""

from __future__ import annotations

import struct
from typing import Any
from uuid import UUID

from proxy.metadata.records import (
    ENUMS,
    LAYOUTS,
    OPTIONAL_FIELDS,
    RECORD_TYPES,
    MetadataRecordError,
    OffsetRange,
    Record,
    RecordKey,
    RecordType,
    Tombstone,
)

KEY_VERSION = 1
VALUE_VERSION = 1
Buffer = bytes | bytearray | memoryview

_INTS = {
    wire: struct.Struct(code)
    for wire, code in (("u8", ">B"), ("u32", ">I"), ("u64", ">Q"), ("i32", ">i"), ("i64", ">q"))
}
_HEAD = struct.Struct(">BB")  # key version, record type
_RANGE = struct.Struct(">Qqq")  # stream id, start offset, end offset
_ID = _INTS["u64"]
_COUNT = _INTS["u32"]


def _put(out: bytearray, wire: str, value: Any) -> None:
    if wire in _INTS or wire in ENUMS:
        out += _INTS.get(wire, _INTS["u8"]).pack(value)
    elif wire == "uuid":
        out += value.bytes
    elif wire == "str":
        encoded = value.encode()
        out += bytes((len(encoded),)) + encoded
    elif wire == "blob":
        out += _COUNT.pack(len(value)) + value
    elif wire == "ids":
        out += _COUNT.pack(len(value))
        for number in value:
            out += _ID.pack(number)
    else:  # ranges
        out += _COUNT.pack(len(value))
        for r in value:
            out += _RANGE.pack(r.stream_id, r.start_offset, r.end_offset)


def encode(record: Record) -> tuple[bytes, bytes]:
    """The record's (key, value) bytes."""
    record_type = RECORD_TYPES[type(record)]
    _, key_fields, value_fields = LAYOUTS[record_type]
    key = bytearray(_HEAD.pack(KEY_VERSION, record_type))
    for name, wire in key_fields:
        _put(key, wire, getattr(record, name))
    optional = OPTIONAL_FIELDS.get(record_type, ())
    version = max(
        (v for v, name, _ in optional if getattr(record, name) is not None), default=VALUE_VERSION
    )
    value = bytearray((version,))
    for name, wire in value_fields:
        _put(value, wire, getattr(record, name))
    for added, name, wire in optional:
        if added <= version:
            _put(value, wire, getattr(record, name))
    return bytes(key), bytes(value)


def record_key(record: Record) -> bytes:
    """The key the record is written under."""
    return encode(record)[0]


def topic_mode_key(topic_id: UUID) -> bytes:
    """The key of a topic's mode record; a tombstone there forgets the topic."""
    return _HEAD.pack(KEY_VERSION, RecordType.TOPIC_MODE) + topic_id.bytes


class _Reader:
    def __init__(self, data: bytes, part: str) -> None:
        self.data = data
        self.pos = 0
        self.part = part

    def take(self, size: int) -> bytes:
        if size > len(self.data) - self.pos:
            raise MetadataRecordError(
                f"{self.part} of {len(self.data)} bytes ends inside a field at byte {self.pos}"
            )
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return chunk

    def read(self, wire: str) -> Any:
        if wire in ENUMS:
            wire = "u8"  # the record's constructor turns it into the enum, or refuses it
        if wire in _INTS:
            return _INTS[wire].unpack(self.take(_INTS[wire].size))[0]
        if wire == "uuid":
            return UUID(bytes=self.take(16))
        if wire == "str":
            raw = self.take(self.take(1)[0])
            try:
                return raw.decode()
            except UnicodeDecodeError:
                raise MetadataRecordError(f"{self.part}: a name that is not UTF-8") from None
        if wire == "blob":
            return self.take(self.read("u32"))
        count = self.read("u32")
        if wire == "ids":
            return tuple(_ID.unpack(self.take(8))[0] for _ in range(self._fits(count, 8)))
        items = (_RANGE.unpack(self.take(_RANGE.size)) for _ in range(self._fits(count, 24)))
        return tuple(self._range(*item) for item in items)

    def _fits(self, count: int, size: int) -> int:
        # checked before anything is built, so a corrupt count cannot ask for memory
        if count * size > len(self.data) - self.pos:
            raise MetadataRecordError(f"{self.part}: a count of {count} overruns the record")
        return count

    def _range(self, stream_id: int, start: int, end: int) -> OffsetRange:
        try:
            return OffsetRange(stream_id, start, end)
        except ValueError as error:
            raise MetadataRecordError(f"{self.part}: {error}") from None

    def finish(self) -> None:
        if self.pos != len(self.data):
            raise MetadataRecordError(
                f"{self.part} has {len(self.data) - self.pos} bytes after its last field"
            )


def _read_key(key: bytes) -> tuple[RecordType, dict[str, Any]]:
    reader = _Reader(key, "key")
    version, type_code = _HEAD.unpack(reader.take(_HEAD.size))
    if version != KEY_VERSION:
        raise MetadataRecordError(f"unsupported key version {version}; this reader reads 1")
    if type_code not in LAYOUTS:
        raise MetadataRecordError(f"unknown record type {type_code}")
    record_type = RecordType(type_code)
    found = {name: reader.read(wire) for name, wire in LAYOUTS[record_type][1]}
    reader.finish()
    return record_type, found


def decode_key(key: Buffer) -> RecordKey:
    """The record type, generation and topic id a key names; MetadataRecordError if it is
    not a key."""
    record_type, found = _read_key(bytes(key))
    return RecordKey(record_type, found.get("generation"), found.get("topic_id"))


def decode(key: Buffer, value: Buffer | None) -> Record | Tombstone:
    """The record (or tombstone) a key and value hold; MetadataRecordError for anything
    that is not one."""
    record_type, found = _read_key(bytes(key))
    if value is None:
        return Tombstone(RecordKey(record_type, found.get("generation"), found.get("topic_id")))
    cls, _, value_fields = LAYOUTS[record_type]
    reader = _Reader(bytes(value), f"{record_type.name} value")
    version = reader.read("u8")
    optional = OPTIONAL_FIELDS.get(record_type, ())
    newest = max((v for v, _, _ in optional), default=VALUE_VERSION)
    if not VALUE_VERSION <= version <= newest:
        raise MetadataRecordError(
            f"unsupported value version {version} for {record_type.name}; this reader reads "
            f"{VALUE_VERSION} to {newest}"
        )
    for name, wire in value_fields:
        found[name] = reader.read(wire)
    for added, name, wire in optional:
        if added <= version:
            found[name] = reader.read(wire)
    reader.finish()
    try:
        return cls(**found)
    except ValueError as error:
        raise MetadataRecordError(f"{record_type.name}: {error}") from None
