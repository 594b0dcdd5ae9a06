"""The segment reader on segment files built from kafka-python's batch builder: batches
come back byte-exact, the `.index` is used and a bogus one is survived, the last
segment's torn tail is left out and reported, a corrupt byte anywhere else names the file
and the byte."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from offload_jobs.segments import CorruptSegment, SegmentReader, index_position, list_segments
from tests.support.batches import build_batch
from tests.support.kafka_python import DefaultRecordBatch


def batch(base_offset: int, count: int, *, compression: int = 0, producer: int = -1) -> bytes:
    idempotent = producer >= 0
    return build_batch(
        [f"v{base_offset + i}".encode() * 20 for i in range(count)],
        keys=[f"k{i}".encode() for i in range(count)], headers=[("h", b"x")],
        codec=compression, producer_id=producer, producer_epoch=0 if idempotent else -1,
        base_sequence=base_offset if idempotent else -1, base_offset=base_offset,
    )  # fmt: skip


def write_partition(
    directory: Path, segments: list[list[tuple[int, int]]], *, codec: int = 0
) -> list[bytes]:
    """Segment files of (base offset, record count) batches; returns every batch's bytes.
    Each segment gets an `.index` entry per batch after its first (Kafka's, every 4 KiB,
    is sparser), followed by preallocated zeros as in an active segment."""
    directory.mkdir(parents=True)
    written = []
    for batches in segments:
        base = batches[0][0]
        data, index = bytearray(), bytearray()
        for offset, count in batches:
            if data:
                index += struct.pack(">ii", offset - base, len(data))
            one = batch(offset, count, compression=codec, producer=7)
            written.append(one)
            data += one
        (directory / f"{base:020d}.log").write_bytes(data)
        (directory / f"{base:020d}.index").write_bytes(index + bytes(80))
        (directory / f"{base:020d}.timeindex").write_bytes(bytes(12))
    return written


LAYOUT = [[(0, 3), (3, 5), (8, 2)], [(10, 4), (14, 1)], [(15, 6), (21, 3)]]


def test_segments_are_listed_by_base_offset(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0", LAYOUT)
    (tmp_path / "t-0" / f"{99:020d}.log.deleted").write_bytes(b"gone")
    (tmp_path / "t-0" / "leader-epoch-checkpoint").write_text("0\n")
    assert [s.base_offset for s in list_segments(tmp_path / "t-0")] == [0, 10, 15]


def test_batches_come_back_byte_exact_in_offset_order(tmp_path: Path) -> None:
    written = write_partition(tmp_path / "t-0", LAYOUT, codec=1)  # gzip stays compressed
    reader = SegmentReader(tmp_path / "t-0")
    read = list(reader.read(0, 24))
    assert [bytes(b.data) for b in read] == written
    assert [(b.base_offset, b.last_offset) for b in read][:3] == [(0, 2), (3, 7), (8, 9)]
    assert reader.torn_tail is None
    records = [r for b in read for r in DefaultRecordBatch(bytes(b.data))]
    assert [r.offset for r in records] == list(range(24))


@pytest.mark.parametrize(
    ("start", "end", "bases"),
    [(4, 11, [3, 8, 10]), (10, 15, [10, 14]), (0, 1, [0]), (23, 24, [21]), (9, 10, [8])],
)
def test_a_range_gets_the_batches_holding_its_offsets(tmp_path, start, end, bases) -> None:
    write_partition(tmp_path / "t-0", LAYOUT)
    assert [b.base_offset for b in SegmentReader(tmp_path / "t-0").read(start, end)] == bases


def test_the_index_gives_a_batch_at_or_before_the_offset(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0", LAYOUT)
    [first, *_] = list_segments(tmp_path / "t-0")
    size = first.path.stat().st_size
    sizes = [len(batch(o, c, producer=7)) for o, c in LAYOUT[0]]
    assert index_position(first, 0, size) == 0
    assert index_position(first, 5, size) == sizes[0]  # the batch of offsets 3..7
    assert index_position(first, 9, size) == sizes[0] + sizes[1]


def test_an_index_pointing_nowhere_falls_back_to_reading_from_the_start(tmp_path) -> None:
    write_partition(tmp_path / "t-0", LAYOUT)
    (tmp_path / "t-0" / f"{0:020d}.index").write_bytes(struct.pack(">ii", 5, 7))  # byte 7
    assert [b.base_offset for b in SegmentReader(tmp_path / "t-0").read(6, 10)] == [3, 8]


def test_the_last_segments_torn_tail_is_left_out_and_reported(tmp_path: Path) -> None:
    written = write_partition(tmp_path / "t-0", LAYOUT)
    last = tmp_path / "t-0" / f"{15:020d}.log"
    full = last.read_bytes()
    last.write_bytes(full[: len(full) - 9])
    reader = SegmentReader(tmp_path / "t-0")
    read = list(reader.read(0, 24))
    assert [bytes(b.data) for b in read] == written[:-1]
    torn = reader.torn_tail
    assert torn is not None and torn.path == str(last)
    assert torn.position == len(written[-2]) and torn.size == len(written[-1]) - 9


def test_a_cut_segment_that_is_not_the_last_is_corrupt(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0", LAYOUT)
    middle = tmp_path / "t-0" / f"{10:020d}.log"
    middle.write_bytes(middle.read_bytes()[:-5])
    with pytest.raises(CorruptSegment) as caught:
        list(SegmentReader(tmp_path / "t-0").read(0, 24))
    assert caught.value.path == str(middle)
    assert caught.value.position == len(batch(10, 4, producer=7))
    assert "not the last segment" in str(caught.value)


@pytest.mark.parametrize("segment", [0, 2])
def test_a_flipped_byte_names_the_file_and_the_batch(tmp_path: Path, segment: int) -> None:
    write_partition(tmp_path / "t-0", LAYOUT)
    base = LAYOUT[segment][0][0]
    path = tmp_path / "t-0" / f"{base:020d}.log"
    data = bytearray(path.read_bytes())
    second = len(batch(*LAYOUT[segment][0], producer=7))
    data[second + 100] ^= 0x01  # inside the records of the segment's second batch
    path.write_bytes(data)
    reader = SegmentReader(tmp_path / "t-0")
    with pytest.raises(CorruptSegment) as caught:
        list(reader.read(0, 24))
    assert caught.value.path == str(path) and caught.value.position == second
    assert "CRC-32C mismatch" in caught.value.reason
    assert str(path) in str(caught.value) and f"byte {second}" in str(caught.value)


def test_old_message_formats_are_refused_with_their_position(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0", LAYOUT[:1])
    path = tmp_path / "t-0" / f"{0:020d}.log"
    data = bytearray(path.read_bytes())
    data[16] = 1  # magic 1: a pre-0.11 message set
    path.write_bytes(data)
    with pytest.raises(CorruptSegment, match="magic is 1") as caught:
        list(SegmentReader(tmp_path / "t-0").read(0, 10))
    assert caught.value.position == 0


def test_an_empty_active_segment_reads_as_nothing(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0", LAYOUT[:1])
    (tmp_path / "t-0" / f"{10:020d}.log").write_bytes(b"")
    reader = SegmentReader(tmp_path / "t-0")
    assert [b.base_offset for b in reader.read(0, 100)] == [0, 3, 8]
    assert reader.torn_tail is None


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="t-9"):
        list_segments(tmp_path / "t-9")
