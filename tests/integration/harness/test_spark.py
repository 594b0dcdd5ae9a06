"""The harness runs a real Spark: a job reads Parquet that pyarrow wrote."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark


def test_spark_reads_parquet_written_by_pyarrow(spark, tmp_path):
    rows = 50_000
    table = pa.table(
        {
            "partition": pa.array([i % 6 for i in range(rows)], pa.int32()),
            "offset": pa.array(range(rows), pa.int64()),
            "value": pa.array([f"v{i}".encode() for i in range(rows)], pa.binary()),
        }
    )
    third = rows // 3 + 1
    for part in range(3):  # several files, so Spark plans several tasks
        pq.write_table(table.slice(part * third, third), tmp_path / f"p{part}.parquet")

    frame = spark.read.parquet(str(tmp_path))
    summary = {
        row["partition"]: (row["records"], row["last"])
        for row in frame.groupBy("partition")
        .agg({"offset": "max", "*": "count"})
        .withColumnRenamed("count(1)", "records")
        .withColumnRenamed("max(offset)", "last")
        .collect()
    }
    want = {p: (len(range(p, rows, 6)), max(range(p, rows, 6))) for p in range(6)}
    assert summary == want
    assert frame.filter(frame.value == b"v4242").select("offset").collect()[0][0] == 4242

    # the executors ran the venv's own interpreter
    executables = frame.rdd.mapPartitions(lambda _: [__import__("sys").executable]).collect()
    assert set(executables) == {sys.executable}
