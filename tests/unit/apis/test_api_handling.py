"""The one table of what the proxy does per Kafka API (`proxy.apis.HANDLING`)."""

from __future__ import annotations

from proxy.apis import (
    HANDLING,
    NODE_ENDPOINTS_SINCE,
    RESPONSE_REWRITERS,
    TIERED_API_KEYS,
    Tiered,
)
from proxy.kafka.versions import APIS
from proxy.tiered.planners import PLANNERS


def test_every_tiered_api_has_a_planner_and_no_other_does():
    assert set(PLANNERS) == set(TIERED_API_KEYS) == {0, 1, 2, 20, 21, 22, 23, 24, 33, 44, 61}
    after = {20, 22, 24, 33, 44}
    assert {HANDLING[key].tiered for key in after} == {Tiered.AFTER_UPSTREAM}
    assert {HANDLING[key].tiered for key in TIERED_API_KEYS - after} == {Tiered.SPLIT}


def test_names_and_keys_agree_with_kafkas_table():
    for key, handling in HANDLING.items():
        assert handling.key == key
        assert handling.name == APIS[key].name


def test_answers_are_rewritten_from_the_node_endpoints_version():
    assert NODE_ENDPOINTS_SINCE == {0: 10, 1: 16}
    assert not HANDLING[0].rewrites(9) and HANDLING[0].rewrites(10)
    assert not HANDLING[1].rewrites(15) and HANDLING[1].rewrites(16)
    assert HANDLING[3].rewrites(0)  # Metadata names brokers in every version
    assert not HANDLING[2].rewrites(10)  # ListOffsets names none
    assert set(RESPONSE_REWRITERS) == {k for k, h in HANDLING.items() if h.rewrite}


def test_only_fetch_answers_are_walked_as_they_stream():
    assert [key for key, h in HANDLING.items() if h.walks_large_answers] == [1]
