"""JSON record values as columns of the Iceberg export (`--value-schema`, docs/offload.md,
"JSON values as columns").

The user names the fields to take out of each record's value and their types, in a JSON
file: `{"order_id": "long", "customer": "string", "amount": "double", "paid": "boolean",
"at": "timestamp"}`. Each becomes a nullable column after the record's own columns, in
that order, and one more, `value_error`, says why a record's value could not be decoded.
A bad record never stops the job and loses nothing: its `value` column still holds the
bytes, its value columns are null and `value_error` holds the reason (the dead letter is
a column: `WHERE value_error IS NOT NULL` lists them).

The rules, per record: no value (a tombstone): every column null, no error. A value that
is not UTF-8 JSON, or not a JSON object: an error. A field missing or null: that column
null, no error. A field of another type: an error naming the field (every value column of
the record null, so a row is either wholly decoded or wholly a dead letter). Fields not
named are ignored. `long` and `int` take JSON integers in their range (not booleans, not
2.0), `double` any JSON number, `timestamp` an ISO 8601 string with its UTC offset
(`2026-11-27T10:00:00Z`) or epoch milliseconds, `json` anything (its JSON text: the way
to keep a nested object or a list).

Written by hand: the decoding is json.loads and a type check per field; pyarrow's JSON
reader parses whole files and fails the file on one bad line, where each record must
fail alone.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

ERROR_COLUMN = "value_error"
RESERVED = frozenset(
    {"topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers",
     ERROR_COLUMN}
)  # fmt: skip
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
ARROW_TYPES = {
    "string": pa.string(),
    "json": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


class ValueSchemaError(ValueError):
    """A value schema that cannot be used; the message says why."""


class _Bad(Exception):
    """One record's value cannot be decoded: the reason."""


@dataclass(frozen=True, slots=True)
class ValueSchema:
    """(name, type) of each column, in the user's order."""

    columns: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, text: str, where: str = "the value schema") -> ValueSchema:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueSchemaError(f"{where} is not JSON: {exc}") from None
        if isinstance(raw, list):  # the canonical form a table keeps: [[name, type], ...]
            pairs = [tuple(p) if isinstance(p, list) and len(p) == 2 else (None, p) for p in raw]
        elif isinstance(raw, dict):
            pairs = list(raw.items())
        else:
            raise ValueSchemaError(f'{where}: expected an object of "field": "type"')
        if not pairs:
            raise ValueSchemaError(f"{where} names no field")
        for name, kind in pairs:
            if not isinstance(name, str) or not name:
                raise ValueSchemaError(f"{where}: a field name must be a non-empty string")
            if name in RESERVED:
                raise ValueSchemaError(f"{where}: {name!r} is a column of the table already")
            if kind not in ARROW_TYPES:
                raise ValueSchemaError(
                    f"{where}: field {name!r} has type {kind!r}; one of {', '.join(ARROW_TYPES)}"
                )
        return cls(tuple(pairs))

    @classmethod
    def from_file(cls, path: Path) -> ValueSchema:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ValueSchemaError(f"--value-schema {path}: {exc.strerror}") from None
        return cls.parse(text, f"--value-schema {path}")

    def canonical(self) -> str:
        """The form kept in the table's properties (order kept)."""
        return json.dumps([list(c) for c in self.columns], separators=(",", ":"))

    def arrow_fields(self) -> list[pa.Field]:
        fields = [pa.field(name, ARROW_TYPES[kind]) for name, kind in self.columns]
        return fields + [pa.field(ERROR_COLUMN, pa.string())]

    def decode(self, values: Sequence[bytes | None]) -> tuple[list[list[Any]], int]:
        """The value columns (one list per column, `value_error` last) of `values`, and
        how many could not be decoded."""
        out: list[list[Any]] = [[] for _ in range(len(self.columns) + 1)]
        bad = 0
        for value in values:
            try:
                row = self._row(value)
                error = None
            except _Bad as exc:
                row, error = [None] * len(self.columns), str(exc)
                bad += 1
            for column, item in zip(out, [*row, error], strict=True):
                column.append(item)
        return out, bad

    def _row(self, value: bytes | None) -> list[Any]:
        if value is None:
            return [None] * len(self.columns)
        try:
            document = json.loads(value)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _Bad(f"not JSON: {exc}") from None
        if not isinstance(document, dict):
            raise _Bad(f"not a JSON object but a {type(document).__name__}")
        return [_typed(name, kind, document.get(name)) for name, kind in self.columns]


def _typed(name: str, kind: str, item: Any) -> Any:
    if item is None:
        return None
    if kind in ("long", "int"):
        low, high = INT64 if kind == "long" else INT32
        if isinstance(item, int) and not isinstance(item, bool) and low <= item <= high:
            return item
    elif kind == "double":
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            return float(item)
    elif kind == "boolean":
        if isinstance(item, bool):
            return item
    elif kind == "string":
        if isinstance(item, str):
            return item
    elif kind == "json":
        return json.dumps(item, separators=(",", ":"), ensure_ascii=False)
    elif kind == "timestamp":
        found = _timestamp(item)
        if found is not None:
            return found
    raise _Bad(f"field {name!r}: expected {kind}, got {json.dumps(item)[:80]}")


def _timestamp(item: Any) -> datetime.datetime | None:
    if isinstance(item, int) and not isinstance(item, bool):
        try:
            return datetime.datetime.fromtimestamp(item / 1000, datetime.UTC)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(item, str):
        try:
            found = datetime.datetime.fromisoformat(item)
        except ValueError:
            return None
        if found.tzinfo is None:  # a time without its offset is ambiguous: refused
            return None
        return found.astimezone(datetime.UTC)
    return None
