"""Brokers spread over a zone's proxies: deterministic, bounded, and stable."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.routing.placement import place_brokers

brokers_st = st.sets(st.integers(min_value=0, max_value=5000), min_size=1, max_size=60)
proxies_st = st.sets(
    st.text(alphabet="abcdefghij0123456789.-", min_size=1, max_size=12), min_size=1, max_size=8
)


@settings(max_examples=200, deadline=None)
@given(brokers_st, proxies_st)
def test_every_broker_placed_within_the_bound_whatever_the_order(brokers, proxies):
    placement = place_brokers(brokers, proxies)
    assert set(placement) == brokers
    assert set(placement.values()) <= proxies
    bound = math.ceil(1.25 * len(brokers) / len(proxies))
    loads = [list(placement.values()).count(p) for p in proxies]
    assert max(loads) <= bound
    # the same sets in another order: the same answer (every proxy computes it alone)
    assert place_brokers(sorted(brokers, reverse=True), sorted(proxies, reverse=True)) == placement


@settings(max_examples=200, deadline=None)
@given(brokers_st, proxies_st.filter(lambda p: len(p) >= 2))
def test_losing_a_proxy_moves_only_its_own_brokers_when_loads_are_not_bound(brokers, proxies):
    """Plain rendezvous hashing (a bound no proxy reaches): exactly the brokers of the
    proxy that left move. With a tight bound others may move too, as the bound changes
    with the number of proxies (e.g. 3 brokers over 6 proxies, then over 5)."""
    unbounded = float(len(proxies))  # (1 + e) * brokers / proxies >= brokers: never full
    before = place_brokers(brokers, proxies, epsilon=unbounded)
    gone = sorted(proxies)[0]
    after = place_brokers(brokers, proxies - {gone}, epsilon=unbounded)
    assert gone not in after.values()
    moved = {b for b in brokers if after[b] != before[b]}
    assert moved == {b for b in brokers if before[b] == gone}


def test_spread_over_three_proxies_of_a_zone():
    placement = place_brokers(range(1, 13), ["proxy-a1", "proxy-a2", "proxy-a3"], epsilon=0.0)
    assert sorted(list(placement.values()).count(p) for p in set(placement.values())) == [4, 4, 4]


def test_errors_are_clear():
    assert place_brokers([], ["p"]) == {}
    with pytest.raises(ValueError, match="no live proxy"):
        place_brokers([1], [])
    with pytest.raises(ValueError, match="negative"):
        place_brokers([1], ["p"], epsilon=-0.1)
