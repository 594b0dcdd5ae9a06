"""The records of the fleet's metadata topic (docs/metadata.md, "Records").

Each record is a Kafka record of a compacted topic: some of its fields form the key, which
decides what compaction keeps, the others the value. `LAYOUTS` says which, in wire order;
metacodec.py turns records into bytes and back. A record's constructor refuses a field out
of its domain (ValueError), so any record that exists can be encoded. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from uuid import UUID

from proxy.errors import TierproxyError
from proxy.objects.keys import U64_MAX, ObjectKind, object_key

U32_MAX = (1 << 32) - 1
I32_MAX = (1 << 31) - 1
I64_MAX = (1 << 63) - 1
MAX_NAME_BYTES = 255  # topic and owner names: a u8 length; Kafka's topic names are <= 249


class MetadataError(TierproxyError):
    """Base of the metadata subsystem's failures: a record it cannot read, a fenced shard
    owner, a metadata topic it cannot use."""


class MetadataRecordError(MetadataError, ValueError):
    """Bytes that are not a metadata record this version reads."""

    def __init__(self, what: str) -> None:
        super().__init__(f"metadata record: {what}")
        self.what = what


class RecordType(IntEnum):
    """The record type, key byte 1."""

    TOPIC_MODE = 1
    SHARD_CLAIM = 2
    STREAM_CUTOVER = 3
    STREAM_UNTIER = 4
    STREAM_TRIM = 5
    OBJECT_COMMIT = 6
    OBJECT_DELETE = 7
    PRODUCER_SNAPSHOT = 8
    CHECKPOINT_END = 9
    SHARD_RELEASE = 10


class TopicMode(IntEnum):
    """What an operator asked for a topic. Which partitions are tiered is per stream."""

    PASSTHROUGH = 0
    TIERED = 1
    # The topic id is gone from Kafka (the topic deleted, perhaps created again under its
    # name with another id): its streams are untiered whatever they hold, and its name
    # is nobody's here any more (docs/tiering.md, "Deleting a tiered topic").
    DELETED = 2


def _check(record: object, name: str, low: int, high: int) -> None:
    value = getattr(record, name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{type(record).__name__}.{name} = {value!r}: needs an integer in [{low}, {high}]"
        )


def _validate(record: object) -> None:
    """Every field in the domain its wire type gives it (LAYOUTS, and the OPTIONAL_FIELDS
    that are not None): integers in range (all offsets and times are >= 0), enums known,
    names of 1-255 UTF-8 bytes, topic ids non-zero; tuples and bytes made immutable."""
    record_type = RECORD_TYPES[type(record)]
    _, key_fields, value_fields = LAYOUTS[record_type]
    for name, wire in key_fields + value_fields:
        _validate_field(record, name, wire)
    for _, name, wire in OPTIONAL_FIELDS.get(record_type, ()):
        if getattr(record, name) is not None:
            _validate_field(record, name, wire)


def _validate_field(record: object, name: str, wire: str) -> None:
    value = getattr(record, name)
    if wire in _DOMAINS:
        _check(record, name, *_DOMAINS[wire])
    elif wire in ENUMS:
        object.__setattr__(record, name, ENUMS[wire](value))
    elif wire == "str":
        if not isinstance(value, str) or not 1 <= len(value.encode()) <= MAX_NAME_BYTES:
            raise ValueError(
                f"{type(record).__name__}.{name} = {value!r}: "
                f"needs 1 to {MAX_NAME_BYTES} UTF-8 bytes"
            )
    elif wire == "uuid":
        if not isinstance(value, UUID) or value.int == 0:
            raise ValueError(f"{type(record).__name__}.{name} = {value!r}: not a topic id")
    elif wire == "blob":
        object.__setattr__(record, name, bytes(value))
        if len(getattr(record, name)) > U32_MAX:
            raise ValueError(f"{type(record).__name__}.{name}: more than 2**32-1 bytes")
    else:  # ids, ranges
        object.__setattr__(record, name, tuple(value))


class _Validated:
    """A record whose fields `_validate` checks as it is made, and nothing more."""

    __slots__ = ()

    def __post_init__(self) -> None:
        _validate(self)


def _validate_stream(record: object) -> None:
    """A stream's record: its fields, and its incarnation (1 at the first cutover)."""
    _validate(record)
    _check(record, "incarnation", 1, U32_MAX)


class _StreamRecord:
    """A stream's record that `_validate_stream` checks, and nothing more."""

    __slots__ = ()

    def __post_init__(self) -> None:
        _validate_stream(self)


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets [start_offset, end_offset) of a stream, held by the object a commit names."""

    stream_id: int
    start_offset: int
    end_offset: int

    def __post_init__(self) -> None:
        _check(self, "stream_id", 0, U64_MAX)
        _check(self, "start_offset", 0, I64_MAX - 1)
        _check(self, "end_offset", self.start_offset + 1, I64_MAX)


@dataclass(frozen=True, slots=True)
class TopicModeSet(_Validated):
    """An operator's request for a topic (not generation-scoped: the latest one counts).

    `kafka_cluster`: the id of the Kafka cluster the topic id is of (a topic id is a
    random UUID of one cluster), as Kafka answered it when the topic was tiered; a
    topic's deletion is judged only from that cluster's answers (docs/tiering.md,
    "Deleting a tiered topic"). None in a record written before the field existed (value
    version 1); value version 2 adds it (`OPTIONAL_FIELDS`)."""

    topic_id: UUID
    topic: str
    mode: TopicMode
    since_ms: int
    kafka_cluster: str | None = None


@dataclass(frozen=True, slots=True)
class ShardClaim(_Validated):
    """A new owner takes the shard at a new epoch; records of older epochs are refused."""

    generation: int
    epoch: int
    owner: str
    claimed_at_ms: int


@dataclass(frozen=True, slots=True)
class ShardRelease(_Validated):
    """The owner of `epoch` gives the shard up cleanly: everything it acknowledged for the
    shard's streams is in committed objects, so the next owner need not wait for it."""

    generation: int
    epoch: int
    owner: str
    released_at_ms: int


@dataclass(frozen=True, slots=True)
class StreamCutover:
    """A partition becomes a stream: offsets from `cutover_offset` on are the proxy's.

    Written at a cutover with end_offset == cutover_offset; a checkpoint writes the
    stream's current log start and end instead.

    `last_stable_offset`: Kafka's last stable offset at the cutover, when a transaction
    was open there (the first offset of the oldest one, below the cutover): the
    partition's owner seeds its producer state from Kafka's log from there to the
    cutover (docs/tiering.md, "Cutover"). None when none was open (it is then the
    cutover offset, and stored so: value version 1), as in every record written before
    the field existed. Value version 2 adds it (`OPTIONAL_FIELDS`)."""

    generation: int
    stream_id: int
    incarnation: int  # 1 for the stream's first cutover, +1 after each untier
    epoch: int
    topic_id: UUID
    partition: int
    log_start_offset: int  # the upstream log start at the cutover
    cutover_offset: int  # the upstream log end at the cutover
    end_offset: int
    at_ms: int
    last_stable_offset: int | None = None

    def __post_init__(self) -> None:
        _validate_stream(self)
        _check(self, "log_start_offset", 0, self.end_offset)
        _check(self, "cutover_offset", 0, self.end_offset)
        if self.last_stable_offset is not None:  # in its domain (_validate); below the cutover
            _check(self, "last_stable_offset", 0, self.cutover_offset)
            if self.last_stable_offset == self.cutover_offset:  # nothing open: stored as v1
                object.__setattr__(self, "last_stable_offset", None)

    @property
    def stable_offset(self) -> int:
        """Kafka's last stable offset at the cutover (the cutover offset when none was
        recorded: no transaction open, or a record of version 1)."""
        lso = self.last_stable_offset
        return self.cutover_offset if lso is None else lso


@dataclass(frozen=True, slots=True)
class StreamUntier(_StreamRecord):
    """The stream's partition goes back to passthrough (only if Kafka holds all its data),
    or its topic was deleted in Kafka: `topic_deleted_ms` (value version 2, when the
    topic's mode became DELETED) lets it go whatever it holds, as Kafka drops a deleted
    topic's log whole. None: an untier, as in every record written before the field."""

    generation: int
    stream_id: int
    incarnation: int
    epoch: int
    at_ms: int
    topic_deleted_ms: int | None = None


@dataclass(frozen=True, slots=True)
class StreamTrim(_StreamRecord):
    """The stream's log start offset moves up (retention, DeleteRecords)."""

    generation: int
    stream_id: int
    incarnation: int
    log_start_offset: int
    epoch: int
    at_ms: int


@dataclass(frozen=True, slots=True)
class ObjectCommit:
    """An object becomes visible: its ranges of this shard's streams, one per stream.

    `replaces` names objects whose ranges this one takes over (compaction). A checkpoint
    writes an object's live ranges only, none for an object no range refers to."""

    generation: int
    object_id: int
    kind: ObjectKind
    size: int
    epoch: int
    committed_at_ms: int
    ranges: tuple[OffsetRange, ...]
    replaces: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)
        _check(self, "size", 1, I64_MAX)
        streams = [r.stream_id if isinstance(r, OffsetRange) else -1 for r in self.ranges]
        if -1 in streams or streams != sorted(set(streams)):
            raise ValueError(
                f"object {self.object_id}: ranges must be OffsetRanges sorted by stream id, "
                "one per stream (a stream's blocks in an object are consecutive)"
            )
        if self.kind is ObjectKind.STREAM and len(self.ranges) > 1:
            raise ValueError(f"object {self.object_id}: a stream object holds one stream")
        ids = list(self.replaces)
        if (
            any(isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= U64_MAX for n in ids)
            or ids != sorted(set(ids))
            or self.object_id in ids
        ):
            raise ValueError(
                f"object {self.object_id}: replaces {ids} must be other object ids, "
                "ascending, each once"
            )

    @property
    def key(self) -> str:
        """The object's key in the store."""
        return object_key(self.object_id, self.kind)


@dataclass(frozen=True, slots=True)
class ObjectDelete(_Validated):
    """An object no range refers to any more is gone from the store."""

    generation: int
    object_id: int
    epoch: int
    deleted_at_ms: int


@dataclass(frozen=True, slots=True)
class ProducerSnapshot(_Validated):
    """Idempotent-producer state of a stream, valid at `offset` (opaque to the metadata)."""

    generation: int
    stream_id: int
    epoch: int
    offset: int
    taken_at_ms: int
    state: bytes


@dataclass(frozen=True, slots=True)
class CheckpointEnd:
    """Closes a checkpoint: the records of `generation` before it are the shard's state,
    rewritten. Readers switch generation here."""

    generation: int
    epoch: int
    at_ms: int

    def __post_init__(self) -> None:
        _validate(self)
        _check(self, "generation", 1, U32_MAX)


Record = (
    TopicModeSet
    | ShardClaim
    | StreamCutover
    | StreamUntier
    | StreamTrim
    | ObjectCommit
    | ObjectDelete
    | ProducerSnapshot
    | CheckpointEnd
    | ShardRelease
)


@dataclass(frozen=True, slots=True)
class RecordKey:
    """What a key says on its own: the record type, the generation (None for a topic key)
    and the topic id (None for any other key)."""

    record_type: RecordType
    generation: int | None
    topic_id: UUID | None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A key with a null value: compaction deletes the key's records."""

    key: RecordKey


_GEN = ("generation", "u32")
_STREAM = ("stream_id", "u64")
_EPOCH = ("epoch", "u32")
# The layout of every record, in wire order: record type -> (class, key fields, value
# fields), each field (attribute, wire type). Wire types: u8 u32 u64 i32 i64 (big-endian;
# i32 and i64 hold values >= 0 here), uuid (16 bytes), str (u8 length + UTF-8), blob (u32
# length + bytes), mode and kind (u8: TopicMode, ObjectKind), ids (u32 count + u64 each),
# ranges (u32 count + (u64 stream id, i64 start, i64 end) each).
LAYOUTS: dict[RecordType, tuple[type, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]]
LAYOUTS = {
    RecordType.TOPIC_MODE: (
        TopicModeSet,
        (("topic_id", "uuid"),),
        (("mode", "mode"), ("since_ms", "i64"), ("topic", "str")),
    ),
    RecordType.SHARD_CLAIM: (
        ShardClaim,
        (_GEN, ("epoch", "u32"), ("owner", "str")),
        (("claimed_at_ms", "i64"),),
    ),
    RecordType.STREAM_CUTOVER: (
        StreamCutover,
        (_GEN, _STREAM, ("incarnation", "u32")),
        (
            _EPOCH,
            ("topic_id", "uuid"),
            ("partition", "i32"),
            ("log_start_offset", "i64"),
            ("cutover_offset", "i64"),
            ("end_offset", "i64"),
            ("at_ms", "i64"),
        ),
    ),
    RecordType.STREAM_UNTIER: (
        StreamUntier,
        (_GEN, _STREAM, ("incarnation", "u32")),
        (_EPOCH, ("at_ms", "i64")),
    ),
    RecordType.STREAM_TRIM: (
        StreamTrim,
        (_GEN, _STREAM, ("incarnation", "u32"), ("log_start_offset", "i64")),
        (_EPOCH, ("at_ms", "i64")),
    ),
    RecordType.OBJECT_COMMIT: (
        ObjectCommit,
        (_GEN, ("object_id", "u64")),
        (
            _EPOCH,
            ("kind", "kind"),
            ("size", "i64"),
            ("committed_at_ms", "i64"),
            ("replaces", "ids"),
            ("ranges", "ranges"),
        ),
    ),
    RecordType.OBJECT_DELETE: (
        ObjectDelete,
        (_GEN, ("object_id", "u64")),
        (_EPOCH, ("deleted_at_ms", "i64")),
    ),
    RecordType.PRODUCER_SNAPSHOT: (
        ProducerSnapshot,
        (_GEN, _STREAM),
        (_EPOCH, ("offset", "i64"), ("taken_at_ms", "i64"), ("state", "blob")),
    ),
    RecordType.CHECKPOINT_END: (
        CheckpointEnd,
        (_GEN,),
        (_EPOCH, ("at_ms", "i64")),
    ),
    RecordType.SHARD_RELEASE: (
        ShardRelease,
        (_GEN, ("epoch", "u32"), ("owner", "str")),
        (("released_at_ms", "i64"),),
    ),
}
# Fields added to a record type's value after version 1, each with the value version that
# added it: written (and that version with them) only when not None, read from records of
# that version or later; a record of an earlier version reads them as None. So a record
# without them stays readable by a reader that does not know them (docs/metadata.md,
# "Versions and errors").
OPTIONAL_FIELDS: dict[RecordType, tuple[tuple[int, str, str], ...]] = {
    RecordType.TOPIC_MODE: ((2, "kafka_cluster", "str"),),
    RecordType.STREAM_CUTOVER: ((2, "last_stable_offset", "i64"),),
    RecordType.STREAM_UNTIER: ((2, "topic_deleted_ms", "i64"),),
}
RECORD_TYPES = {cls: record_type for record_type, (cls, _, _) in LAYOUTS.items()}
_DOMAINS = {"u32": (0, U32_MAX), "u64": (0, U64_MAX), "i32": (0, I32_MAX), "i64": (0, I64_MAX)}
ENUMS: dict[str, type[IntEnum]] = {"mode": TopicMode, "kind": ObjectKind}
