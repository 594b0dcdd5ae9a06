import dataclasses
import datetime
import struct
import uuid

import pytest
from kio.schema.describe_cluster.v1 import response as dc1
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v15 import response as f15
from kio.schema.fetch.v16 import response as f16
from kio.schema.find_coordinator.v0 import response as fc0
from kio.schema.find_coordinator.v3 import response as fc3
from kio.schema.find_coordinator.v4 import response as fc4
from kio.schema.metadata.v0 import response as m0
from kio.schema.metadata.v12 import response as m12
from kio.schema.produce.v9 import response as p9
from kio.schema.produce.v10 import response as p10
from kio.static.primitive import Records

from proxy.apis import CAPPED_VERSIONS, RESPONSE_REWRITERS, max_version_without_node_endpoints
from proxy.kafka.codec import decode, encode
from proxy.kafka.frames import FrameError
from proxy.kafka.schema_walk import tagged_fields_offset

NO_TIME = datetime.timedelta(0)


class Advertise:
    """Maps broker N to proxy:19000+N and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, int]] = []

    def __call__(self, node_id: int, host: str, port: int) -> tuple[str, int]:
        self.calls.append((node_id, host, port))
        return "proxy.zone-a", 19000 + node_id


def rewrite(api_key: int, api_version: int, value, advertise=None):
    advertise = advertise or Advertise()
    body = memoryview(encode(value))
    out = RESPONSE_REWRITERS[api_key](api_version, body, advertise)
    return out, body, advertise


def test_registered_rewriters():
    assert sorted(RESPONSE_REWRITERS) == [0, 1, 3, 10, 60]


def test_metadata_v0_brokers_are_advertised():
    answer = m0.MetadataResponse(
        brokers=(
            m0.MetadataResponseBroker(node_id=1, host="b1.internal", port=9092),
            m0.MetadataResponseBroker(node_id=2, host="b2.internal", port=9093),
        ),
        topics=(
            m0.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name="t",
                partitions=(
                    m0.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=0,
                        leader_id=1,
                        replica_nodes=(1, 2),
                        isr_nodes=(1, 2),
                    ),
                ),
            ),
        ),
    )
    out, _, advertise = rewrite(3, 0, answer)
    got = decode(m0.MetadataResponse, out)
    assert [(b.node_id, b.host, b.port) for b in got.brokers] == [
        (1, "proxy.zone-a", 19001),
        (2, "proxy.zone-a", 19002),
    ]
    assert got.topics == answer.topics
    assert advertise.calls == [(1, "b1.internal", 9092), (2, "b2.internal", 9093)]


def test_metadata_v12_keeps_everything_but_addresses():
    answer = m12.MetadataResponse(
        throttle_time=datetime.timedelta(milliseconds=7),
        brokers=(m12.MetadataResponseBroker(node_id=0, host="b0", port=9092, rack="zone-b"),),
        cluster_id="cluster",
        controller_id=0,
        topics=(),
    )
    out, _, _ = rewrite(3, 12, answer)
    got = decode(m12.MetadataResponse, out)
    assert got.brokers[0] == m12.MetadataResponseBroker(
        node_id=0, host="proxy.zone-a", port=19000, rack="zone-b"
    )
    assert (got.throttle_time, got.cluster_id, got.controller_id) == (
        answer.throttle_time,
        "cluster",
        0,
    )


def test_find_coordinator_v0_found():
    answer = fc0.FindCoordinatorResponse(
        error_code=ErrorCode.none, node_id=2, host="b2.internal", port=9092
    )
    out, _, _ = rewrite(10, 0, answer)
    got = decode(fc0.FindCoordinatorResponse, out)
    assert (got.node_id, got.host, got.port) == (2, "proxy.zone-a", 19002)


def test_find_coordinator_v3_not_found_is_left_alone():
    answer = fc3.FindCoordinatorResponse(
        throttle_time=NO_TIME,
        error_code=ErrorCode.coordinator_not_available,
        error_message="The coordinator is not available.",
        node_id=-1,
        host="",
        port=-1,
    )
    out, body, advertise = rewrite(10, 3, answer)
    assert out is body
    assert advertise.calls == []


def test_find_coordinator_v4_batch_with_an_error_entry():
    found = fc4.Coordinator(
        key="group-a",
        node_id=3,
        host="b3.internal",
        port=9092,
        error_code=ErrorCode.none,
        error_message=None,
    )
    missing = fc4.Coordinator(
        key="group-b",
        node_id=-1,
        host="",
        port=-1,
        error_code=ErrorCode.coordinator_not_available,
        error_message=None,
    )
    answer = fc4.FindCoordinatorResponse(throttle_time=NO_TIME, coordinators=(found, missing))
    out, _, advertise = rewrite(10, 4, answer)
    got = decode(fc4.FindCoordinatorResponse, out)
    assert got.coordinators[0] == fc4.Coordinator(
        key="group-a",
        node_id=3,
        host="proxy.zone-a",
        port=19003,
        error_code=ErrorCode.none,
        error_message=None,
    )
    assert got.coordinators[1] == missing
    assert advertise.calls == [(3, "b3.internal", 9092)]


def describe_cluster(endpoint_type: int) -> dc1.DescribeClusterResponse:
    return dc1.DescribeClusterResponse(
        throttle_time=NO_TIME,
        error_code=ErrorCode.none,
        endpoint_type=endpoint_type,
        cluster_id="cluster",
        controller_id=1,
        brokers=(dc1.DescribeClusterBroker(broker_id=1, host="b1", port=9092, rack="zone-a"),),
    )


def test_describe_cluster_brokers_are_advertised():
    out, _, _ = rewrite(60, 1, describe_cluster(endpoint_type=1))
    got = decode(dc1.DescribeClusterResponse, out)
    assert got.brokers == (
        dc1.DescribeClusterBroker(broker_id=1, host="proxy.zone-a", port=19001, rack="zone-a"),
    )


def test_describe_cluster_controllers_are_not_shown():
    out, _, advertise = rewrite(60, 1, describe_cluster(endpoint_type=2))
    assert decode(dc1.DescribeClusterResponse, out).brokers == ()
    assert advertise.calls == []


def produce_answer(module, **node_endpoints):
    return module.ProduceResponse(
        responses=(
            module.TopicProduceResponse(
                name="t",
                partition_responses=(
                    module.PartitionProduceResponse(
                        index=0,
                        error_code=ErrorCode.not_leader_or_follower,
                        base_offset=-1,
                        record_errors=(),
                    ),
                ),
            ),
        ),
        throttle_time=NO_TIME,
        **node_endpoints,
    )


def test_produce_before_v10_is_returned_as_it_came():
    out, body, _ = rewrite(0, 9, produce_answer(p9))
    assert out is body


def test_produce_v10_without_node_endpoints_is_returned_as_it_came():
    out, body, _ = rewrite(0, 10, produce_answer(p10))
    assert out is body


def test_produce_v10_node_endpoints_are_advertised():
    answer = produce_answer(
        p10, node_endpoints=(p10.NodeEndpoint(node_id=4, host="b4", port=9092, rack="r"),)
    )
    out, _, advertise = rewrite(0, 10, answer)
    got = decode(p10.ProduceResponse, out)
    assert got.node_endpoints == (
        p10.NodeEndpoint(node_id=4, host="proxy.zone-a", port=19004, rack="r"),
    )
    assert got.responses == answer.responses
    assert advertise.calls == [(4, "b4", 9092)]


def fetch_answer(module, **node_endpoints):
    partition = module.PartitionData(
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=10,
        aborted_transactions=None,
        records=Records(b"\x00" * 61 + b"batch bytes"),
    )
    return module.FetchResponse(
        throttle_time=NO_TIME,
        error_code=ErrorCode.none,
        responses=(module.FetchableTopicResponse(topic_id=uuid.uuid4(), partitions=(partition,)),),
        **node_endpoints,
    )


def test_fetch_before_v16_is_returned_as_it_came():
    out, body, _ = rewrite(1, 15, fetch_answer(f15))
    assert out is body


def test_fetch_v16_node_endpoints_are_advertised_and_records_kept():
    answer = fetch_answer(f16, node_endpoints=(f16.NodeEndpoint(node_id=1, host="b1", port=1),))
    out, _, _ = rewrite(1, 16, answer)
    got = decode(f16.FetchResponse, out)
    assert got.node_endpoints == (f16.NodeEndpoint(node_id=1, host="proxy.zone-a", port=19001),)
    assert got.responses == answer.responses


def test_fetch_v16_without_node_endpoints_is_returned_as_it_came():
    out, body, _ = rewrite(1, 16, fetch_answer(f16))
    assert out is body


@pytest.mark.parametrize(("api_key", "api_version"), [(3, 12), (10, 0), (10, 4), (60, 1), (1, 16)])
def test_truncated_bodies_raise_frame_error(api_key, api_version):
    with pytest.raises(FrameError, match="malformed|truncated|bytes after"):
        RESPONSE_REWRITERS[api_key](api_version, memoryview(b"\x00\x00\x00"), Advertise())


def test_fetch_with_bytes_after_its_tagged_fields():
    body = encode(fetch_answer(f16)) + b"\x00"
    with pytest.raises(FrameError, match="1 bytes after the tagged fields"):
        RESPONSE_REWRITERS[1](16, memoryview(body), Advertise())


def test_unknown_version_raises_frame_error():
    with pytest.raises(FrameError, match=r"^unsupported version 99 of Metadata \(api key 3\)$"):
        RESPONSE_REWRITERS[3](99, memoryview(b""), Advertise())


def test_caps_are_the_versions_before_node_endpoints():
    assert CAPPED_VERSIONS == {0: 9, 1: 15}
    assert max_version_without_node_endpoints(1) == 15
    assert max_version_without_node_endpoints(3) is None


def compact(text: str) -> bytes:
    return bytes([len(text) + 1]) + text.encode()


def test_metadata_broker_with_a_tag_unknown_to_kio_keeps_it():
    # A newer broker may add tagged fields to a version kio knows; they must pass through.
    def body(host: str, port: int) -> bytes:
        broker = struct.pack(">i", 1) + compact(host) + struct.pack(">i", port) + b"\x00"
        broker += b"\x01\x07\x02xy"  # tag section: one field, tag 7, 2 bytes
        return (
            struct.pack(">i", 0)  # throttle_time_ms
            + b"\x02"  # brokers: one
            + broker
            + b"\x00"  # cluster_id: null
            + struct.pack(">i", 1)  # controller_id
            + b"\x01"  # topics: none
            + b"\x00"  # no tagged fields
        )

    upstream = body("b1.internal", 9092)
    with pytest.raises(FrameError, match="malformed MetadataResponse v12"):
        decode(m12.MetadataResponse, upstream)  # kio refuses the unknown tag
    out = RESPONSE_REWRITERS[3](12, memoryview(upstream), Advertise())
    assert bytes(out) == body("proxy.zone-a", 19001)


def test_fetch_v16_unknown_top_level_tag_is_kept_next_to_node_endpoints():
    def with_unknown_tag(answer) -> bytes:
        encoded = encode(answer)  # its tag section: count 1, then tag 0 (node_endpoints)
        start = tagged_fields_offset(f16.FetchResponse, memoryview(encoded))
        assert encoded[start] == 1
        return encoded[:start] + b"\x02" + encoded[start + 1 :] + b"\x05\x01z"  # + tag 5

    upstream = fetch_answer(f16, node_endpoints=(f16.NodeEndpoint(node_id=1, host="b1", port=1),))
    shown = dataclasses.replace(
        upstream, node_endpoints=(f16.NodeEndpoint(node_id=1, host="proxy.zone-a", port=19001),)
    )
    out = RESPONSE_REWRITERS[1](16, memoryview(with_unknown_tag(upstream)), Advertise())
    assert bytes(out) == with_unknown_tag(shown)


def test_describe_cluster_with_an_error_code_unknown_to_kio_is_still_rewritten():
    encoded = encode(describe_cluster(endpoint_type=1))
    upstream = encoded[:4] + struct.pack(">h", 9999) + encoded[6:]  # after throttle_time_ms
    out = bytes(RESPONSE_REWRITERS[60](1, memoryview(upstream), Advertise()))
    assert out[4:6] == struct.pack(">h", 9999)
    fixed = out[:4] + encoded[4:6] + out[6:]
    assert decode(dc1.DescribeClusterResponse, fixed).brokers[0].host == "proxy.zone-a"


def produce_answers(module, topic_ids: bool):
    """Produce answers of one version in the shapes the quick check must tell apart:
    (answer, whether its top-level tagged fields are empty)."""

    def partition(index, **fields):
        fields = {"record_errors": ()} | fields
        return module.PartitionProduceResponse(
            index=index, error_code=ErrorCode.none, base_offset=100 + index, **fields
        )

    def topic(n, partitions):
        key = {"topic_id": uuid.UUID(int=n + 1)} if topic_ids else {"name": f"topic-{n}" * n}
        return module.TopicProduceResponse(partition_responses=tuple(partitions), **key)

    plain = [topic(n, [partition(i) for i in range(n + 1)]) for n in range(3)]
    error = module.BatchIndexAndErrorMessage(batch_index=0, batch_index_error_message="bad")
    endpoint = module.NodeEndpoint(node_id=4, host="b4", port=9092, rack=None)
    shapes = [
        (module.ProduceResponse(responses=(), throttle_time=NO_TIME), True),
        (module.ProduceResponse(responses=tuple(plain), throttle_time=NO_TIME), True),
        (module.ProduceResponse(responses=(topic(0, []),), throttle_time=NO_TIME), True),
        (
            module.ProduceResponse(
                responses=tuple(plain), throttle_time=NO_TIME, node_endpoints=(endpoint,)
            ),
            False,
        ),
        (
            module.ProduceResponse(
                responses=(topic(1, [partition(0, record_errors=(error,))]),),
                throttle_time=NO_TIME,
            ),
            True,
        ),
        (
            module.ProduceResponse(
                responses=(topic(1, [partition(0, error_message="no")]),), throttle_time=NO_TIME
            ),
            True,
        ),
        (
            module.ProduceResponse(
                responses=(
                    topic(
                        2,
                        [
                            partition(
                                0,
                                current_leader=module.LeaderIdAndEpoch(leader_id=4, leader_epoch=7),
                            )
                        ],
                    ),
                ),
                throttle_time=NO_TIME,
                node_endpoints=(endpoint,),
            ),
            False,
        ),
    ]
    return shapes


@pytest.mark.parametrize("version", [10, 11, 12, 13])
def test_produce_quick_check_agrees_with_the_schema_walk(version):
    """The quick check (api00_produce._no_top_level_tags) passes an answer on as it came
    only when the schema walk finds no top-level tagged field; whatever it is unsure of
    goes to the walk, which rewrites the endpoints and refuses a truncated answer."""
    import importlib

    from proxy.apis import api00_produce

    module = importlib.import_module(f"kio.schema.produce.v{version}.response")
    quick_passes = 0
    for answer, no_tags in produce_answers(module, topic_ids=version >= 13):
        body = memoryview(encode(answer))
        start = tagged_fields_offset(type(answer), body)
        assert (bytes(body[start:]) == b"\x00") == no_tags
        quick = api00_produce._no_top_level_tags(version, body)
        assert not quick or no_tags  # never says "none" when there are some
        quick_passes += quick
        out = RESPONSE_REWRITERS[0](version, body, Advertise())
        if no_tags:
            assert out is body or bytes(out) == bytes(body)
        else:
            assert decode(type(answer), out).node_endpoints[0].host == "proxy.zone-a"
        for cut in range(len(body)):  # a truncated answer: never passed as it came
            assert not api00_produce._no_top_level_tags(version, body[:cut])
        with pytest.raises(FrameError):
            RESPONSE_REWRITERS[0](version, body[: len(body) - 1], Advertise())
    assert quick_passes >= 3  # the usual answers take the quick way
