"""S3-WAL objects: keys, layout and checks (docs/wal.md, "S3-WAL mode"). Pure: no I/O.

An S3-WAL object holds record batches that a proxy which is not a partition's owner made
durable in S3 before the owner sequenced them. They have no offsets yet, so the stream
object format (objects/format.py, whose index is by offset and whose keys carry no writer)
does not fit; this is a small format of the same shape::

    [block 0] ... [block n-1] [index: n entries of 32 bytes] [footer: 52 bytes]

A block is one stream's appended batches, verbatim, in append order; the blocks are
sorted by stream id. The footer ends like an object-format footer (version, footer size,
footer CRC, tail magic) but with its own magics, so neither reader mistakes one for the
other. Readers normally fetch one append's exact byte range (`check_range`); the index
and footer are for tools and garbage collection (`parse_wal_object`).
"""

from __future__ import annotations

import re
import secrets
import struct
from dataclasses import dataclass

import crc32c

from proxy.records.batches import CorruptBatchError, iter_batches, validate_batch

FORMAT_VERSION = 1
HEAD_MAGIC = b"TPWF"
TAIL_MAGIC = b"TPWE"
KEY_ROOT = "wal"
# head magic, sequence, writer hash, created at (ms), index position, block count,
# index CRC, version, footer size, footer CRC, tail magic
_FOOTER = struct.Struct(">4sQIQQIIHHI4s")
FOOTER_SIZE = _FOOTER.size  # 52
_FOOTER_CRC_COVERS = FOOTER_SIZE - 8
# stream id, position, size, batch count, record count, block CRC
_ENTRY = struct.Struct(">QQIIII")
INDEX_ENTRY_SIZE = _ENTRY.size  # 32
U32_MAX = (1 << 32) - 1
STREAM_ID_MAX = (1 << 63) - 1  # what the local WAL's i64 stream ids can hold too
_WRITER = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_WRITER_RE = re.compile(_WRITER)
_KEY_RE = re.compile(rf"{KEY_ROOT}/([0-9a-f]{{4}})/({_WRITER})/([0-9a-f]{{16}})")

Buffer = bytes | bytearray | memoryview


class S3WalCorruptError(ValueError):
    """Bytes read from an S3-WAL object that cannot be trusted; names the object and range."""

    def __init__(self, key: str, what: str, start: int | None = None, end: int | None = None):
        where = f" bytes [{start}, {end})" if start is not None else ""
        super().__init__(f"S3-WAL object {key}{where}: {what}")
        self.key = key
        self.start = start
        self.end = end
        self.what = what


@dataclass(frozen=True, slots=True)
class S3WalLocation:
    """Where one append's batches are: bytes [start, end) of `object_key`, for `stream_id`;
    `crc` is the CRC-32C of exactly those bytes (the batches' own CRCs skip their first
    21 bytes). What the notification to the owner carries."""

    object_key: str
    start: int
    end: int
    stream_id: int
    crc: int

    @property
    def size(self) -> int:
        return self.end - self.start


_LOCATION = struct.Struct(">QQQIH")  # stream id, start, end, crc, key length; then the key


def encode_location(location: S3WalLocation) -> bytes:
    """The bytes an owner's WAL reference entry keeps of where a batch is (docs/wal.md,
    "The owner answering from the notification"): read back by `decode_location`."""
    key = location.object_key.encode()
    if len(key) > 0xFFFF:
        raise ValueError(f"S3-WAL object key of {len(key)} bytes")
    head = _LOCATION.pack(location.stream_id, location.start, location.end, location.crc, len(key))
    return head + key


def decode_location(data: Buffer) -> S3WalLocation:
    """`encode_location`'s bytes back; S3WalCorruptError when they cannot be."""
    view = memoryview(data).cast("B")
    if len(view) < _LOCATION.size:
        raise S3WalCorruptError("?", f"a location of {len(view)} bytes")
    stream, start, end, crc, size = _LOCATION.unpack_from(view, 0)
    if len(view) != _LOCATION.size + size or end < start:
        raise S3WalCorruptError("?", f"a location of {len(view)} bytes, [{start}, {end})")
    key = bytes(view[_LOCATION.size :]).decode(errors="replace")
    return S3WalLocation(key, start, end, stream, crc)


@dataclass(frozen=True, slots=True)
class WalBlock:
    """One stream's batches in an object: bytes [position, position + size)."""

    stream_id: int
    position: int
    size: int
    batch_count: int
    record_count: int
    crc: int


@dataclass(frozen=True, slots=True)
class WalFooter:
    sequence: int
    writer_hash: int
    created_ms: int
    index_position: int
    block_count: int
    index_crc: int


@dataclass(frozen=True, slots=True)
class BuiltWalObject:
    """An object ready to PUT: `pieces` in order are its `size` bytes; `locations[i]` is
    where the i-th append went."""

    key: str
    pieces: tuple[memoryview, ...]
    size: int
    data_size: int
    blocks: tuple[WalBlock, ...]
    locations: tuple[S3WalLocation, ...]


# -- keys ----------------------------------------------------------------------------------


def check_writer_id(writer_id: str) -> str:
    if not isinstance(writer_id, str) or not _WRITER_RE.fullmatch(writer_id):
        raise ValueError(
            f"S3-WAL writer id {writer_id!r}: 1-128 of [A-Za-z0-9._-], starting with a "
            "letter or digit"
        )
    return writer_id


def writer_id_for(proxy_name: str, started_at: float) -> str:
    """A writer id no other process uses: the proxy's name, its start time in ms and 32
    random bits (two processes given one name, started in the same millisecond)."""
    return check_writer_id(f"{writer_prefix(proxy_name, started_at)}{secrets.token_hex(4)}")


def writer_prefix(proxy_name: str, started_at: float) -> str:
    """How the writer ids of the proxy `proxy_name` started at `started_at` (its fleet
    heartbeat says both) begin: the orphan sweep leaves a live writer's objects to it."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", proxy_name).lstrip("._-")[:96] or "proxy"
    return f"{name}-{int(started_at * 1000)}-"


def writer_hash(writer_id: str) -> int:
    return crc32c.crc32c(writer_id.encode("ascii"))


def wal_object_key(writer_id: str, sequence: int) -> str:
    """``wal/<spread>/<writer id>/<sequence, 16 hex>``. All under `wal/`, so one lifecycle
    rule covers them and they never meet stream objects; `<spread>` is the reversed low
    hex digits of (sequence + writer hash), so consecutive objects of one writer, and
    the same sequence of different writers, land on different prefixes."""
    check_writer_id(writer_id)
    if not 0 <= sequence < 1 << 64:
        raise ValueError(f"S3-WAL object sequence {sequence} is not an unsigned 64-bit integer")
    spread = f"{(sequence + writer_hash(writer_id)) & 0xFFFF:04x}"[::-1]
    return f"{KEY_ROOT}/{spread}/{writer_id}/{sequence:016x}"


def parse_wal_object_key(key: str) -> tuple[str, int]:
    """The (writer id, sequence) a `wal_object_key` names; ValueError for anything else."""
    match = _KEY_RE.fullmatch(key)
    if match is None:
        raise ValueError(f"{key!r} is not an S3-WAL object key (wal/<4 hex>/<writer>/<16 hex>)")
    writer_id, sequence = match.group(2), int(match.group(3), 16)
    if wal_object_key(writer_id, sequence) != key:
        raise ValueError(f"{key!r}: prefix does not match the writer and sequence")
    return writer_id, sequence


# -- writing -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendSummary:
    size: int
    batch_count: int
    record_count: int
    crc: int


def summarize_append(records: Buffer, *, validate: bool = True) -> AppendSummary:
    """Count a run of batches (each CRC-checked when `validate`); CorruptBatchError for a
    damaged or cut batch, ValueError for no batch at all."""
    view = memoryview(records).cast("B")
    batches = count = 0
    position = 0
    for header, batch in iter_batches(view):
        if validate:
            validate_batch(batch, position)
        batches += 1
        count += header.record_count
        position += len(batch)
    if batches == 0:
        raise ValueError("an S3-WAL append holds at least one record batch")
    return AppendSummary(len(view), batches, count, crc32c.crc32c(view))


class WalObjectBuilder:
    """Collects appends for one object; `build()` lays it out. The buffers given are not
    copied and must not change until the built pieces are written."""

    def __init__(self, writer_id: str, sequence: int) -> None:
        self.key = wal_object_key(writer_id, sequence)
        self.writer_hash = writer_hash(writer_id)
        self.sequence = sequence
        self.data_size = 0
        self.appends = 0
        self.batches = 0
        # per stream: (append number, bytes, summary), in append order
        self._streams: dict[int, list[tuple[int, memoryview, AppendSummary]]] = {}

    def add(self, stream_id: int, records: Buffer, summary: AppendSummary) -> int:
        """Add one append; returns its number (the index into `build().locations`)."""
        if not 0 <= stream_id <= STREAM_ID_MAX:
            raise ValueError(f"stream id {stream_id} is not in 0..2**63-1")
        view = memoryview(records).cast("B")
        number = self.appends
        self._streams.setdefault(stream_id, []).append((number, view, summary))
        self.appends += 1
        self.batches += summary.batch_count
        self.data_size += len(view)
        return number

    def build(self, created_ms: int) -> BuiltWalObject:
        if not self._streams:
            raise ValueError(f"{self.key}: an object holds at least one append")
        pieces: list[memoryview] = []
        locations: list[S3WalLocation | None] = [None] * self.appends
        blocks = []
        index = bytearray()
        position = 0
        for stream_id in sorted(self._streams):
            start, block_crc, batches, records = position, 0, 0, 0
            for number, view, summary in self._streams[stream_id]:
                end = position + len(view)
                locations[number] = S3WalLocation(self.key, position, end, stream_id, summary.crc)
                block_crc = crc32c.crc32c(view, block_crc)
                batches += summary.batch_count
                records += summary.record_count
                pieces.append(view)
                position = end
            if position - start > U32_MAX or records > U32_MAX:
                raise ValueError(f"{self.key}: stream {stream_id} has too much for one block")
            block = WalBlock(stream_id, start, position - start, batches, records, block_crc)
            index += _ENTRY.pack(*_fields(block))
            blocks.append(block)
        footer = WalFooter(
            self.sequence,
            self.writer_hash,
            created_ms,
            position,
            len(blocks),
            crc32c.crc32c(index),
        )
        pieces.append(memoryview(bytes(index)))
        pieces.append(memoryview(_pack_footer(footer)))
        size = position + len(index) + FOOTER_SIZE
        located = tuple(loc for loc in locations if loc is not None)
        return BuiltWalObject(self.key, tuple(pieces), size, position, tuple(blocks), located)


def _fields(block: WalBlock) -> tuple[int, ...]:
    b = block
    return (b.stream_id, b.position, b.size, b.batch_count, b.record_count, b.crc)


def _pack_footer(f: WalFooter) -> bytes:
    packed = _FOOTER.pack(
        HEAD_MAGIC,
        f.sequence,
        f.writer_hash,
        f.created_ms,
        f.index_position,
        f.block_count,
        f.index_crc,
        FORMAT_VERSION,
        FOOTER_SIZE,
        0,
        TAIL_MAGIC,
    )
    covered = packed[:_FOOTER_CRC_COVERS]
    return covered + crc32c.crc32c(covered).to_bytes(4, "big") + TAIL_MAGIC


# -- reading -------------------------------------------------------------------------------


def check_range(data: Buffer, location: S3WalLocation) -> memoryview:
    """The bytes of one append, as a ranged GET of `location` returned them, checked: the
    length, the location's CRC, then each batch (magic, length, codec, Kafka CRC)."""
    view = memoryview(data).cast("B")
    key, start, end = location.object_key, location.start, location.end

    def corrupt(what: str) -> S3WalCorruptError:
        return S3WalCorruptError(key, f"stream {location.stream_id}: {what}", start, end)

    if location.size <= 0 or location.start < 0:
        raise corrupt("not a range an append can have")
    if len(view) != location.size:
        raise corrupt(f"read {len(view)} bytes, expected {location.size}: object truncated")
    computed = crc32c.crc32c(view)
    if computed != location.crc:
        raise corrupt(f"CRC-32C mismatch: expected {location.crc:#010x}, read {computed:#010x}")
    try:
        position = 0
        for _header, batch in iter_batches(view):
            validate_batch(batch, start + position)
            position += len(batch)
    except CorruptBatchError as exc:
        raise corrupt(f"record batch at object byte {exc.position}: {exc.what}") from exc
    return view


def parse_wal_object(data: Buffer, key: str) -> tuple[WalFooter, tuple[WalBlock, ...]]:
    """Footer and blocks of a whole object held in memory, every CRC checked (tools, GC,
    tests). S3WalCorruptError for anything wrong."""
    view = memoryview(data).cast("B")
    writer_id, sequence = parse_wal_object_key(key)
    if len(view) < FOOTER_SIZE:
        raise S3WalCorruptError(key, f"{len(view)} bytes, shorter than a footer: truncated")
    tail = view[len(view) - FOOTER_SIZE :]
    fields = _FOOTER.unpack(tail)
    head, seq, whash, created, index_position, count, index_crc, version, fsize, fcrc, magic = (
        fields
    )
    if magic != TAIL_MAGIC:
        raise S3WalCorruptError(key, f"bad tail magic {magic!r}: truncated or not an S3-WAL object")
    if fsize == FOOTER_SIZE and crc32c.crc32c(tail[:_FOOTER_CRC_COVERS]) != fcrc:
        raise S3WalCorruptError(key, "footer CRC mismatch")
    if version != FORMAT_VERSION or fsize != FOOTER_SIZE or head != HEAD_MAGIC:
        raise S3WalCorruptError(key, f"unsupported version {version} or footer size {fsize}")
    if (seq, whash) != (sequence, writer_hash(writer_id)):
        raise S3WalCorruptError(key, f"footer names sequence {seq} of another writer or key")
    footer = WalFooter(seq, whash, created, index_position, count, index_crc)
    index_end = index_position + count * INDEX_ENTRY_SIZE
    if count < 1 or index_end + FOOTER_SIZE != len(view):
        raise S3WalCorruptError(
            key, f"footer describes {count} blocks ending at {index_end}, object is {len(view)}"
        )
    index = view[index_position:index_end]
    if crc32c.crc32c(index) != index_crc:
        raise S3WalCorruptError(key, "index CRC mismatch", index_position, index_end)
    blocks = []
    position, previous = 0, -1
    for block in (WalBlock(*entry) for entry in _ENTRY.iter_unpack(index)):
        if block.position != position or block.stream_id <= previous or block.size < 1:
            raise S3WalCorruptError(key, f"index: block of stream {block.stream_id} out of place")
        end = position + block.size
        if end > index_position or crc32c.crc32c(view[position:end]) != block.crc:
            raise S3WalCorruptError(
                key,
                f"block of stream {block.stream_id}: CRC mismatch or out of bounds",
                position,
                end,
            )
        blocks.append(block)
        position, previous = end, block.stream_id
    if position != index_position:
        raise S3WalCorruptError(
            key, f"blocks end at {position}, the index starts at {index_position}"
        )
    return footer, tuple(blocks)
