"""JSON log lines (proxy/logs.py)."""

from __future__ import annotations

import json
import logging

from proxy.logs import JsonFormatter


def _record(**extra) -> logging.LogRecord:
    logger = logging.getLogger("tierproxy.connection")
    record = logger.makeRecord(
        logger.name, logging.WARNING, __file__, 1, "closing client %s: %s",
        ("10.0.1.5:5123", "frame size 9 exceeds limit 4"), None, extra=extra,
    )  # fmt: skip
    record.created = 1_700_000_000.25
    return record


def test_a_line_holds_ts_level_logger_message_and_the_extra_fields():
    line = JsonFormatter().format(_record(client="10.0.1.5:5123", reason="oversized_frame"))
    assert "\n" not in line
    assert json.loads(line) == {
        "ts": "2023-11-14T22:13:20.250+00:00",
        "level": "warning",
        "logger": "tierproxy.connection",
        "message": "closing client 10.0.1.5:5123: frame size 9 exceeds limit 4",
        "client": "10.0.1.5:5123",
        "reason": "oversized_frame",
    }


def test_values_json_cannot_hold_are_written_as_text_and_tracebacks_kept():
    record = _record(where=("a", 1), path=__import__("pathlib").Path("/var/lib/wal"))
    try:
        raise ValueError("bad batch at offset 42")
    except ValueError:
        import sys

        record.exc_info = sys.exc_info()
    line = json.loads(JsonFormatter().format(record))
    assert line["where"] == ["a", 1] and line["path"] == "/var/lib/wal"
    assert "ValueError: bad batch at offset 42" in line["exception"]
