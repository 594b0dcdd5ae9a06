"""The cutover loop's judgement of Kafka's answer about the tiered topics
(proxy/upkeep/topic_checks.py): which grew, which were deleted."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from proxy.metadata.topic_index import TieredTopic
from proxy.upkeep.topic_checks import check_topics

ORDERS = TieredTopic(uuid.uuid4(), "orders", 1)
PAYMENTS = TieredTopic(uuid.uuid4(), "payments", 1)
TIERED = [ORDERS, PAYMENTS]
COUNTS = {ORDERS.topic_id: 3, PAYMENTS.topic_id: 2}


def test_more_partitions_under_the_same_id_grow_the_count_fewer_or_unknown_ones_do_not():
    found = {"orders": (ORDERS.topic_id, 6), "payments": (PAYMENTS.topic_id, 1)}
    check = check_topics(TIERED, found, COUNTS, frozenset())
    assert check.grown == {ORDERS.topic_id: 6}
    assert check.deleted == () and check.unknown == frozenset()
    # a count not known yet (the topic's first cutover reads it) is not judged
    assert check_topics(TIERED, found, {}, frozenset()).grown == {}


def test_another_id_under_the_name_is_a_deletion_at_once():
    found = {"orders": (uuid.uuid4(), 3), "payments": (PAYMENTS.topic_id, 2)}
    check = check_topics(TIERED, found, COUNTS, frozenset())
    assert check.deleted == (ORDERS,) and check.grown == {}


def test_no_such_topic_is_a_deletion_only_the_second_time_in_a_row():
    gone = {"orders": None, "payments": (PAYMENTS.topic_id, 2)}
    first = check_topics(TIERED, gone, COUNTS, frozenset())
    assert first.deleted == () and first.unknown == {ORDERS.topic_id}
    second = check_topics(TIERED, gone, COUNTS, first.unknown)
    assert second.deleted == (ORDERS,)
    # known again in between (a broker behind had not applied it): starts over
    back = check_topics(TIERED, {"orders": (ORDERS.topic_id, 3)}, COUNTS, first.unknown)
    assert back.unknown == frozenset()
    assert check_topics(TIERED, gone, COUNTS, back.unknown).deleted == ()


def test_another_error_says_nothing_and_does_not_break_a_run_of_unknowns():
    first = check_topics(TIERED, {"orders": None}, COUNTS, frozenset())
    silent = check_topics(TIERED, {}, COUNTS, first.unknown)
    assert silent.deleted == () and silent.grown == {} and silent.unknown == frozenset()


ANSWERS = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from([ORDERS.topic_id, PAYMENTS.topic_id, uuid.UUID(int=7)]), st.integers(1, 8)
    ),  # fmt: skip
)


@given(
    st.dictionaries(st.sampled_from(["orders", "payments"]), ANSWERS),
    st.frozensets(st.sampled_from([ORDERS.topic_id, PAYMENTS.topic_id])),
)
def test_a_topic_kafka_answers_its_own_id_for_is_never_deleted(found, unknown_before):
    check = check_topics(TIERED, found, COUNTS, unknown_before)
    for topic in check.deleted:
        answer = found[topic.name]
        assert (
            answer is None
            and topic.topic_id in unknown_before
            or (answer is not None and answer[0] != topic.topic_id)
        )
    for topic_id, count in check.grown.items():
        assert count > COUNTS[topic_id]
        assert topic_id not in {t.topic_id for t in check.deleted}
