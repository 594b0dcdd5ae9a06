"""The proxy's log output: text lines, or JSON lines (`logging.format: json`).

A JSON line holds `ts` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`,
and every `extra=` field the call passed (connection errors pass `client` and `reason`),
plus `exception` with the traceback when there is one. Values that are not JSON types
are written as their `str()`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

# What every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(level: str, fmt: str = "text") -> None:
    """The root logger's one handler, on stderr, replacing any there was."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
