"""Session fixtures released after their last user (tests/support/release.py)."""

from __future__ import annotations

from tests.support.release import RELEASED_EARLY, release_plan


def test_each_fixture_goes_after_its_last_user():
    items = [
        ("a::one", {"conformance", "conformance_fleet", "kafka_cluster"}),
        ("a::two", {"conformance_fleet", "kafka_cluster"}),
        ("b::one", {"spark", "kafka_cluster"}),
        ("c::one", {"secured_cluster"}),
        ("d::one", {"spark"}),
        ("e::last", {"kafka_cluster"}),
    ]
    assert release_plan(items) == {
        "a::one": ["conformance"],
        "a::two": ["conformance_fleet"],
        "c::one": ["secured_cluster"],
        "d::one": ["spark"],
    }


def test_the_last_test_and_unlisted_fixtures_release_nothing():
    items = [("a::one", {"kafka_cluster", "s3_server"}), ("a::two", {"spark_cluster"})]
    assert release_plan(items) == {}
    assert {"kafka_cluster", "s3_server"}.isdisjoint(RELEASED_EARLY)


def test_no_tests_no_plan():
    assert release_plan([]) == {}
