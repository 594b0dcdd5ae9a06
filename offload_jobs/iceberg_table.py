"""The Iceberg side of `tierproxy export --iceberg`: the catalog, the table (created on
the first run), the data files a Spark task writes, and the driver's one commit per run
(docs/offload.md, "Iceberg tables").

pyiceberg does all of it: its SQL catalog (SQLite by default, a file that needs nothing
running; any SQLAlchemy URI for a shared one), its pyarrow FileIO for the table's data
(a local directory, or S3 with the endpoint and credentials of the proxy's config), its
Parquet writer with Iceberg's field ids and column statistics, and its fast append,
which commits only if the table is still at the snapshot the run started from.

The table: one row per record, partitioned by day(timestamp) (hidden partitioning: a
filter on `timestamp` prunes days), sorted by partition and offset within each data
file (every file holds one Kafka partition's rows in offset order).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from offload_jobs.export_records import Row
from offload_jobs.iceberg_offsets import TOPIC_KEY
from offload_jobs.value_columns import ERROR_COLUMN, ValueSchema, ValueSchemaError

VALUE_SCHEMA_KEY = "tierproxy.value-schema"
FIRST_VALUE_FIELD_ID = 100  # value columns' field ids: past the record's own (1-11)

DEFAULT_NAMESPACE = "kafka"
NO_RETRY = ("commit.retry.num-retries", "0")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")  # Kafka's names, by the batch's bit
TABLE_PROPERTIES = {
    "format-version": "2",
    "write.format.default": "parquet",
    "write.parquet.compression-codec": "zstd",
    # every run commits a snapshot: keep the metadata files from growing without end
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "100",
    # no retry of a failed commit: pyiceberg would redo the append on top of whatever
    # another run committed meanwhile, so both runs' records would be in the table
    NO_RETRY[0]: NO_RETRY[1],
}
EPOCH = datetime.date(1970, 1, 1)


class IcebergSetupError(ValueError):
    """A catalog or table the export cannot use; the message says why."""


@dataclass(frozen=True, slots=True)
class CatalogSpec:
    """Where the table is: `catalog` a SQLite file path or a SQLAlchemy URI (sqlite:///,
    postgresql+psycopg2://...), `warehouse` where a new table's files go (file:///dir or
    s3://bucket/prefix), `io` pyiceberg's FileIO properties (s3.endpoint, ...)."""

    catalog: str
    table: str  # namespace.name (a name alone goes to DEFAULT_NAMESPACE)
    warehouse: str
    io: dict[str, str] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        if "://" in self.catalog:
            return self.catalog
        return f"sqlite:///{Path(self.catalog).resolve()}"

    @property
    def identifier(self) -> tuple[str, str]:
        namespace, _, name = self.table.rpartition(".")
        if not name:
            raise IcebergSetupError(f"--iceberg {self.table!r}: name a table")
        return namespace or DEFAULT_NAMESPACE, name


def s3_io(s3: dict[str, Any]) -> dict[str, str]:
    """pyiceberg's FileIO properties for the proxy's S3 settings (`S3Config` fields)."""
    props = {
        "s3.endpoint": s3["endpoint_url"],
        "s3.region": s3.get("region") or "us-east-1",
        "s3.force-virtual-addressing": str(not s3.get("path_style", True)).lower(),
    }
    if s3.get("access_key_id"):
        props["s3.access-key-id"] = s3["access_key_id"]
        props["s3.secret-access-key"] = s3.get("secret_access_key") or ""
    return props


def default_warehouse(store_kind: str, directory: str, s3: dict[str, Any] | None) -> str:
    """Beside the proxy's objects, under iceberg/ (the proxy never touches keys it did
    not write: docs/object-store.md)."""
    if store_kind == "s3" and s3 is not None:
        return f"s3://{s3['bucket']}/iceberg"
    return Path(directory, "iceberg").resolve().as_uri()


def schema(values: ValueSchema | None = None):
    """The record's columns, then `values`' columns and `value_error` if given."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import (
        BinaryType,
        BooleanType,
        DoubleType,
        IntegerType,
        ListType,
        LongType,
        NestedField,
        StringType,
        StructType,
        TimestamptzType,
    )

    value_types = {
        "string": StringType(), "json": StringType(), "long": LongType(), "int": IntegerType(),
        "double": DoubleType(), "boolean": BooleanType(), "timestamp": TimestamptzType(),
    }  # fmt: skip
    extra = []
    if values is not None:
        kinds = [*(kind for _, kind in values.columns), "string"]
        names = [*(name for name, _ in values.columns), ERROR_COLUMN]
        extra = [
            NestedField(FIRST_VALUE_FIELD_ID + n, name, value_types[kind], required=False)
            for n, (name, kind) in enumerate(zip(names, kinds, strict=True))
        ]

    header = StructType(
        NestedField(10, "key", StringType(), required=True),
        NestedField(11, "value", BinaryType(), required=False),
    )
    return Schema(
        NestedField(1, "topic", StringType(), required=True),
        NestedField(2, "partition", IntegerType(), required=True),
        NestedField(3, "offset", LongType(), required=True),
        NestedField(4, "timestamp", TimestamptzType(), required=True),
        NestedField(5, "timestamp_type", StringType(), required=True),
        NestedField(6, "key", BinaryType(), required=False),
        NestedField(7, "value", BinaryType(), required=False),
        NestedField(8, "headers", ListType(9, header, element_required=True), required=True),
        *extra,
    )


def open_catalog(spec: CatalogSpec):
    from pyiceberg.catalog.sql import SqlCatalog

    if spec.uri.startswith(("http://", "https://")):
        raise IcebergSetupError(
            f"--catalog {spec.catalog}: a REST catalog is not supported yet (a SQLite file, "
            "or a SQLAlchemy URI of a SQL catalog)"
        )
    if spec.uri.startswith("sqlite:///"):
        Path(spec.uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    return SqlCatalog("tierproxy", uri=spec.uri, warehouse=spec.warehouse, **spec.io)


def table_values(table_properties: dict[str, str]) -> ValueSchema | None:
    """The value columns a table was created with (`--value-schema`), if any."""
    held = table_properties.get(VALUE_SCHEMA_KEY)
    if held is None:
        return None
    try:
        return ValueSchema.parse(held, f"the table's {VALUE_SCHEMA_KEY}")
    except ValueSchemaError as exc:
        raise IcebergSetupError(str(exc)) from None


def load_or_create(catalog, spec: CatalogSpec, topic: str, values: ValueSchema | None = None):
    """The table, created with our schema (and `values`' columns), partitioning, sort
    order and properties if it is not there; an existing one must be this topic's export,
    and `values`, if given, the value columns it was created with (a run without them
    decodes with the table's own)."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.table.sorting import SortField, SortOrder
    from pyiceberg.transforms import DayTransform, IdentityTransform

    namespace, name = spec.identifier
    try:
        table = catalog.load_table((namespace, name))
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(namespace)
        by_day = PartitionField(4, 1000, DayTransform(), "timestamp_day")
        order = SortOrder(SortField(2, IdentityTransform()), SortField(3, IdentityTransform()))
        properties = {**TABLE_PROPERTIES, TOPIC_KEY: topic}
        if values is not None:
            properties[VALUE_SCHEMA_KEY] = values.canonical()
        return catalog.create_table_if_not_exists(
            (namespace, name), schema(values), partition_spec=PartitionSpec(by_day),
            sort_order=order, properties=properties,
        )  # fmt: skip
    held = table.properties.get(TOPIC_KEY)
    if held != topic:
        raise IcebergSetupError(
            f"table {namespace}.{name} holds the export of {held or 'no tierproxy topic'}, "
            f"not of {topic}"
        )
    held_values = table_values(table.properties)
    if values is not None and values != held_values:
        had = "none" if held_values is None else held_values.canonical()
        raise IcebergSetupError(
            f"table {namespace}.{name} has value columns {had}, not {values.canonical()}: "
            "export to a new table for other value columns"
        )
    names = [f.name for f in table.schema().fields]
    wanted = [f.name for f in schema(held_values).fields]
    if names[: len(wanted)] != wanted:
        raise IcebergSetupError(f"table {namespace}.{name}: columns {names}, expected {wanted}")
    if table.properties.get(NO_RETRY[0]) != NO_RETRY[1]:  # changed since: set it back
        with table.transaction() as tx:
            tx.set_properties({NO_RETRY[0]: NO_RETRY[1]})
    return table


def snapshot_summaries(table) -> Iterator[dict[str, str]]:
    """The summaries of the current branch's snapshots, newest first."""
    snapshot = table.current_snapshot()
    while snapshot is not None:
        yield dict(snapshot.summary.additional_properties) if snapshot.summary else {}
        parent = snapshot.parent_snapshot_id
        snapshot = None if parent is None else table.snapshot_by_id(parent)


def arrow_rows(
    topic: str, partition: int, rows: list[Row], arrow_schema: pa.Schema,
    decoder: ValueSchema | None = None,
) -> tuple[pa.Table, int]:  # fmt: skip
    """Decoded rows (offset order) as a table of the Iceberg schema, and how many values
    `decoder` could not decode."""
    columns = list(zip(*rows, strict=True))
    offsets, timestamps, keys, values, headers, kinds = columns
    decoded, bad = decoder.decode(values) if decoder is not None else ([], 0)
    extra = [
        pa.array(column, f.type)
        for column, f in zip(decoded, list(arrow_schema)[len(arrow_schema) - len(decoded) :],
                             strict=True)
    ]  # fmt: skip
    table = pa.Table.from_arrays(
        [
            pa.array([topic] * len(rows), pa.string()),
            pa.array([partition] * len(rows), pa.int32()),
            pa.array(offsets, pa.int64()),
            pa.array([t * 1000 for t in timestamps], pa.timestamp("us", tz="UTC")),
            pa.array([TIMESTAMP_TYPES[k] for k in kinds], pa.string()),
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array(headers, arrow_schema.field("headers").type),
            *extra,
        ],
        schema=arrow_schema,
    )
    return table, bad


class FileWriter:
    """On an executor: data files of the table (its metadata as the run read it), one
    per call, in its day's partition; returns pyiceberg's DataFile, which the driver
    appends. Names are new for every run (a uuid per task), so a run that died never
    shares a name with the one after it."""

    def __init__(self, metadata, io_properties: dict[str, str]) -> None:
        from pyiceberg.io import load_file_io

        self.metadata = metadata
        self.io = load_file_io(io_properties, metadata.location)
        self.arrow_schema = metadata.schema().as_arrow()
        self.values = table_values(metadata.properties)
        self.write_uuid = uuid.uuid4()
        self.count = 0
        self.value_errors = 0  # values not decoded (`value_error` set)

    def write(self, topic: str, partition: int, date: str, rows: list[Row]):
        from pyiceberg.io.pyarrow import write_file
        from pyiceberg.partitioning import PartitionFieldValue, PartitionKey
        from pyiceberg.table import WriteTask

        spec, table_schema = self.metadata.spec(), self.metadata.schema()
        day = (datetime.date.fromisoformat(date) - EPOCH).days
        key = PartitionKey([PartitionFieldValue(spec.fields[0], day)], spec, table_schema)
        table, bad = arrow_rows(topic, partition, rows, self.arrow_schema, self.values)
        self.value_errors += bad
        batches = table.to_batches()
        task = WriteTask(
            self.write_uuid, self.count, table_schema, batches,
            sort_order_id=self.metadata.default_sort_order_id, partition_key=key,
        )  # fmt: skip
        self.count += 1
        (data_file,) = write_file(self.io, self.metadata, iter([task]))
        return data_file


def commit(table, data_files: list, properties: dict[str, str]) -> int:
    """One append of every file, with the summary properties; the new snapshot's id.
    Fails (CommitFailedException) if the table moved since it was loaded: the append's
    parent must be the snapshot the run read its offsets from (NO_RETRY)."""
    with table.transaction() as tx:
        with tx.update_snapshot(snapshot_properties=properties).fast_append() as append:
            for data_file in data_files:
                append.append_data_file(data_file)
    return table.current_snapshot().snapshot_id
