"""Record batches as the clients write them, for tests that need real bytes.

`build_batch` is a v2 batch as a producer sends it (aiokafka's builder, the codec as a
client writes it), one record per value, base offset 0 unless told; `opaque_batch` is a
v2 batch header written by hand around payload bytes nobody decodes (the WALs only read
the header), and `batch_of_size` one of exactly `size` bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import crc32c
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from proxy.records.batches import with_base_offset

NOW_MS = 1_700_000_000_000
HEADER = 61  # bytes of a v2 batch before its first record


def build_batch(
    values: Sequence[bytes | None],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps: Sequence[int] | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    record_headers: Sequence[list[tuple[str, bytes]]] | None = None,
    codec: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    base_offset: int = 0,
) -> bytes:
    """One record per value: keys none unless given, timestamps NOW_MS + i unless given,
    `headers` on every record or `record_headers[i]` on record i."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 26,
    )
    for i, value in enumerate(values):
        key = None if keys is None else keys[i]
        timestamp = NOW_MS + i if timestamps is None else timestamps[i]
        these = headers if record_headers is None else record_headers[i]
        builder.append(i, timestamp=timestamp, key=key, value=value, headers=these or [])
    data = bytes(builder.build())
    return bytes(with_base_offset(data, base_offset)) if base_offset else data


def seeded_batch(count: int, seed: int) -> bytes:
    """`count` records with keys, their values of bytes that differ with `seed`: batches
    that tell each other apart when a test compares bytes."""
    values = [bytes([(seed + i) % 256]) * (10 + seed) for i in range(count)]
    return build_batch(values, keys=[b"k%d" % i for i in range(count)])


def opaque_batch(payload: bytes, *, records: int = 1, base_sequence: int = -1) -> bytes:
    """A v2 batch as a producer sends it (base offset 0, producer id 7); the records are
    `payload`, opaque."""
    body = struct.pack(">hiqqqhii", 0, records - 1, NOW_MS, NOW_MS, 7, 0, base_sequence, records)
    body += payload
    return struct.pack(">qiibI", 0, 9 + len(body), 0, 2, crc32c.crc32c(body)) + body


def batch_of_size(size: int, fill: int = 0x5A) -> bytes:
    """An `opaque_batch` of exactly `size` bytes, its payload all `fill`."""
    return opaque_batch(bytes([fill]) * (size - HEADER))


def patched(batch: bytes, position: int, fmt: str, value: int, *, fix_crc: bool = True) -> bytes:
    """`batch` with one header field changed (`fmt` at `position`), its CRC recomputed
    unless told not to (a test of a CRC check)."""
    out = bytearray(batch)
    struct.pack_into(fmt, out, position, value)
    if fix_crc:
        struct.pack_into(">I", out, 17, crc32c.crc32c(out[21:]))
    return bytes(out)


def control_batch(
    producer_id: int,
    producer_epoch: int,
    kind: int,
    *,
    coordinator_epoch: int = 0,
    key: bytes | None = None,
    timestamp: int = NOW_MS,
) -> bytes:
    """A transaction marker as a coordinator writes it: a control batch of one record,
    key (version 0, `kind`: 0 abort, 1 commit), value (version 0, coordinator epoch)."""
    key = struct.pack(">hh", 0, kind) if key is None else key
    marker = build_batch(
        [struct.pack(">hi", 0, coordinator_epoch)],
        keys=[key],
        timestamps=[timestamp],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
    )
    return patched(marker, 21, ">h", 0x30)  # attributes: transactional + control
