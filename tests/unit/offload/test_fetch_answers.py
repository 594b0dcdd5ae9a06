"""What the cluster reader reads from Kafka's answers, with answers kio encodes: every
partition of a Fetch answer (errors, offsets, aborted transactions, records as views), and
the leaders of a Metadata answer's partitions."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as metadata

from proxy.apis.api03_metadata import read_partition_leaders
from proxy.apis.fetch_split import read_fetch_response
from proxy.kafka.codec import encode
from proxy.kafka.frames import FrameError
from tests.unit.protocol.test_fetch_split import VERSIONS, key, upstream_answer, upstream_partitions


@pytest.mark.parametrize("version", VERSIONS)
def test_every_answered_partition_is_read(version):
    body = encode(upstream_answer(version))
    answers = read_fetch_response(version, body)
    expected = upstream_partitions(version)
    stranger = [(key(version, "not asked"), 5), (key(version, "a"), 5)]
    assert set(answers) == {(key(version, t), p) for t, p in expected} | set(stranger)
    for (topic, partition), sent in expected.items():
        got = answers[key(version, topic), partition]
        assert got.partition == partition
        assert got.error_code == sent.error_code.value
        assert got.high_watermark == sent.high_watermark
        assert got.log_start_offset == (sent.log_start_offset if version >= 5 else -1)
        aborted = sent.aborted_transactions or ()
        assert got.aborted_transactions == tuple((a.producer_id, a.first_offset) for a in aborted)
        assert bytes(got.records) == (sent.records or b"")
        assert isinstance(got.records, memoryview), "a view of the answer, not a copy"


def test_a_truncated_answer_is_a_frame_error():
    body = encode(upstream_answer(12))
    with pytest.raises(FrameError, match="malformed Fetch v12 response"):
        read_fetch_response(12, body[:-30])


def _metadata(topics):
    return encode(
        metadata.MetadataResponse(
            throttle_time=metadata.i32Timedelta.parse(datetime.timedelta(0)),
            brokers=(metadata.MetadataResponseBroker(node_id=1, host="h", port=1, rack=None),),
            cluster_id=None,
            controller_id=1,
            topics=topics,
        )
    )


def _topic(name, partitions, error=ErrorCode.none):
    return metadata.MetadataResponseTopic(
        error_code=error, name=name, topic_id=uuid.uuid4(), is_internal=False,
        partitions=tuple(
            metadata.MetadataResponsePartition(
                error_code=code, partition_index=index, leader_id=leader, leader_epoch=epoch,
                replica_nodes=(1, 2, 3), isr_nodes=(1, 2), offline_replicas=(),
            )
            for index, code, leader, epoch in partitions
        ),
        topic_authorized_operations=-2147483648,
    )  # fmt: skip


def test_partition_leaders_of_the_topic_asked_for():
    body = _metadata((
        _topic("other", [(0, ErrorCode.none, 3, 1)]),
        _topic("t", [(1, ErrorCode.none, 2, 7), (0, ErrorCode.leader_not_available, -1, 6)]),
    ))  # fmt: skip
    error, leaders = read_partition_leaders(12, memoryview(body), "t")
    assert error == 0
    assert leaders == {1: (0, 2, 7), 0: (ErrorCode.leader_not_available.value, -1, 6)}
    with pytest.raises(LookupError, match="topic missing is not in the Metadata answer"):
        read_partition_leaders(12, memoryview(body), "missing")
