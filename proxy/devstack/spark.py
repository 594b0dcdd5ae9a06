"""PySpark `local[*]` running the project's own interpreter on both sides.

Spark starts its Python workers with PYSPARK_PYTHON; pointing it (and the driver's)
at `sys.executable` makes the executors import the same venv, so `offload_jobs/` and
`proxy/` run inside Spark tasks exactly as they do in the proxy.

A session started here is quiet: Spark's own log goes through a log4j2 file that keeps
errors only (no default-profile notice, no loopback-hostname, native-Hadoop or
spark.local.dir warnings, which a user cannot act on), and the JVM's notice about its
incubator modules is left out of stderr. Its scratch folder (`tierproxy-spark-*` in the
temporary directory) is removed by `local_spark` when the session stops.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.errors import TierproxyError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCRATCH_PREFIX = "tierproxy-spark-"
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# the level of the class that starts pyspark's JVM (a shell, to Spark): equal to the
# root's, so Spark does not announce that it sets a default level
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
"""
# What the JVM itself prints at start, before any logging: nothing to act on.
JVM_NOISE = ("WARNING: Using incubator modules",)
OFFLOAD_PACKAGES = ("pyspark", "pyarrow")  # the `offload` extra of pyproject.toml


class MissingExtra(TierproxyError):
    """The offload jobs' packages are not installed (the proxy itself does not need them)."""


def require_offload_packages() -> None:
    """Raise MissingExtra, naming what to install, unless every package of
    OFFLOAD_PACKAGES is importable: said before a job reads its config or reaches Kafka."""
    missing = [name for name in OFFLOAD_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(
            f"the offload jobs need {' and '.join(missing)}, which this installation lacks: "
            "install the offload extra (pip install 'tierproxy[offload]'; make test and "
            "make run install it)"
        )


def spark_session(
    app_name: str = "tierproxy", master: str = "local[*]", scratch: Path | None = None
) -> SparkSession:
    """A SparkSession for local jobs and tests; stop it with `.stop()` when done (and
    remove `scratch`, a new temporary folder when not given: `local_spark` does both)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local[*]: loopback is right
    from pyspark.sql import SparkSession

    scratch = scratch or Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    log4j = scratch / "log4j2.properties"
    log4j.write_text(_LOG4J2)
    java_options = f"-Dderby.system.home={scratch} -Dlog4j2.configurationFile=file:{log4j}"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", os.environ.get("TIERPROXY_SPARK_MEMORY", "1g"))
        .config("spark.local.dir", str(scratch))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", java_options)
    )
    with _without_jvm_notices():
        return builder.getOrCreate()


@contextmanager
def local_spark(given, app_name: str, master: str = "local[*]") -> Iterator[SparkSession]:
    """`given` when there is one (spark-submit's, a test's: left running); else a new
    local session, stopped on exit with its scratch folder removed."""
    if given is not None:
        yield given
        return
    require_offload_packages()
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
    try:
        session = spark_session(app_name, master, scratch)
        try:
            yield session
        finally:
            session.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def _without_jvm_notices() -> Iterator[None]:
    """While the JVM starts, stderr (which it inherits for its whole life) is a pipe
    whose lines go on to the real stderr, but for `JVM_NOISE`."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # pytest's capture, no real stderr
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not line.decode(errors="replace").startswith(JVM_NOISE):
                    os.write(saved, line)

    threading.Thread(target=forward, name="spark-stderr", daemon=True).start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)  # this process writes to the real stderr again; the JVM not
