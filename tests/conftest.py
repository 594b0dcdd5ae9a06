"""Session-wide real components: one 3-broker Kafka (racks zone-a/b/c), one MinIO, one Spark
session, and a Spark standalone cluster (a master and two 1-core workers).

Each is started once per test session, on first use, and stopped at the end whatever
happened; in one process, the costly ones only some modules use (the conformance fleet,
the SASL/TLS Kafka, Spark) are stopped right after their last test instead
(tests/support/release.py). A failing test gets the tail of every running component's
log in its report.
Set TIERPROXY_TEST_BOOTSTRAP / TIERPROXY_TEST_S3_ENDPOINT to use external services instead.

`--part pure|shared` runs half the suite (scripts/test.sh runs both, the pure part on
pytest-xdist workers): `shared` is every test under tests/integration and any other test
that uses the session's Kafka, MinIO or Spark; `pure` is the rest. The shared part runs
in one process, or (TIERPROXY_TEST_SHARED_WORKERS) on xdist workers that share one Kafka
and one MinIO, which scripts/test.sh starts (`python -m proxy.devstack.shared`) and names
in TIERPROXY_TEST_SERVICES: without it each worker would start its own. With
`--dist loadscope`, tests that must share a process are grouped and the groups handed out
longest first (tests/support/schedule.py); each xdist worker hands out ports from its own
share of the free range (`proxy.devstack.paths.port_share`).
"""

from __future__ import annotations

import faulthandler
import os
from collections import deque
from pathlib import Path
from typing import TextIO

import pytest

from proxy.devstack import KafkaCluster, MinioServer
from proxy.devstack.external import external_kafka, external_s3
from proxy.devstack.paths import PORT_RANGE_ENV, port_share
from proxy.devstack.process import tracked_processes
from tests.support.release import release_plan
from tests.support.schedule import grouped_scheduling, longest_first, misplaced, module_times

ZONES = ["zone-a", "zone-b", "zone-c"]
SESSION_SERVICES = {"kafka_cluster", "s3_server", "spark", "spark_cluster"}
HANG_GRACE_S = 120  # past a test's own timeout: pytest-timeout could not stop it


def pytest_addoption(parser):
    parser.addoption(
        "--part",
        choices=("pure", "shared"),
        default=None,
        help="run only the tests that need no session service (pure) or only the others",
    )


def is_shared(item) -> bool:
    integration = Path(__file__).parent / "integration"
    return item.path.is_relative_to(integration) or not SESSION_SERVICES.isdisjoint(
        item.fixturenames
    )


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    if worker is not None and PORT_RANGE_ENV not in os.environ:
        # a worker xdist starts in place of a dead one (the hang watchdog ends a stuck
        # test's process) gets the next id, gw2 of 2: it shares a slice with a live one,
        # whose bound ports the bind check still skips
        count = int(worker["workercount"])
        index = int(worker["workerid"].removeprefix("gw")) % count
        os.environ[PORT_RANGE_ENV] = port_share(index, count)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Groups(), "tierproxy-test-groups")
    if worker is None and not _distributed(config):
        config.pluginmanager.register(_ReleaseAfterLastUse(), "tierproxy-release-early")


def _distributed(config) -> bool:
    """Whether xdist hands this run's tests to workers (-n N with N > 0)."""
    numprocesses = getattr(config.option, "numprocesses", None)
    return bool(numprocesses) and config.getvalue("dist") != "no"


class _Groups:
    """The shared part's groups over xdist workers (tests/support/schedule.py)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") == "loadscope":
            return grouped_scheduling(config, log)
        return None


class _ReleaseAfterLastUse:
    """Finishes a costly session fixture once its last test is torn down, in one
    process (tests/support/release.py)."""

    def __init__(self) -> None:
        self._plan: dict[str, list[str]] | None = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item, nextitem):
        try:
            return (yield)  # the test's own teardown first
        finally:
            self._release_after(item)

    def _release_after(self, item) -> None:
        """Finish every fixture planned for `item`, each even when one before failed; the
        failures end up as this test's teardown error, together."""
        if self._plan is None:
            users = ((i.nodeid, getattr(i, "fixturenames", ())) for i in item.session.items)
            self._plan = release_plan(users)
        failed: list[BaseException] = []
        for name in self._plan.get(item.nodeid, ()):
            for fixturedef in item._fixtureinfo.name2fixturedefs.get(name, ()):
                try:
                    fixturedef.finish(item._request)  # its dependants' finalizers run first
                except BaseException as exc:  # noqa: BLE001 - the others still stop
                    failed.append(exc)
        if len(failed) == 1:
            raise failed[0]
        if failed:
            raise BaseExceptionGroup(f"releasing session fixtures after {item.nodeid}", failed)


def pytest_collection_modifyitems(config, items):
    part = config.getoption("--part")
    if part is not None:
        keep, drop = [], []
        for item in items:
            (keep if is_shared(item) == (part == "shared") else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    if part == "shared" and hasattr(config, "workerinput"):
        wrong = misplaced((item.nodeid, item.fixturenames) for item in items)
        if wrong:
            raise pytest.UsageError("tests/support/schedule.py:\n" + "\n".join(wrong))
        cache = Path(os.environ.get("TIERPROXY_CACHE", config.rootpath / ".cache"))
        times = module_times(cache / "test-times" / "shared.xml")
        order = longest_first([item.nodeid for item in items], times)
        items[:] = [items[i] for i in order]


@pytest.fixture(scope="session")
def kafka_cluster():
    """The shared 3-broker cluster. Tests that stop brokers start their own."""
    external = external_kafka()
    if external is not None:
        yield external
        return
    with KafkaCluster(size=3, racks=ZONES, name="kafka-shared") as cluster:
        yield cluster


@pytest.fixture(scope="session")
def s3_server():
    external = external_s3()
    if external is not None:
        yield external
        return
    with MinioServer(name="minio-shared") as server:
        yield server


@pytest.fixture(scope="session")
def spark():
    from proxy.devstack.spark import spark_session

    session = spark_session("tierproxy-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A master and two workers of one core (proxy/devstack/sparkcluster.py), for the
    jobs that run through spark-submit as users run them. A test that kills a worker
    restarts it (`restart_worker`) before it ends."""
    from proxy.devstack.sparkcluster import SparkCluster

    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1) as cluster:
        yield cluster


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for proc in tracked_processes():
            report.sections.append(
                (f"log tail: {proc.name} ({proc.log_path})", proc.tail(40) or "(empty)")
            )
        for log_path in _shared_logs():  # the services another process started
            report.sections.append((f"log tail: {log_path}", _tail(log_path, 40)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test pytest-timeout cannot stop (its signal waits for the Python code, and a
    client library's C call may never return, confluentinc/librdkafka#4514) would hold
    the run until CI's limit. With TIERPROXY_HANG_LOG set (scripts/test.sh sets it),
    `HANG_GRACE_S` past the test's timeout the file `<TIERPROXY_HANG_LOG>.<pid>` gets the
    test's id and the stack of every thread, and the process exits (status 1); the file
    is empty while no test hangs."""
    hang_log, timeout_s = _hang_log(), _timeout_s(item)
    if hang_log is None or timeout_s <= 0:  # no timeout (a marker's 0): nothing to enforce
        yield
        return
    hang_log.seek(0)
    hang_log.truncate()
    hang_log.write(f"{item.nodeid} ran past its timeout; the stack of every thread:\n")
    hang_log.flush()
    faulthandler.dump_traceback_later(timeout_s + HANG_GRACE_S, exit=True, file=hang_log)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        hang_log.seek(0)
        hang_log.truncate()
        hang_log.flush()


_hang_logs: dict[int, TextIO] = {}


def pytest_unconfigure(config):
    for hang_log in _hang_logs.values():
        hang_log.close()
    _hang_logs.clear()


def _hang_log() -> TextIO | None:
    base = os.environ.get("TIERPROXY_HANG_LOG")
    if not base:
        return None
    pid = os.getpid()
    if pid not in _hang_logs:
        _hang_logs[pid] = open(f"{base}.{pid}", "w")  # noqa: SIM115 (open for the session)
    return _hang_logs[pid]


def _timeout_s(item) -> float:
    """The test's pytest-timeout timeout: its marker's, else the ini's (0: none)."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    return float(item.config.getini("timeout") or 0)


def _shared_logs() -> list[Path]:
    try:  # a report hook: the fixtures say what is wrong with the variables, not this
        kafka, s3 = external_kafka(), external_s3()
    except RuntimeError:
        return []
    return [*(kafka.log_paths if kafka else ()), *(s3.log_paths if s3 else ())]


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, errors="replace") as log:
            return "".join(deque(log, maxlen=lines)) or "(empty)"
    except OSError as exc:
        return f"(not readable: {exc})"
