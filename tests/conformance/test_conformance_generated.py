"""Generated scenarios (issue 15): the same client operations against a passthrough and
a tiered topic through the same fleet must get the same answers, Kafka's. The tiered
topic is tiered before any op, or midway so that reads cross the cutover."""

from __future__ import annotations

import pytest
from compare import assert_conforms
from hypothesis import given
from hypothesis import strategies as st
from strategies import conformance_settings, scenarios

pytestmark = [pytest.mark.kafka, pytest.mark.minio]


@pytest.mark.parametrize("tier", ["before", "midway"])
@conformance_settings(default_examples=6)
@given(data=st.data())
def test_a_tiered_topic_answers_as_kafka_does(conformance, tier, data):
    ops = data.draw(scenarios(tier), label="ops")
    scenario = conformance.run(ops, tag=tier[:3])
    assert_conforms(scenario.rows, scenario.title)
