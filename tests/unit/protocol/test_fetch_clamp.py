"""Kafka's Fetch answer for a tiered partition read below its cutover, cut at the cutover:
batches from it on, aborted transactions starting there, a high watermark and last stable
offset past it (a transaction marker, records written to a broker directly) never reach
the client; the rest of the answer is byte for byte Kafka's."""

from __future__ import annotations

import asyncio
import struct

import pytest
from kio.schema.errors import ErrorCode
from test_fetch_split import (
    RESPONSES,
    VERSIONS,
    answer,
    batch,
    endpoints,
    key,
    mod,
    partition_data,
    request,
)

from proxy.apis.fetch_clamp import batches_below, clamp_partition_answer, data_past
from proxy.apis.fetch_merge import merge_responses
from proxy.apis.fetch_split import answer_layout, read_fetch_request
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.tiered.beyond_cutover import BeyondCutover
from proxy.tiered.fetch import FetchPlan
from tests.support.batches import control_batch

CUTOVER = 40


def at(base_offset: int, count: int, seed: int = 1) -> bytes:
    """A v2 batch of `count` records at `base_offset` (the base offset is outside the CRC)."""
    return struct.pack(">q", base_offset) + batch(count, seed)[8:]


def test_batches_below_cuts_at_the_first_batch_from_the_cutover():
    records = memoryview(at(30, 5) + at(35, 5) + at(40, 1) + at(41, 3))
    first, second = len(at(30, 5)), len(at(30, 5)) + len(at(35, 5))
    kept, cut_at = batches_below(records, 40)
    assert (bytes(kept), cut_at) == (bytes(records[:second]), 40)
    kept, cut_at = batches_below(records, 35)
    assert (bytes(kept), cut_at) == (bytes(records[:first]), 35)
    assert batches_below(records, 30)[0].nbytes == 0
    kept, cut_at = batches_below(records, 1000)
    assert (kept is records, cut_at) == (True, None)


def test_batches_below_and_a_batch_cut_short():
    whole = at(30, 5)
    # Kafka cut the last batch short at the answer's end: kept when it starts below the
    # cutover, cut when from it on; a piece too short for a header is left for the client
    assert bytes(batches_below(memoryview(whole + at(35, 5)[:20]), 40)[0]) == whole + at(35, 5)[:20]
    assert batches_below(memoryview(whole + at(40, 5)[:20]), 40) == (memoryview(whole), 40)
    assert bytes(batches_below(memoryview(whole + b"\x00" * 7), 40)[0]) == whole + b"\x00" * 7
    with pytest.raises(FrameError, match="length -5"):
        batches_below(memoryview(struct.pack(">qi", 1, -5) + bytes(20)), 40)


def kafka_entry(version, records, **fields):
    m = mod(RESPONSES, version)
    aborted = (
        m.AbortedTransaction(producer_id=5, first_offset=CUTOVER - 10),
        m.AbortedTransaction(producer_id=6, first_offset=CUTOVER),
    )
    return partition_data(
        version, 0, records=records, high_watermark=CUTOVER + 1, last_stable_offset=CUTOVER + 1,
        log_start_offset=3, aborted_transactions=aborted, preferred_read_replica=-1, **fields,
    )  # fmt: skip


def tags(version):
    if version < 12:
        return {}
    m = mod(RESPONSES, version)
    return {"current_leader": m.LeaderIdAndEpoch(leader_id=2, leader_epoch=9)}


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_cuts_a_tiered_partition_at_its_cutover(version):
    below, marker = at(CUTOVER - 5, 5), at(CUTOVER, 1, seed=9)
    entry = kafka_entry(version, below + marker, **tags(version))
    passthrough = partition_data(version, 1, records=marker, high_watermark=CUTOVER + 1)
    upstream = answer(version, [("t", [entry, passthrough])], endpoints=endpoints(version))
    view = read_fetch_request(
        version, encode(request(version, {"t": [(0, 35, 1, 1 << 20), (1, 40, 1, 1 << 20)]}))
    )
    topic = key(version, "t")
    beyond = BeyondCutover()
    plan = _plan(view, {(topic, 0): ("t", CUTOVER)}, beyond)
    merged = plan.merge(version, memoryview(encode(upstream)), {})

    m = mod(RESPONSES, version)
    kept = (m.AbortedTransaction(producer_id=5, first_offset=CUTOVER - 10),)
    expected_entry = partition_data(
        version, 0, records=below, high_watermark=CUTOVER, last_stable_offset=CUTOVER,
        log_start_offset=3, aborted_transactions=kept, preferred_read_replica=-1,
        **tags(version),
    )  # fmt: skip
    assert decode(RESPONSES[version], merged) == answer(
        version, [("t", [expected_entry, passthrough])], endpoints=endpoints(version)
    )
    assert beyond.counts == {"fetch": 1}


@pytest.mark.parametrize("version", VERSIONS)
def test_an_answer_ending_at_the_cutover_is_kafkas_byte_for_byte(version):
    entry = partition_data(
        version, 0, records=at(30, 10), high_watermark=CUTOVER, last_stable_offset=CUTOVER,
        log_start_offset=0, aborted_transactions=None,
    )  # fmt: skip
    body = encode(answer(version, [("t", [entry])]))
    layout = answer_layout(version)
    start = body.index(struct.pack(">ih", 0, 0) + struct.pack(">q", CUTOVER))
    end = len(body) - (2 if version >= 12 else 0)  # the topic's and the top-level tags
    assert clamp_partition_answer(layout, memoryview(body)[start:end], CUTOVER) is None
    view = read_fetch_request(version, encode(request(version, {"t": [(0, 30, 1, 1 << 20)]})))
    beyond = BeyondCutover()
    merged = _plan(view, {(key(version, "t"), 0): ("t", CUTOVER)}, beyond).merge(
        version, memoryview(body), {}
    )
    assert merged == body
    assert beyond.counts == {}


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_errors_and_null_records_keep_their_shape(version):
    # OFFSET_OUT_OF_RANGE with a high watermark past the cutover, null records, no
    # aborted transactions (null)
    entry = partition_data(
        version, 0, ErrorCode.offset_out_of_range, records=None, high_watermark=CUTOVER + 3,
        last_stable_offset=CUTOVER + 3, log_start_offset=0, aborted_transactions=None,
    )  # fmt: skip
    body = encode(answer(version, [("t", [entry])]))
    view = read_fetch_request(version, encode(request(version, {"t": [(0, 0, 1, 1 << 20)]})))
    merged = _plan(view, {(key(version, "t"), 0): ("t", CUTOVER)}, BeyondCutover()).merge(
        version, memoryview(body), {}
    )
    expected = partition_data(
        version, 0, ErrorCode.offset_out_of_range, records=None, high_watermark=CUTOVER,
        last_stable_offset=CUTOVER, log_start_offset=0, aborted_transactions=None,
    )  # fmt: skip
    assert decode(RESPONSES[version], merged) == answer(version, [("t", [expected])])


def test_merge_without_a_clamp_copies_upstream_entries():
    version = 12
    entry = kafka_entry(version, at(CUTOVER - 5, 5) + at(CUTOVER, 1))
    body = encode(answer(version, [("t", [entry])]))
    view = read_fetch_request(version, encode(request(version, {"t": [(0, 35, 1, 1 << 20)]})))
    assert merge_responses(version, view, memoryview(body), {}) == body


def _plan(view, cutovers, beyond) -> FetchPlan:
    loop = asyncio.new_event_loop()
    try:
        return FetchPlan(view, None, loop.create_future(), cutovers=cutovers, beyond=beyond)
    finally:
        loop.close()


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_a_marker_past_the_cutover_is_cut_and_not_noted_kafkas_lso_and_aborted_kept(version):
    # a transaction open at the cutover (first offset 35, carried across) was aborted: its
    # marker is at 40 in Kafka's log; Kafka's LSO for its part is 35 while it was open
    # (kept), and its aborted entry (first offset 35) is kept with the batches below 40
    marker = struct.pack(">q", CUTOVER) + control_batch(6, 0, 0, timestamp=1)[8:]
    below = at(CUTOVER - 5, 5)
    m = mod(RESPONSES, version)
    aborted = (m.AbortedTransaction(producer_id=6, first_offset=CUTOVER - 5),)
    entry = partition_data(
        version, 0, records=below + marker, high_watermark=CUTOVER + 1,
        last_stable_offset=CUTOVER - 5, log_start_offset=0, aborted_transactions=aborted,
        preferred_read_replica=-1,
    )  # fmt: skip
    body = encode(answer(version, [("t", [entry])]))
    view = read_fetch_request(version, encode(request(version, {"t": [(0, 35, 1, 1 << 20)]})))
    beyond = BeyondCutover()
    merged = _plan(view, {(key(version, "t"), 0): ("t", CUTOVER)}, beyond).merge(
        version, memoryview(body), {}
    )
    expected = partition_data(
        version, 0, records=below, high_watermark=CUTOVER, last_stable_offset=CUTOVER - 5,
        log_start_offset=0, aborted_transactions=aborted, preferred_read_replica=-1,
    )  # fmt: skip
    assert decode(RESPONSES[version], merged) == answer(version, [("t", [expected])])
    assert beyond.counts == {}
    assert data_past(memoryview(marker + at(CUTOVER + 1, 2)), 0)  # records after the marker
    assert not data_past(memoryview(marker + marker[:22]), 0)  # too short to tell: not data
