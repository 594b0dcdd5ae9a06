"""The Iceberg table of an export, on pyiceberg's SQLite catalog and a local warehouse
(no service): created with the schema, day(timestamp) partitions, sort order and
properties; a data file per day lands in its day's partition with the rows byte-exact;
a table of another topic is refused; two runs from the same snapshot cannot both commit;
the catalog and table names are checked before anything runs."""

from __future__ import annotations

import pytest
from pyiceberg.exceptions import CommitFailedException

from offload_jobs.export_records import Resume
from offload_jobs.iceberg_offsets import encode
from offload_jobs.iceberg_table import (
    CatalogSpec,
    FileWriter,
    IcebergSetupError,
    commit,
    load_or_create,
    open_catalog,
    s3_io,
    snapshot_summaries,
)
from offload_jobs.value_columns import ValueSchema

T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
DAY_MS = 86_400_000


def spec_in(tmp_path, table: str = "orders") -> CatalogSpec:
    return CatalogSpec(str(tmp_path / "catalog.db"), table, (tmp_path / "warehouse").as_uri())


def test_a_new_table_and_a_file_per_day(tmp_path):
    spec = spec_in(tmp_path)
    assert spec.identifier == ("kafka", "orders") and spec.uri.startswith("sqlite:////")
    table = load_or_create(open_catalog(spec), spec, "orders")
    assert [f.name for f in table.schema().fields] == [
        "topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers",
    ]  # fmt: skip
    assert str(table.spec().fields[0].transform) == "day"
    assert [f.source_id for f in table.sort_order().fields] == [2, 3]
    assert table.properties["tierproxy.topic"] == "orders"
    assert table.metadata.format_version == 2
    assert table.properties["commit.retry.num-retries"] == "0"

    writer = FileWriter(table.metadata, table.io.properties)
    headers = [{"key": "h", "value": None}, {"key": "h", "value": b"\x00"}]
    files = [
        writer.write("orders", 1, "2023-11-14", [(5, T0, b"k", None, headers, 0)]),
        writer.write("orders", 1, "2023-11-15", [(6, T0 + DAY_MS, None, b"v", [], 1)]),
    ]
    assert "timestamp_day=2023-11-14/" in files[0].file_path
    commit(table, files, encode("orders", {1: Resume(7)}))
    rows = table.scan(row_filter="timestamp >= '2023-11-15T00:00:00+00:00'").to_arrow()
    assert rows.to_pylist()[0]["value"] == b"v" and rows.num_rows == 1  # pruned to a day
    everything = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["offset"])
    assert [(r["offset"], r["timestamp_type"], r["key"], r["headers"]) for r in everything] == [
        (5, "CreateTime", b"k", headers), (6, "LogAppendTime", None, []),
    ]  # fmt: skip
    assert [s.get("tierproxy.offsets") for s in snapshot_summaries(table)] == [
        '{"1":{"end":7,"open":{}}}'
    ]


def test_two_runs_from_one_snapshot_cannot_both_commit(tmp_path):
    spec = spec_in(tmp_path)
    first = load_or_create(open_catalog(spec), spec, "orders")
    second = open_catalog(spec).load_table(spec.identifier)
    for table, offset in ((first, 1), (second, 2)):
        writer = FileWriter(table.metadata, table.io.properties)
        data = writer.write("orders", 0, "2023-11-14", [(offset, T0, None, b"x", [], 0)])
        if table is first:
            commit(table, [data], encode("orders", {0: Resume(offset + 1)}))
            continue
        with pytest.raises(CommitFailedException):
            commit(table, [data], encode("orders", {0: Resume(offset + 1)}))
    assert open_catalog(spec).load_table(spec.identifier).scan().to_arrow().num_rows == 1
    with first.transaction() as tx:  # a user turns retries on: the next run turns them off
        tx.set_properties({"commit.retry.num-retries": "4"})
    again = load_or_create(open_catalog(spec), spec, "orders")
    assert again.properties["commit.retry.num-retries"] == "0"


def test_what_is_refused(tmp_path):
    spec = spec_in(tmp_path, "raw.orders")
    load_or_create(open_catalog(spec), spec, "orders")
    with pytest.raises(IcebergSetupError, match="holds the export of orders, not of payments"):
        load_or_create(open_catalog(spec), spec, "payments")
    with pytest.raises(IcebergSetupError, match="REST catalog is not supported"):
        open_catalog(CatalogSpec("http://catalog:8181", "t", "s3://b/w"))
    with pytest.raises(IcebergSetupError, match="name a table"):
        CatalogSpec("c.db", "raw.", "file:///w").identifier  # noqa: B018
    io = s3_io({"endpoint_url": "http://minio:9000", "access_key_id": "a",
                "secret_access_key": "s", "path_style": True})  # fmt: skip
    assert io["s3.force-virtual-addressing"] == "false" and io["s3.region"] == "us-east-1"


def test_json_value_columns_and_dead_letters_in_the_table(tmp_path):
    values = ValueSchema.parse('{"id": "long", "at": "timestamp"}')
    spec = spec_in(tmp_path)
    table = load_or_create(open_catalog(spec), spec, "orders", values)
    names = [f.name for f in table.schema().fields]
    assert names[8:] == ["id", "at", "value_error"]
    writer = FileWriter(table.metadata, table.io.properties)
    rows = [
        (0, T0, None, b'{"id": 7, "at": 1700000000000}', [], 0),
        (1, T0, None, b"not json", [], 0),
        (2, T0, b"k", None, [], 0),  # a tombstone
    ]
    commit(table, [writer.write("orders", 0, "2023-11-14", rows)], encode("orders", {0: Resume(3)}))
    assert writer.value_errors == 1
    read = sorted(table.scan().to_arrow().to_pylist(), key=lambda r: r["offset"])
    assert [(r["id"], r["value_error"] is None, r["value"]) for r in read] == [
        (7, True, rows[0][3]), (None, False, b"not json"), (None, True, None),
    ]  # fmt: skip
    assert read[1]["value_error"].startswith("not JSON")
    assert read[0]["at"].timestamp() == T0 / 1000

    again = load_or_create(open_catalog(spec), spec, "orders")  # a run without the flag
    assert FileWriter(again.metadata, again.io.properties).values == values
    with pytest.raises(IcebergSetupError, match='value columns \\[\\["id","long"\\],'):
        load_or_create(open_catalog(spec), spec, "orders", ValueSchema.parse('{"id": "int"}'))
    plain = spec_in(tmp_path, "plain")
    load_or_create(open_catalog(plain), plain, "orders")
    with pytest.raises(IcebergSetupError, match="has value columns none"):
        load_or_create(open_catalog(plain), plain, "orders", values)
