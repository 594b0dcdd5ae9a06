"""How the shared part's tests are split over xdist workers (scripts/test.sh runs it with
`--dist loadscope`): which tests must run in one process, and which groups start first.

A group runs whole on one worker, one test after another. By default a group is a test
module (its module-scoped fleet is built once); tests that share something costly beyond
their module form one group: the Spark tests (each worker would start its own Spark, and
two offload tests count every offload object in the shared bucket, which only the Spark
tests write), the conformance tests (one session-scoped fleet and three client runtimes)
and the tests of the SASL/TLS cluster (one session-scoped Kafka).

The controller knows a test only by its node id, so the groups are named by module
(`GROUPS`); each worker checks, from the fixtures its tests use, that no module using one
of `SHARED_FIXTURES` is missing there (`misplaced`). xdist's own `loadgroup` marks cannot
do it: pytest-xdist 3.8 writes the group into `item._nodeid`, which pytest 9 no longer
reads.

Groups are handed out longest first, from the last run's JUnit XML
(.cache/test-times/shared.xml): a worker that begins the fault suite last would keep the
whole run waiting for it. Groups the last run did not time go first, in collection order.
xdist's loadscope hands a worker its next group while two or fewer tests of the current
one are pending, so a group of one long test (the fault suite) takes the next group along
on its worker, where it waits: the other workers may run out of groups first.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

SHARED_FIXTURES = {"spark": "spark", "spark_cluster": "spark", "secured_cluster": "secured-kafka"}
GROUPS = {
    "tests/conformance/": "conformance",
    "tests/integration/harness/test_spark.py": "spark",
    "tests/integration/offload/test_export.py": "spark",
    "tests/integration/offload/test_export_iceberg.py": "spark",
    "tests/integration/offload/test_migrate_compacted.py": "spark",
    "tests/integration/offload/test_migrate_segments.py": "spark",
    "tests/integration/offload/test_report_cli.py": "spark",
    "tests/integration/offload/test_spark_cluster.py": "spark",
    "tests/integration/offload/test_verify.py": "spark",
    "tests/integration/tiering/test_tiered_compacted_spark.py": "spark",
    "tests/integration/proxy/test_sasl.py": "secured-kafka",
    "tests/integration/proxy/test_tls.py": "secured-kafka",
}


def group_of(nodeid: str) -> str:
    """The group of the test `nodeid` (`path/to/test_x.py::test_y[param]`)."""
    module = nodeid.split("::", 1)[0]
    for prefix, group in GROUPS.items():
        if module == prefix or (prefix.endswith("/") and module.startswith(prefix)):
            return group
    return module


def misplaced(tests: Iterable[tuple[str, Iterable[str]]]) -> list[str]:
    """Of (node id, fixtures used) pairs, a line for each module whose tests use a fixture
    of `SHARED_FIXTURES` but which `GROUPS` does not put in that fixture's group."""
    wrong: dict[str, str] = {}
    for nodeid, fixtures in tests:
        for fixture in fixtures:
            wanted = SHARED_FIXTURES.get(fixture)
            if wanted is not None and group_of(nodeid) != wanted:
                module = nodeid.split("::", 1)[0]
                wrong[module] = f"{module}: uses {fixture}, so add it to GROUPS as {wanted!r}"
    return sorted(wrong.values())


def module_times(junit_xml: Path) -> dict[str, float]:
    """Seconds per JUnit classname (the dotted module, or the module and a class) in a
    JUnit XML file; empty when there is none or it cannot be read (a first run, a run cut
    short)."""
    try:
        root = ElementTree.parse(junit_xml).getroot()
    except (OSError, ElementTree.ParseError):
        return {}
    times: dict[str, float] = defaultdict(float)
    for case in root.iter("testcase"):
        times[case.get("classname", "")] += float(case.get("time", 0) or 0)
    return times


def longest_first(nodeids: Sequence[str], times: dict[str, float]) -> list[int]:
    """The order (indexes into `nodeids`) that runs the groups longest first, keeping each
    group's tests in their order. A group's time is the sum of its modules' times."""
    by_module: dict[str, float] = defaultdict(float)
    for classname, seconds in times.items():
        parts = classname.split(".")
        for end in range(len(parts), 0, -1):
            by_module[".".join(parts[:end])] += seconds
    group_time: dict[str, float] = {}
    modules_seen: set[str] = set()
    groups = [group_of(nodeid) for nodeid in nodeids]
    for nodeid, group in zip(nodeids, groups, strict=True):
        module = nodeid.split("::", 1)[0]
        if module in modules_seen:
            continue
        modules_seen.add(module)
        known = by_module.get(".".join(PurePosixPath(module).with_suffix("").parts))
        before = group_time.get(group, 0.0)
        group_time[group] = float("inf") if known is None else before + known  # new: first
    first_seen: dict[str, int] = {}
    for index, group in enumerate(groups):
        first_seen.setdefault(group, index)
    return sorted(
        range(len(nodeids)), key=lambda i: (-group_time[groups[i]], first_seen[groups[i]], i)
    )


def grouped_scheduling(config: object, log: object) -> object:
    """xdist's `loadscope` scheduling with `group_of` as the scope: each group is one unit
    of work, handed out in the workers' collection order (longest first, see above)."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # type: ignore[attr-defined]
    return GroupScheduling(config, log)
