"""Session fixtures stopped after the last test that uses them, not at the session's end.

pytest tears a session-scoped fixture down only when the session ends, so a component a
few modules need (the conformance fleet: two proxies following the shared Kafka; the
SASL/TLS Kafka; Spark) stays up, and keeps the shared Kafka and the CPU busy, for the
whole shared part after them: the conformance fleet runs first and was idle for about an
hour of every run. In one process the order of the tests is known before the first
runs, so each such fixture is finished right after the teardown of its last user
(tests/conftest.py, `_ReleaseAfterLastUse`); the time it takes counts in that test's
teardown. A test that still asked for one later (`request.getfixturevalue`) would get it
started again, correct only if no longer-lived fixture holds it: none does for these. The
Spark session is stopped, its JVM is not (pyspark keeps the gateway to the process's
end). On xdist workers nothing is released: a worker does not know which tests it will
be given.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

# started on first use, each costing CPU or memory while idle; not the shared Kafka and
# MinIO (nearly every test of the shared part uses them, some through getfixturevalue)
RELEASED_EARLY = frozenset(
    {
        "conformance",
        "conformance_clients",
        "conformance_fleet",
        "secured_cluster",
        "spark",
        "spark_cluster",
    }
)


def release_plan(
    items: Iterable[tuple[str, Collection[str]]], names: Collection[str] = RELEASED_EARLY
) -> dict[str, list[str]]:
    """For tests run in this order ((node id, the fixtures it uses, directly or not)):
    node id -> the fixtures of `names` it is the last user of, sorted. The session's last
    test releases nothing (the session's end does)."""
    last: dict[str, str] = {}
    final = None
    for nodeid, fixtures in items:
        final = nodeid
        for name in names:
            if name in fixtures:
                last[name] = nodeid
    plan: dict[str, list[str]] = {}
    for name, nodeid in sorted(last.items()):
        if nodeid != final:
            plan.setdefault(nodeid, []).append(name)
    return plan
