"""JSON values into columns (`--value-schema`): each type's accepted and refused values,
a bad record a dead letter with its reason (never an exception), tombstones and missing
fields null without an error, and the schemas refused before anything runs."""

from __future__ import annotations

import datetime
import json

import pytest

from offload_jobs.value_columns import ERROR_COLUMN, ValueSchema, ValueSchemaError

SCHEMA = ValueSchema.parse(
    json.dumps({"id": "long", "n": "int", "amount": "double", "paid": "boolean",
                "who": "string", "at": "timestamp", "extra": "json"})
)  # fmt: skip
UTC = datetime.UTC


def rows(*values: bytes | None) -> list[dict]:
    columns, _ = SCHEMA.decode(list(values))
    names = [name for name, _ in SCHEMA.columns] + [ERROR_COLUMN]
    return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]


def test_every_type_decoded():
    value = json.dumps({
        "id": 2**62, "n": -5, "amount": 3, "paid": False, "who": "ann",
        "at": "2026-11-27T10:00:00+01:00", "extra": {"a": [1, 2]}, "ignored": 1,
    }).encode()  # fmt: skip
    [row] = rows(value)
    assert row == {
        "id": 2**62, "n": -5, "amount": 3.0, "paid": False, "who": "ann",
        "at": datetime.datetime(2026, 11, 27, 9, 0, tzinfo=UTC), "extra": '{"a":[1,2]}',
        ERROR_COLUMN: None,
    }  # fmt: skip
    [epoch] = rows(b'{"at": 1700000000123}')
    assert epoch["at"] == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)


def test_tombstones_and_missing_fields_are_null_not_errors():
    tombstone, empty, nulls = rows(None, b"{}", b'{"id": null, "who": null}')
    for row in (tombstone, empty, nulls):
        assert set(row.values()) == {None}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"{id: 1}", "not JSON"),
        (b"[1, 2]", "not a JSON object but a list"),
        (b'"text"', "not a JSON object but a str"),
        (b'{"id": "1"}', "field 'id': expected long, got \"1\""),
        (b'{"id": 2.0}', "field 'id': expected long"),
        (b'{"id": true}', "field 'id': expected long"),
        (b'{"id": 9223372036854775808}', "field 'id': expected long"),
        (b'{"n": 2147483648}', "field 'n': expected int"),
        (b'{"amount": "3"}', "field 'amount': expected double"),
        (b'{"paid": 1}', "field 'paid': expected boolean"),
        (b'{"who": 7}', "field 'who': expected string"),
        (b'{"at": "2026-11-27T10:00:00"}', "field 'at': expected timestamp"),
        (b'{"at": "yesterday"}', "field 'at': expected timestamp"),
    ],
)
def test_a_value_that_does_not_fit_is_a_dead_letter(value, reason):
    good = b'{"id": 1, "who": "bo"}'
    before, bad, after = rows(good, value, good)
    assert before["id"] == after["id"] == 1 and before[ERROR_COLUMN] is None
    assert bad[ERROR_COLUMN].startswith(reason), bad[ERROR_COLUMN]
    assert {v for k, v in bad.items() if k != ERROR_COLUMN} == {None}  # wholly a dead letter
    assert SCHEMA.decode([good, value, good])[1] == 1


def test_the_canonical_form_keeps_the_order_and_parses_back():
    assert ValueSchema.parse(SCHEMA.canonical()) == SCHEMA
    assert [f.name for f in SCHEMA.arrow_fields()][:2] == ["id", "n"]
    assert SCHEMA.arrow_fields()[-1].name == ERROR_COLUMN


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "names no field"),
        ("3", 'expected an object of "field": "type"'),
        ('{"value": "string"}', "'value' is a column of the table already"),
        ('{"value_error": "string"}', "is a column of the table already"),
        ('{"x": "decimal"}', "field 'x' has type 'decimal'; one of string, json, long"),
        ('{"": "long"}', "a field name must be a non-empty string"),
    ],
)
def test_schemas_refused(text, message):
    with pytest.raises(ValueSchemaError, match=message):
        ValueSchema.parse(text)


def test_a_schema_file_that_cannot_be_read_is_named(tmp_path):
    with pytest.raises(ValueSchemaError, match="--value-schema .*missing.json: No such file"):
        ValueSchema.from_file(tmp_path / "missing.json")
