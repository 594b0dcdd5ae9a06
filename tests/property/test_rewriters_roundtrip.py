"""Each rewriter, on any kio-encoded answer of every version it serves, replaces exactly
the broker addresses: kio reads back the same answer with only hosts and ports mapped.
Also checks, on the same answers, that the schema walker agrees with kio on sizes."""

import dataclasses
from typing import Any, get_args

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.static.primitive import Records

from proxy.apis import (
    RESPONSE_REWRITERS,
    api00_produce,
    api01_fetch,
    api03_metadata,
    api10_find_coordinator,
    api60_describe_cluster,
)
from proxy.kafka.codec import decode, encode
from proxy.kafka.schema_walk import skip_entity

st.register_type_strategy(Records, st.binary(max_size=40).map(Records))

# The field naming brokers, per API: (module, field, id field).
BROKER_FIELDS = {
    0: (api00_produce, "node_endpoints", "node_id"),
    1: (api01_fetch, "node_endpoints", "node_id"),
    3: (api03_metadata, "brokers", "node_id"),
    10: (api10_find_coordinator, "coordinators", "node_id"),  # v4+; v0-v3: top level
    60: (api60_describe_cluster, "brokers", "broker_id"),
}
CASES = [
    (api_key, version)
    for api_key, (module, _, _) in BROKER_FIELDS.items()
    for version in sorted(module.RESPONSES)
]


def advertise_map(node_id: int, host: str, port: int) -> tuple[str, int]:
    return f"proxy-{node_id % 3}.zone-{len(host) % 2}", 20000 + node_id % 30000


def field_type(entity_type: type, name: str) -> Any:
    return entity_type.__dataclass_fields__[name].type


def answers(api_key: int, version: int) -> st.SearchStrategy:
    """Answers of this version whose broker field holds generated brokers."""
    module, name, _ = BROKER_FIELDS[api_key]
    response = module.RESPONSES[version]
    base = st.from_type(response)
    if name not in response.__dataclass_fields__ and api_key != 10:
        return base  # Produce, Fetch before KIP-951: nothing names a broker
    if name not in response.__dataclass_fields__:  # FindCoordinator v0-v3: top level
        not_found = base.map(lambda a: dataclasses.replace(a, node_id=-1, host="", port=-1))
        return base | not_found
    item = get_args(field_type(response, name))[0]
    brokers = st.lists(st.from_type(item), max_size=5).map(tuple)
    answer = st.builds(lambda a, b: dataclasses.replace(a, **{name: b}), base, brokers)
    if "endpoint_type" in response.__dataclass_fields__:  # DescribeCluster v1+
        answer = st.builds(
            lambda a, t: dataclasses.replace(a, endpoint_type=t), answer, st.sampled_from([1, 2])
        )
    return answer


def mapped(items: tuple, id_field: str) -> tuple:
    out = []
    for item in items:
        node_id = getattr(item, id_field)
        if node_id >= 0:
            host, port = advertise_map(node_id, item.host, item.port)
            item = dataclasses.replace(item, host=host, port=port)
        out.append(item)
    return tuple(out)


def expected(api_key: int, answer: Any) -> tuple[Any, list[tuple[int, str, int]]]:
    """The answer with addresses mapped, and the advertise calls that takes."""
    _, name, id_field = BROKER_FIELDS[api_key]
    if not hasattr(answer, name) and api_key != 10:  # Produce, Fetch before KIP-951
        return answer, []
    if not hasattr(answer, name):  # FindCoordinator v0-v3
        items = (answer,)
        want = mapped(items, id_field)[0]
    elif getattr(answer, "endpoint_type", 1) != 1:  # controllers are not shown
        return dataclasses.replace(answer, **{name: ()}), []
    else:
        items = getattr(answer, name)
        want = dataclasses.replace(answer, **{name: mapped(items, id_field)})
    calls = [
        (getattr(item, id_field), item.host, item.port)
        for item in items
        if getattr(item, id_field) >= 0
    ]
    return want, calls


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_rewriter_maps_addresses_and_keeps_the_rest(api_key, version):
    response = BROKER_FIELDS[api_key][0].RESPONSES[version]

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(answers(api_key, version))
    def check(answer):
        body = encode(answer)
        assert skip_entity(response, memoryview(body)) == len(body)
        original = decode(response, body)  # as upstream meant it
        calls = []

        def advertise(node_id, host, port):
            calls.append((node_id, host, port))
            return advertise_map(node_id, host, port)

        out = RESPONSE_REWRITERS[api_key](version, memoryview(body), advertise)
        want, want_calls = expected(api_key, original)
        assert decode(response, bytes(out)) == want
        assert calls == want_calls

    check()
