"""Objects of any shape round-trip; damage is caught exactly as far as the checksums promise.

The promise (docs/object-format.md, "Checksums"): CRC-32C catches every change confined
to 32 consecutive bits. So a change to any one byte of the footer or the index makes the
footer or the index unreadable, and a change to one byte of a block makes that block, and
only that block, fail its read; everything else reads back exactly. A cut or extended
object never reads as valid.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.objects.format import (
    FOOTER_SIZE,
    BuiltObject,
    ObjectFormatError,
    ObjectKind,
    ObjectWriter,
    find_entries,
    index_in_tail,
    parse_footer,
    parse_index,
    read_block,
    read_object,
)
from proxy.objects.keys import object_key, parse_object_key

U64 = st.integers(0, (1 << 64) - 1)
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def objects(draw) -> tuple[BuiltObject, list[tuple[int, bytes, int, int, int]]]:
    """A built object and the blocks it was given, in the order they were added."""
    kind = draw(st.sampled_from(ObjectKind))
    stream_count = 1 if kind is ObjectKind.STREAM else draw(st.integers(1, 5))
    stream_ids = draw(st.lists(U64, min_size=stream_count, max_size=stream_count, unique=True))
    per_stream = []
    for stream_id in stream_ids:
        offset = draw(st.integers(0, (1 << 62)))
        blocks = []
        for _ in range(draw(st.integers(1, 4))):
            # mostly small ranges; sometimes one wider than 32 bits (compaction gaps)
            span = draw(st.integers(1, 1000) | st.integers(1 << 32, 1 << 40))
            count = draw(st.integers(0, min(span, (1 << 32) - 1)))
            data = draw(st.binary(min_size=1, max_size=48))
            blocks.append((stream_id, data, offset, offset + span, count))
            offset += span
        per_stream.append(blocks)
    # interleave the streams' blocks in any order, each stream's own blocks in offset order
    labels = [i for i, blocks in enumerate(per_stream) for _ in blocks]
    added = [per_stream[i].pop(0) for i in draw(st.permutations(labels))]
    writer = ObjectWriter(draw(U64), kind, version=draw(st.sampled_from((1, 2))))
    for block in added:
        # version 2 records each block's max timestamp; these blocks are not batches
        writer.add_block(*block, max_timestamp=draw(st.integers(-1, (1 << 63) - 1)))
    return writer.build(), added


def read_everything(data: bytes, key: str, object_size: int | None = None) -> list[bytes]:
    """Footer, index and every block, as a reader would; the blocks' bytes."""
    size = len(data) if object_size is None else object_size
    footer = parse_footer(data[-FOOTER_SIZE:] if len(data) >= FOOTER_SIZE else data, size, key)
    index = parse_index(data[footer.index_position : footer.index_end], footer, key)
    return [bytes(read_block(data, entry, key)) for entry in index]


@PROPERTY
@given(built_and_blocks=objects(), tail_extra=st.integers(0, 10_000))
def test_any_object_round_trips(built_and_blocks, tail_extra):
    built, added = built_and_blocks
    data = built.to_bytes()
    assert len(data) == built.size
    tail = data[-min(len(data), FOOTER_SIZE + tail_extra) :]
    footer = parse_footer(tail, len(data), built.key)
    assert footer == built.footer
    assert parse_object_key(built.key) == (footer.object_id, footer.kind)
    index_bytes = index_in_tail(tail, len(data), footer)
    if index_bytes is None:
        index_bytes = data[footer.index_position : footer.index_end]
    index = parse_index(index_bytes, footer, built.key)
    assert index == built.index
    # sorted by stream, each stream's blocks in the order they were added
    expected = sorted(added, key=lambda block: (block[0], block[2]))
    assert [(e.stream_id, e.start_offset, e.end_offset, e.record_count) for e in index] == [
        (stream_id, start, end, count) for stream_id, _, start, end, count in expected
    ]
    assert [bytes(read_block(data, e, built.key)) for e in index] == [b[1] for b in expected]
    for entry in index:
        for offset in (entry.start_offset, entry.end_offset - 1):
            found = find_entries(index, entry.stream_id, offset)
            assert found[0] == entry
            assert all(later.stream_id == entry.stream_id for later in found)
        assert find_entries(index, entry.stream_id, entry.end_offset)[:1] != (entry,)


@PROPERTY
@given(built_and_blocks=objects(), where=st.floats(0, 1, exclude_max=True), xor=st.integers(1, 255))
def test_any_single_byte_change_is_caught_or_harmless(built_and_blocks, where, xor):
    built, _ = built_and_blocks
    original = built.to_bytes()
    position = int(where * len(original))
    damaged = bytearray(original)
    damaged[position] ^= xor
    damaged = bytes(damaged)
    footer = built.footer
    if position >= footer.index_position:
        # the footer or the index: nothing of the object can be read
        try:
            read_object(damaged, built.key)
        except ObjectFormatError:
            return
        raise AssertionError(f"a change at byte {position} of the footer or index went unseen")
    # a block: its read fails, every other block reads back exactly
    assert read_object(damaged, built.key) == (footer, built.index)
    for entry in built.index:
        if entry.position <= position < entry.end_position:
            try:
                read_block(damaged, entry, built.key)
            except ObjectFormatError as exc:
                assert "block CRC mismatch" in str(exc)
                continue
            raise AssertionError(f"a change at byte {position} of a block went unseen")
        assert read_block(damaged, entry, built.key) == read_block(original, entry, built.key)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(built_and_blocks=objects(), extra=st.binary(min_size=1, max_size=60))
def test_any_cut_or_extended_object_is_refused(built_and_blocks, extra):
    built, _ = built_and_blocks
    data = built.to_bytes()
    for cut in range(len(data)):
        short = data[:cut]
        # the store reports the cut size...
        try:
            read_everything(short, built.key)
        except ObjectFormatError:
            pass
        else:
            raise AssertionError(f"an object cut to {cut} of {len(data)} bytes read as valid")
        # ...or the reader expects the committed size and got fewer bytes
        try:
            read_everything(short, built.key, object_size=len(data))
        except ObjectFormatError:
            pass
        else:
            raise AssertionError(f"a read of {cut} of {len(data)} bytes passed as whole")
    try:
        read_everything(data + extra, built.key)
    except ObjectFormatError:
        pass
    else:
        raise AssertionError(f"an object with {len(extra)} bytes appended read as valid")


@PROPERTY
@given(built_and_blocks=objects(), other_id=U64)
def test_an_object_read_under_another_key_is_refused(built_and_blocks, other_id):
    built, _ = built_and_blocks
    for kind in ObjectKind:
        key = object_key(other_id, kind)
        if key == built.key:
            continue
        try:
            read_object(built.to_bytes(), key)
        except ObjectFormatError as exc:
            assert exc.key == key
        else:
            raise AssertionError(f"{built.key} read as {key}")
