"""The cutover loop's judgement of Kafka's answer about the tiered topics
(proxy/upkeep/topic_checks.py): which grew, which were deleted, and that a deletion is
judged only from the Kafka cluster the topic was tiered in, a few topics per look."""

from __future__ import annotations

import uuid
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from proxy.apis.api03_metadata import TopicsAnswer
from proxy.metadata.topic_index import TieredTopic
from proxy.upkeep.topic_checks import check_topics

HERE = "MkU3OEVBNTcwNTJENDM2Qk"  # the cluster the topics were tiered in
COPY = "c2Vjb25kLWNsdXN0ZXItaWQ"  # another cluster (a disaster-recovery copy)
ORDERS = TieredTopic(uuid.uuid4(), "orders", 1, HERE)
PAYMENTS = TieredTopic(uuid.uuid4(), "payments", 1, HERE)
TIERED = [ORDERS, PAYMENTS]
COUNTS = {ORDERS.topic_id: 3, PAYMENTS.topic_id: 2}

Found = dict[str, tuple[uuid.UUID, int] | None]


def answer(found: Found, cluster: str | None = HERE) -> TopicsAnswer:
    """Kafka's answer: name -> (id, count), None for no such topic; absent: an error."""
    return TopicsAnswer(
        cluster,
        {name: got for name, got in found.items() if got is not None},
        frozenset(name for name, got in found.items() if got is None),
        {},
    )


def test_more_partitions_under_the_same_id_grow_the_count_fewer_or_unknown_ones_do_not():
    found: Found = {"orders": (ORDERS.topic_id, 6), "payments": (PAYMENTS.topic_id, 1)}
    check = check_topics(TIERED, answer(found), COUNTS, frozenset())
    assert check.grown == {ORDERS.topic_id: 6}
    assert check.deleted == () and check.unknown == frozenset() and check.stamp == ()
    # a count not known yet (the topic's first cutover reads it) is not judged
    assert check_topics(TIERED, answer(found), {}, frozenset()).grown == {}


def test_another_id_under_the_name_is_a_deletion_at_once():
    found: Found = {"orders": (uuid.uuid4(), 3), "payments": (PAYMENTS.topic_id, 2)}
    check = check_topics(TIERED, answer(found), COUNTS, frozenset())
    assert check.deleted == (ORDERS,) and check.grown == {}


def test_no_such_topic_is_a_deletion_only_the_second_time_in_a_row():
    gone: Found = {"orders": None, "payments": (PAYMENTS.topic_id, 2)}
    first = check_topics(TIERED, answer(gone), COUNTS, frozenset())
    assert first.deleted == () and first.unknown == {ORDERS.topic_id}
    second = check_topics(TIERED, answer(gone), COUNTS, first.unknown)
    assert second.deleted == (ORDERS,)
    # known again in between (a broker behind had not applied it): starts over
    back = check_topics(TIERED, answer({"orders": (ORDERS.topic_id, 3)}), COUNTS, first.unknown)
    assert back.unknown == frozenset()
    assert check_topics(TIERED, answer(gone), COUNTS, back.unknown).deleted == ()


def test_another_error_says_nothing_and_starts_a_run_of_unknowns_over():
    first = check_topics(TIERED, answer({"orders": None}), COUNTS, frozenset())
    silent = check_topics(TIERED, answer({}), COUNTS, first.unknown)
    assert silent.deleted == () and silent.grown == {} and silent.unknown == frozenset()


def test_another_clusters_answer_judges_no_topic_deleted():
    # a fleet pointed at a copy of its cluster: the same names under other ids, or none
    copy: Found = {"orders": (uuid.uuid4(), 3), "payments": None}
    unknown = frozenset({PAYMENTS.topic_id})
    check = check_topics(TIERED, answer(copy, COPY), COUNTS, unknown)
    assert check.deleted == () and check.held == () and check.unknown == frozenset()
    assert check.foreign == (ORDERS, PAYMENTS)
    # nor an answer that names no cluster
    assert check_topics(TIERED, answer(copy, None), COUNTS, unknown).deleted == ()
    # the same answer from the topics' own cluster
    assert check_topics(TIERED, answer(copy), COUNTS, unknown).deleted == (ORDERS, PAYMENTS)


def test_a_topic_tiered_before_records_named_a_cluster_is_stamped_by_its_own_id():
    old = replace(ORDERS, kafka_cluster=None)
    check = check_topics(
        [old, PAYMENTS], answer({"orders": (old.topic_id, 3)}), COUNTS, frozenset()
    )
    assert check.stamp == (old,) and check.deleted == ()
    # its own id from a cluster that names none proves nothing to record
    assert (
        check_topics([old], answer({"orders": (old.topic_id, 3)}, None), {}, frozenset()).stamp
        == ()
    )


def test_an_unstamped_topic_is_judged_deleted_only_when_every_named_topic_names_that_cluster():
    old = replace(ORDERS, kafka_cluster=None)
    gone: Found = {"orders": (uuid.uuid4(), 3), "payments": (PAYMENTS.topic_id, 2)}
    assert check_topics([old, PAYMENTS], answer(gone), COUNTS, frozenset()).deleted == (old,)
    assert check_topics([old, PAYMENTS], answer(gone, COPY), COUNTS, frozenset()).deleted == ()
    # records naming two clusters: which one the unstamped topic is of is not known
    other = replace(PAYMENTS, kafka_cluster=COPY)
    assert check_topics([old, other], answer(gone), COUNTS, frozenset()).deleted == ()
    # nor with no named topic at all: nothing proves the cluster
    assert check_topics([old], answer(gone), COUNTS, frozenset()).deleted == ()


def test_a_look_judges_at_most_a_few_topics_deleted_and_holds_the_rest():
    topics = [TieredTopic(uuid.uuid4(), f"t{i}", 1, HERE) for i in range(6)]
    others: Found = {t.name: (uuid.uuid4(), 1) for t in topics}
    check = check_topics(topics, answer(others), {}, frozenset(), most=4)
    assert check.deleted == tuple(topics[:4]) and check.held == tuple(topics[4:])
    # the next look (the first four marked, gone from the tiered topics) takes the rest
    after = check_topics(topics[4:], answer(others), {}, frozenset(), most=4)
    assert after.deleted == tuple(topics[4:]) and after.held == ()


ANSWERS = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from([ORDERS.topic_id, PAYMENTS.topic_id, uuid.UUID(int=7)]), st.integers(1, 8)
    ),  # fmt: skip
)
CLUSTERS = st.sampled_from([HERE, COPY, None])


@given(
    st.dictionaries(st.sampled_from(["orders", "payments"]), ANSWERS),
    st.frozensets(st.sampled_from([ORDERS.topic_id, PAYMENTS.topic_id])),
    CLUSTERS,
    st.tuples(CLUSTERS, CLUSTERS),
    st.integers(0, 2),
)
def test_a_topic_is_deleted_only_by_its_own_clusters_answer_and_never_with_its_own_id(
    found, unknown_before, cluster, recorded, most
):
    tiered = [
        replace(ORDERS, kafka_cluster=recorded[0]),
        replace(PAYMENTS, kafka_cluster=recorded[1]),
    ]
    check = check_topics(tiered, answer(found, cluster), COUNTS, unknown_before, most)
    judged = check.deleted + check.held
    assert len(check.deleted) <= most
    named = {t.kafka_cluster for t in tiered} - {None}
    for topic in judged:
        got = found[topic.name]
        assert (got is None and topic.topic_id in unknown_before) or (
            got is not None and got[0] != topic.topic_id
        )
        assert cluster is not None
        assert topic.kafka_cluster == cluster or (
            topic.kafka_cluster is None and named == {cluster}
        )
    for topic_id, count in check.grown.items():
        assert count > COUNTS[topic_id]
        assert topic_id not in {t.topic_id for t in judged}
