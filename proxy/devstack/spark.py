"""PySpark `local[*]` running the project's own interpreter on both sides.

Spark starts its Python workers with PYSPARK_PYTHON; pointing it (and the driver's)
at `sys.executable` makes the executors import the same venv, so `offload_jobs/` and
`proxy/` run inside Spark tasks exactly as they do in the proxy.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_session(app_name: str = "tierproxy", master: str = "local[*]") -> SparkSession:
    """A SparkSession for local jobs and tests; stop it with `.stop()` when done."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    scratch = Path(tempfile.mkdtemp(prefix="tierproxy-spark-"))
    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", os.environ.get("TIERPROXY_SPARK_MEMORY", "1g"))
        .config("spark.local.dir", str(scratch))
        .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={scratch}")
        .getOrCreate()
    )
