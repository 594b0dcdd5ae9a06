"""OffsetForLeaderEpoch answers where a tiered partition's end is not known: the entry
becomes an error (NOT_LEADER_OR_FOLLOWER, epoch and end -1) instead of Kafka's end
offset, which for the latest epoch is the cutover, below what consumers have read."""

from __future__ import annotations

import asyncio

import pytest
from test_offset_for_leader_epoch import RESPONSES, VERSIONS, response

from proxy.apis.api23_offset_for_leader_epoch import EpochError, rewrite_end_offsets
from proxy.kafka.codec import decode, encode
from proxy.tiered.epochs import EpochsPlan


@pytest.mark.parametrize("version", VERSIONS)
def test_rewrite_answers_an_error_where_asked(version):
    body = encode(response(version, {"a": [(0, 0, 2, 100), (0, 1, 2, 100)], "b": [(0, 7, 2, 9)]}))

    def new_end(topic, partition, epoch, end):
        return EpochError(6) if (topic, partition) == ("a", 1) else 250

    assert decode(RESPONSES[version], bytes(rewrite_end_offsets(version, body, new_end))) == (
        response(version, {"a": [(0, 0, 2, 250), (6, 1, -1, -1)], "b": [(0, 7, 2, 250)]})
    )


def _plan(cutovers: dict) -> EpochsPlan:
    loop = asyncio.new_event_loop()
    try:
        return EpochsPlan((), loop.create_future(), cutovers)
    finally:
        loop.close()


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_where_the_owner_did_not_answer(version):
    # Kafka's log ends at the cutover (40) in the latest epoch 2; epoch 1 ended at 30
    kafka = encode(response(version, {"t": [(0, 0, 2, 40), (0, 1, 2, 40), (0, 2, 1, 30)]}))
    plan = _plan({("t", 0): 40, ("t", 1): 40, ("t", 2): 40})
    local = {("t", 0): (40, 95), ("t", 1): (40, None), ("t", 2): (40, None)}
    merged = plan.merge(version, memoryview(kafka), local)
    assert decode(RESPONSES[version], merged) == response(
        version, {"t": [(0, 0, 2, 95), (6, 1, -1, -1), (0, 2, 1, 30)]}
    )
    # the owner's answers never came (the local part failed): none of the latest epoch
    failed = plan.merge(version, memoryview(kafka), plan.failed(RuntimeError("gone")))
    assert decode(RESPONSES[version], failed) == response(
        version, {"t": [(6, 0, -1, -1), (6, 1, -1, -1), (0, 2, 1, 30)]}
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_merge_cuts_an_end_past_the_cutover(version):
    # Kafka's log of t-0 and t-1 goes on past the cutover 40 (an ABORT marker at 40, records
    # a producer wrote to a broker directly): its end is not the partition's. The stream's
    # high watermark is answered: 40 when nothing was produced through the proxy since the
    # cutover (never Kafka's 41), 95 when it was; an epoch ending below stays Kafka's.
    kafka = encode(response(version, {"t": [(0, 0, 2, 41), (0, 1, 2, 47), (0, 2, 1, 30)]}))
    plan = _plan({("t", 0): 40, ("t", 1): 40, ("t", 2): 40})
    local = {("t", 0): (40, 40), ("t", 1): (40, 95), ("t", 2): (40, 95)}
    merged = plan.merge(version, memoryview(kafka), local)
    assert decode(RESPONSES[version], merged) == response(
        version, {"t": [(0, 0, 2, 40), (0, 1, 2, 95), (0, 2, 1, 30)]}
    )
    # not noted (beyond_cutover): a marker cannot be told from records in this answer
