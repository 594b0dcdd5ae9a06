"""The object format: concrete objects, the key scheme, the writer's rules, and every way
an object can be damaged, each failing with ObjectFormatError naming the object.

Footers and index entries are packed here by hand from the layout in
docs/object-format.md, so these tests check the code against the document."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import crc32c
import pytest

from proxy.objects.format import (
    FOOTER_SIZE,
    INDEX_ENTRY_SIZE_V1,
    Footer,
    IndexEntry,
    ObjectFormatError,
    ObjectKind,
    find_entries,
    index_in_tail,
    parse_footer,
    parse_head,
    parse_index,
    read_block,
    read_object,
)
from proxy.objects.format_writer import ObjectWriter
from proxy.objects.keys import object_key, parse_object_key
from proxy.records.batches import CorruptBatchError, iter_batches, with_base_offset
from tests.support.batches import build_batch

DOC = Path(__file__).resolve().parents[3] / "docs" / "object-format.md"


def kafka_batch(count: int, value_size: int = 20) -> bytes:
    timestamps = [1_000 + i for i in range(count)]
    return build_batch([b"v" * value_size] * count, timestamps=timestamps)


def pack_footer(
    *,
    object_id: int,
    kind: int,
    index_position: int,
    index_size: int,
    block_count: int,
    index_crc: int,
    version: int = 1,
    footer_size: int = 48,
    head_magic: bytes = b"TPOF",
    reserved: bytes = bytes(3),
    tail_magic: bytes = b"TPOE",
) -> bytes:
    body = (
        head_magic
        + bytes([kind])
        + reserved
        + struct.pack(">QQIII", object_id, index_position, index_size, block_count, index_crc)
        + struct.pack(">HH", version, footer_size)
    )
    return body + struct.pack(">I", crc32c.crc32c(body)) + tail_magic


def pack_entry(stream_id, start, end, count, position, size, crc) -> bytes:
    return struct.pack(">QqQIQII", stream_id, start, end - start, count, position, size, crc)


def sample_object() -> tuple[bytes, str, dict[tuple[int, int], bytes]]:
    """A stream set object: streams 9 and 2, added out of order, 3 blocks in all."""
    writer = ObjectWriter(0xABCDEF, ObjectKind.STREAM_SET, version=1)
    blocks = {(9, 100): b"nine-a", (9, 104): b"nine-bb", (2, 0): b"two"}
    writer.add_block(9, blocks[(9, 100)], 100, 104, 4)
    writer.add_block(2, blocks[(2, 0)], 0, 1, 1)
    writer.add_block(9, blocks[(9, 104)], 104, 110, 5)
    built = writer.build()
    return built.to_bytes(), built.key, blocks


def test_a_stream_set_object_round_trips_in_stream_order():
    data, key, blocks = sample_object()
    footer, index = read_object(data, key)
    assert footer == Footer(0xABCDEF, ObjectKind.STREAM_SET, 16, 3 * 44, 3, footer.index_crc, 1)
    assert [(e.stream_id, e.start_offset, e.end_offset, e.record_count) for e in index] == [
        (2, 0, 1, 1),
        (9, 100, 104, 4),
        (9, 104, 110, 5),
    ]
    assert [(e.position, e.size) for e in index] == [(0, 3), (3, 6), (9, 7)]
    for entry in index:
        assert bytes(read_block(data, entry, key)) == blocks[(entry.stream_id, entry.start_offset)]
    assert data[:16] == b"twonine-anine-bb"
    assert len(data) == 16 + 3 * INDEX_ENTRY_SIZE_V1 + FOOTER_SIZE == footer.object_size


def test_the_layout_is_the_documented_one():
    data, key, _ = sample_object()
    index = pack_entry(2, 0, 1, 1, 0, 3, crc32c.crc32c(b"two"))
    index += pack_entry(9, 100, 104, 4, 3, 6, crc32c.crc32c(b"nine-a"))
    index += pack_entry(9, 104, 110, 5, 9, 7, crc32c.crc32c(b"nine-bb"))
    footer = pack_footer(
        object_id=0xABCDEF,
        kind=1,
        index_position=16,
        index_size=len(index),
        block_count=3,
        index_crc=crc32c.crc32c(index),
    )
    assert data == b"twonine-anine-bb" + index + footer


def test_pieces_are_the_callers_buffers_not_copies():
    records = bytearray(b"x" * 1000)
    writer = ObjectWriter(1, ObjectKind.STREAM, version=1)
    writer.add_block(5, memoryview(records)[:600], 0, 10, 10)
    writer.add_block(5, memoryview(records)[600:], 10, 20, 10)
    built = writer.build()
    assert built.pieces[0].obj is records and built.pieces[1].obj is records
    assert sum(len(piece) for piece in built.pieces) == built.size == len(built.to_bytes())


def test_add_batches_takes_offsets_and_counts_from_the_batches():
    run = with_base_offset(kafka_batch(3) + kafka_batch(1) + kafka_batch(5), 40)
    writer = ObjectWriter(7, ObjectKind.STREAM)
    writer.add_batches(3, run)
    built = writer.build()
    (entry,) = built.index
    assert (entry.start_offset, entry.end_offset, entry.record_count) == (40, 49, 9)
    assert bytes(read_block(built.to_bytes(), entry, built.key)) == bytes(run)


def test_add_batches_splits_blocks_at_batch_boundaries():
    one = kafka_batch(2)
    run = with_base_offset(one * 5, 0)
    writer = ObjectWriter(7, ObjectKind.STREAM)
    writer.add_batches(3, run, max_block_bytes=2 * len(one) + 1)
    built = writer.build()
    assert [(e.start_offset, e.end_offset, e.record_count) for e in built.index] == [
        (0, 4, 4),
        (4, 8, 4),
        (8, 10, 2),
    ]
    # a batch larger than the limit gets a block of its own
    writer = ObjectWriter(8, ObjectKind.STREAM)
    writer.add_batches(3, run, max_block_bytes=10)
    assert len(writer.build().index) == 5


def test_add_batches_keeps_offset_gaps_inside_the_range():
    """Compaction leaves gaps between batches; the range still covers them."""
    first, second = kafka_batch(2), kafka_batch(2)
    run = bytearray(with_base_offset(first, 10) + with_base_offset(second, 50))
    writer = ObjectWriter(9, ObjectKind.STREAM)
    writer.add_batches(4, run, start_offset=0, max_block_bytes=len(first))
    assert [(e.start_offset, e.end_offset, e.record_count) for e in writer.build().index] == [
        (0, 12, 2),
        (12, 52, 2),
    ]
    assert writer.stream_end(4) == 52 and writer.stream_end(5) is None


def test_add_batches_refuses_bad_input():
    writer = ObjectWriter(9, ObjectKind.STREAM)
    backwards = with_base_offset(kafka_batch(2), 10) + with_base_offset(kafka_batch(2), 11)
    with pytest.raises(ValueError, match="base offset 11, below 12"):
        writer.add_batches(1, backwards)
    with pytest.raises(ValueError, match="base offset 10, below 20"):
        writer.add_batches(1, with_base_offset(kafka_batch(2), 10), start_offset=20)
    damaged = bytearray(kafka_batch(2))
    damaged[-1] ^= 1
    with pytest.raises(CorruptBatchError, match="CRC-32C mismatch"):
        writer.add_batches(1, damaged)
    writer.add_batches(1, damaged, validate=False)  # the offload job's choice to make
    with pytest.raises(ValueError, match="no record batches"):
        writer.add_batches(1, b"")
    with pytest.raises(ValueError, match="max_block_bytes"):
        writer.add_batches(1, kafka_batch(1), max_block_bytes=0)


def test_add_batches_adds_a_run_whole_or_not_at_all():
    good = with_base_offset(kafka_batch(2), 0)
    lying = bytearray(with_base_offset(kafka_batch(2), 2))
    struct.pack_into(">i", lying, 57, 100)  # record count 100 in a range of 2 offsets
    writer = ObjectWriter(9, ObjectKind.STREAM_SET, version=1)
    writer.add_block(1, b"x", 0, 5, 1)
    with pytest.raises(ValueError, match="100 records cannot fit"):
        writer.add_batches(3, good + lying, max_block_bytes=len(good), validate=False)
    assert writer.stream_end(3) is None
    with pytest.raises(ValueError, match="100 records cannot fit"):
        writer.add_batches(1, with_base_offset(good + lying, 5), max_block_bytes=len(good),
                           validate=False)  # fmt: skip
    assert writer.stream_end(1) == 5
    writer.add_batches(3, good)
    assert [(e.stream_id, e.end_offset) for e in writer.build().index] == [(1, 5), (3, 2)]


def test_a_stream_object_holds_exactly_one_stream():
    writer = ObjectWriter(3, ObjectKind.STREAM, version=1)
    writer.add_block(1, b"a", 0, 1, 1)
    with pytest.raises(ValueError, match="a stream object holds one stream"):
        writer.add_block(2, b"b", 0, 1, 1)


def test_blocks_of_a_stream_must_be_consecutive():
    writer = ObjectWriter(3, ObjectKind.STREAM_SET, version=1)
    writer.add_block(1, b"a", 10, 20, 1)
    with pytest.raises(ValueError, match="overlaps the stream's previous block, ending at 20"):
        writer.add_block(1, b"b", 15, 25, 1)
    with pytest.raises(ValueError, match="leaves a gap after the stream's previous block"):
        writer.add_block(1, b"b", 21, 25, 1)
    writer.add_block(1, b"b", 20, 25, 1)
    writer.add_block(2, b"c", 0, 5, 1)  # other streams have their own offsets


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1, b"a", 0, 1, 1), "stream id"),
        ((1 << 64, b"a", 0, 1, 1), "stream id"),
        ((1, b"a", -1, 1, 1), "start offset < end offset"),
        ((1, b"a", 5, 5, 0), "start offset < end offset"),
        ((1, b"a", 0, 1 << 63, 1), "start offset < end offset"),
        ((1, b"a", 0, 3, 4), "4 records cannot fit"),
        ((1, b"a", 0, 3, -1), "records cannot fit"),
        ((1, b"", 0, 3, 1), "0 bytes"),
    ],
)
def test_add_block_refuses_impossible_blocks(args, message):
    with pytest.raises(ValueError, match=message):
        ObjectWriter(3, ObjectKind.STREAM_SET, version=1).add_block(*args)


def test_an_empty_object_is_refused():
    with pytest.raises(ValueError, match="at least one block"):
        ObjectWriter(3, ObjectKind.STREAM_SET).build()


def test_find_entries_locates_the_block_holding_an_offset():
    writer = ObjectWriter(4, ObjectKind.STREAM_SET, version=1)
    writer.add_block(1, b"a", 0, 10, 1)
    writer.add_block(5, b"b", 100, 110, 1)
    writer.add_block(5, b"c", 110, 120, 1)
    writer.add_block(5, b"d", 120, 121, 1)
    writer.add_block(8, b"e", 0, 10, 1)
    index = writer.build().index

    def starts(stream_id, offset):
        return [e.start_offset for e in find_entries(index, stream_id, offset)]

    assert starts(5, 100) == [100, 110, 120]
    assert starts(5, 109) == [100, 110, 120]
    assert starts(5, 110) == [110, 120]
    assert starts(5, 120) == [120]
    assert starts(5, 121) == []
    assert starts(5, 99) == []
    assert starts(5, 0) == []
    assert starts(1, 9) == [0]
    assert starts(8, 3) == [0]
    assert starts(3, 0) == []
    assert starts(9, 0) == []


def test_a_reader_gets_the_index_from_a_longer_tail_read():
    data, key, _ = sample_object()
    tail = data[-200:]
    footer = parse_footer(tail, len(data), key)
    index = index_in_tail(tail, len(data), footer)
    assert index is not None
    assert parse_index(index, footer, key) == read_object(data, key)[1]
    assert index_in_tail(data[-FOOTER_SIZE:], len(data), footer) is None


def test_a_ranged_read_of_a_run_of_blocks():
    data, key, blocks = sample_object()
    _, index = read_object(data, key)
    run = find_entries(index, 9, 100)
    start, end = run[0].position, run[-1].end_position
    ranged = data[start:end]
    assert [bytes(read_block(ranged, e, key, start)) for e in run] == [b"nine-a", b"nine-bb"]
    exact = data[run[1].position : run[1].end_position]
    assert bytes(read_block(exact, run[1], key, run[1].position)) == b"nine-bb"
    with pytest.raises(ObjectFormatError, match="not within the 6 bytes read from 3: truncated"):
        read_block(ranged[:-7], run[1], key, start)
    with pytest.raises(ObjectFormatError, match="truncated"):
        read_block(ranged, run[0], key, start + 1)


# --- keys ---


def test_object_keys_spread_over_prefixes_and_read_back():
    assert object_key(0x1234, ObjectKind.STREAM_SET) == "4321/stream-set/0000000000001234"
    assert object_key(0, ObjectKind.STREAM) == "0000/stream/0000000000000000"
    assert object_key((1 << 64) - 1, ObjectKind.STREAM) == "ffff/stream/ffffffffffffffff"
    prefixes = {object_key(i, ObjectKind.STREAM_SET).split("/")[0] for i in range(1000, 1256)}
    assert len(prefixes) == 256
    for object_id in (0, 1, 0xABCDEF, (1 << 64) - 1):
        for kind in ObjectKind:
            assert parse_object_key(object_key(object_id, kind)) == (object_id, kind)


@pytest.mark.parametrize(
    "key",
    [
        "1234/stream-set/0000000000001234",  # prefix not the reversed digits
        "4321/stream-set/000000000001234",
        "4321/streams/0000000000001234",
        "4321/stream-set/0000000000001234/",
        "4321/STREAM/0000000000001234",
        "4321/stream-set/000000000000123G",
        "",
    ],
)
def test_malformed_keys_are_refused(key):
    with pytest.raises(ValueError):
        parse_object_key(key)


@pytest.mark.parametrize("object_id", [-1, 1 << 64])
def test_object_ids_are_unsigned_64_bit(object_id):
    with pytest.raises(ValueError, match="unsigned 64-bit"):
        object_key(object_id, ObjectKind.STREAM)


# --- corruption: every case fails with ObjectFormatError naming the object ---


def refooter(data: bytes, **changes) -> bytes:
    """The object with its footer rewritten (with a valid footer CRC) from `changes`."""
    footer, _ = read_object(data, KEY)
    fields = dict(
        object_id=footer.object_id,
        kind=footer.kind,
        index_position=footer.index_position,
        index_size=footer.index_size,
        block_count=footer.block_count,
        index_crc=footer.index_crc,
    )
    fields.update(changes)
    return data[:-FOOTER_SIZE] + pack_footer(**fields)


DATA, KEY, _ = sample_object()
INDEX_START = 16
INDEX_END = len(DATA) - FOOTER_SIZE


def reindex(entries: list[bytes], kind: int = 1, data_size: int = INDEX_START) -> bytes:
    """An object of DATA's blocks with the given index entries and a valid footer."""
    index = b"".join(entries)
    footer = pack_footer(
        object_id=0xABCDEF,
        kind=kind,
        index_position=data_size,
        index_size=len(index),
        block_count=len(entries),
        index_crc=crc32c.crc32c(index),
    )
    return DATA[:data_size] + index + footer


def flip(data: bytes, position: int) -> bytes:
    out = bytearray(data)
    out[position] ^= 0x01
    return bytes(out)


GOOD_ENTRIES = [
    pack_entry(2, 0, 1, 1, 0, 3, crc32c.crc32c(b"two")),
    pack_entry(9, 100, 104, 4, 3, 6, crc32c.crc32c(b"nine-a")),
    pack_entry(9, 104, 110, 5, 9, 7, crc32c.crc32c(b"nine-bb")),
]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(DATA[:10], "10 bytes, less than a 48-byte footer: truncated", id="tiny"),
        pytest.param(b"", "0 bytes, less than a 48-byte footer", id="empty"),
        pytest.param(DATA[:-1], "bad tail magic", id="truncated-1"),
        pytest.param(DATA[:-30], "bad tail magic", id="truncated-30"),
        pytest.param(DATA + b"\x00", "bad tail magic", id="extended"),
        pytest.param(DATA[:-4] + b"PAR1", r"bad tail magic b'PAR1'", id="foreign"),
        pytest.param(flip(DATA, len(DATA) - 2), "bad tail magic", id="tail-magic"),
        pytest.param(flip(DATA, len(DATA) - 48), "footer CRC mismatch", id="head-magic-flip"),
        pytest.param(flip(DATA, len(DATA) - 11), "footer CRC mismatch", id="version-flip"),
        pytest.param(flip(DATA, len(DATA) - 5), "footer CRC mismatch", id="crc-flip"),
        pytest.param(flip(DATA, len(DATA) - 33), "footer CRC mismatch", id="index-size-flip"),
        pytest.param(refooter(DATA, version=4), "unsupported format version 4", id="newer"),
        pytest.param(refooter(DATA, version=0), "unsupported format version 0", id="v0"),
        pytest.param(refooter(DATA, footer_size=64), "footer size 64", id="footer-size"),
        pytest.param(refooter(DATA, head_magic=b"XXXX"), "bad footer magic", id="head-magic"),
        pytest.param(refooter(DATA, kind=3), "unknown object kind 3", id="kind"),
        pytest.param(refooter(DATA, reserved=b"\x00\x01\x00"), "flags 000100", id="reserved"),
        pytest.param(refooter(DATA, block_count=2), "cannot hold 2 blocks", id="count"),
        pytest.param(
            refooter(DATA, block_count=0, index_size=0), "cannot hold 0 blocks", id="no-blocks"
        ),
        pytest.param(refooter(DATA, index_position=15), "is 196 bytes: truncated or", id="size"),
        pytest.param(refooter(DATA, object_id=0xABCDEE), "footer names", id="other-object"),
        pytest.param(refooter(DATA, kind=2), "footer names .*/stream/", id="other-kind"),
        pytest.param(flip(DATA, INDEX_START), "index CRC mismatch", id="index-first-byte"),
        pytest.param(flip(DATA, INDEX_END - 1), "index CRC mismatch", id="index-last-byte"),
        pytest.param(refooter(DATA, index_crc=1), "index CRC mismatch", id="index-crc"),
        pytest.param(
            reindex([GOOD_ENTRIES[0], GOOD_ENTRIES[2], GOOD_ENTRIES[1]]),
            "out of bounds",
            id="blocks-out-of-order",
        ),
        pytest.param(
            reindex([*GOOD_ENTRIES[:2], pack_entry(9, 103, 110, 5, 9, 7, 0)]),
            "overlapping ranges, the block before ends at 104",
            id="overlap",
        ),
        pytest.param(
            reindex([*GOOD_ENTRIES[:2], pack_entry(9, 105, 110, 5, 9, 7, 0)]),
            "offset gap",
            id="gap",
        ),
        pytest.param(
            reindex([pack_entry(9, 0, 1, 1, 0, 3, 0), pack_entry(2, 0, 1, 1, 3, 13, 0)]),
            "not sorted by stream id",
            id="unsorted",
        ),
        pytest.param(
            reindex([*GOOD_ENTRIES[:2], pack_entry(9, 104, 110, 5, 9, 8, 0)]),
            "out of bounds, expected to start at 9 and end by 16",
            id="past-index",
        ),
        pytest.param(
            reindex([GOOD_ENTRIES[0], pack_entry(9, 100, 104, 4, 3, 6, 0)]),
            "blocks end at byte 9, the index starts at 16",
            id="short-of-index",
        ),
        pytest.param(
            reindex([pack_entry(2, 0, 1, 1, 0, 3, 0)], data_size=0),
            "out of bounds",
            id="no-data",
        ),
        pytest.param(
            reindex([pack_entry(2, 0, 0, 0, 0, 16, 0)]), "impossible offsets", id="empty-range"
        ),
        pytest.param(reindex([pack_entry(2, 0, 1, 2, 0, 16, 0)]), "impossible offsets", id="count"),
        pytest.param(
            reindex([pack_entry(2, -5, 1, 1, 0, 16, 0)]), "impossible offsets", id="negative"
        ),
        pytest.param(
            reindex([pack_entry(2, 10, 1 << 63, 1, 0, 16, 0)]), "impossible", id="offset-overflow"
        ),
    ],
)
def test_damaged_object_fails_with_object_format_error(data, message):
    with pytest.raises(ObjectFormatError, match=message) as caught:
        read_object(data, KEY)
    assert caught.value.key == KEY
    assert str(caught.value).startswith(f"object {KEY}: ")
    assert isinstance(caught.value, ValueError)


def test_a_stream_object_with_a_second_stream_is_refused():
    key = object_key(0xABCDEF, ObjectKind.STREAM)
    with pytest.raises(ObjectFormatError, match="a stream object with a second stream"):
        read_object(reindex(GOOD_ENTRIES, kind=2), key)
    single = [pack_entry(9, 100, 104, 4, 0, 16, crc32c.crc32c(DATA[:16]))]
    _, index = read_object(reindex(single, kind=2), key)
    assert bytes(read_block(reindex(single, kind=2), index[0], key)) == DATA[:16]


def test_a_damaged_block_fails_only_when_read():
    for position in range(INDEX_START):
        damaged = flip(DATA, position)
        _, index = read_object(damaged, KEY)
        for entry in index:
            if entry.position <= position < entry.end_position:
                with pytest.raises(ObjectFormatError, match="block CRC mismatch for stream"):
                    read_block(damaged, entry, KEY)
            else:
                assert bytes(read_block(damaged, entry, KEY)) == bytes(read_block(DATA, entry, KEY))


def test_footer_tail_and_index_length_must_fit():
    footer, _ = read_object(DATA, KEY)
    with pytest.raises(ObjectFormatError, match="47 tail bytes given, need 48"):
        parse_footer(DATA[-47:], len(DATA), KEY)
    with pytest.raises(ObjectFormatError, match="tail bytes given, need 48 to 100"):
        parse_footer(DATA[-101:], 100, KEY)
    with pytest.raises(ObjectFormatError, match="index is 131 bytes, the footer says 132"):
        parse_index(DATA[INDEX_START : INDEX_END - 1], footer, KEY)
    with pytest.raises(ObjectFormatError, match="index is 0 bytes"):
        parse_index(b"", footer, KEY)


def test_read_block_checks_the_entry_against_the_data_given():
    entry = IndexEntry(2, 0, 1, 1, 1_000, 3, crc32c.crc32c(b"two"))
    with pytest.raises(ObjectFormatError, match=r"at bytes \[1000, 1003\) is not within"):
        read_block(DATA, entry, KEY)


def test_the_worked_example_in_the_docs_is_what_the_code_writes():
    """docs/object-format.md shows a tiny object in hex; it must stay true."""
    text = DOC.read_text()
    dump = re.search(r"<!-- example-hex -->\n```\n(.*?)```", text, re.S).group(1)
    written = bytes.fromhex("".join(line.split("|")[0][10:] for line in dump.splitlines()))
    batch = bytes.fromhex(re.search(r"<!-- example-batch -->\n```\n(.*?)```", text, re.S)[1])
    writer = ObjectWriter(0x2A, ObjectKind.STREAM)
    writer.add_batches(7, with_base_offset(batch, 5))
    built = writer.build()
    assert written == built.to_bytes()
    assert built.key in text
    assert f"{built.footer.index_crc:08x}" in text
    assert built.footer.version == 3
    assert parse_head(written, len(written), built.key) == built.footer
    header, _ = next(iter_batches(written[built.footer.data_start :]))
    assert header.base_offset == 5
