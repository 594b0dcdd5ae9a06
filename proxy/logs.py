"""The proxy's log output: text lines on a terminal, JSON lines otherwise.

`logging.format` is `auto` (the default: text when stderr is a terminal, JSON when it is
a file, a pipe or a container's log), `text` or `json`. A JSON line holds `ts` (UTC, ISO
8601 with milliseconds), `level`, `logger`, `message`, and every `extra=` field the call
passed (connection errors pass `client` and `reason`), plus `exception` with the
traceback when there is one. Values that are not JSON types are written as their `str()`.

Two sources are kept from drowning what an operator must act on:

- `tierproxy.access` (a line per client connection) is written only with
  `logging.access: true`.
- The Kafka client library (aiokafka) logs from `warning` up at `info`, and the transient
  states it retries by itself (no leader yet, no group coordinator yet, while Kafka
  elects them, e.g. at start) are written at `debug`, not as errors: the proxy's own
  loggers say when something stays wrong.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

# What every LogRecord has: anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "tierproxy.access"
KAFKA_CLIENT_LOGGER = "aiokafka"

# What aiokafka logs as a warning or an error and then retries by itself: the states of
# a Kafka electing partition leaders and group coordinators (a start, a broker restart).
TRANSIENT_KAFKA_CLIENT_STATES = (
    "NotLeaderForPartitionError",
    "NotLeaderOrFollowerError",
    "LeaderNotAvailableError",
    "GroupCoordinatorNotAvailableError",
    "CoordinatorNotAvailableError",
    "NotCoordinatorForGroupError",
    "NotCoordinatorError",
    "GroupLoadInProgressError",
    "CoordinatorLoadInProgressError",
    "Marking the coordinator dead",
    "not found in cluster metadata",  # a topic the proxy just created
)

# What aiokafka logs as an error and retries, that is a passing state only most of the time:
# a broker answers UnknownTopicOrPartition for a topic created a moment ago until it has
# applied the creation (KRaft brokers apply the metadata log each in their own time), and
# also for a topic deleted under the proxy, which does not pass. Written as a warning: seen
# by an operator, not an error of the proxy.
WARNED_KAFKA_CLIENT_STATES = ("UnknownTopicOrPartitionError",)


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


def is_transient_kafka_client_state(record: logging.LogRecord) -> bool:
    """A warning or error of the Kafka client library about a state it retries itself."""
    return _kafka_client_state(record, TRANSIENT_KAFKA_CLIENT_STATES)


def _kafka_client_state(record: logging.LogRecord, states: tuple[str, ...]) -> bool:
    if not record.name.startswith(KAFKA_CLIENT_LOGGER) or record.levelno < logging.WARNING:
        return False
    message = record.getMessage()
    return any(state in message for state in states)


class DemoteTransient(logging.Filter):
    """Writes the Kafka client library's transient states at debug (or not at all), and the
    states it retries that may last (WARNED_KAFKA_CLIENT_STATES) as warnings."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if is_transient_kafka_client_state(record):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self.level <= logging.DEBUG
        if record.levelno > logging.WARNING and _kafka_client_state(
            record, WARNED_KAFKA_CLIENT_STATES
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return self.level <= logging.WARNING
        return True


def resolve_format(fmt: str, stream: TextIO) -> str:
    """`auto`: text on a terminal, JSON otherwise."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


def configure_logging(
    level: str, fmt: str = "auto", access: bool = False, stream: TextIO | None = None
) -> None:
    """The root logger's one handler, on stderr, replacing any there was."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    json_lines = resolve_format(fmt, stream) == "json"
    handler.setFormatter(JsonFormatter() if json_lines else logging.Formatter(TEXT_FORMAT))
    numeric = logging.getLevelName(level.upper())
    handler.addFilter(DemoteTransient(numeric))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    # on: every connection at info, whatever log_level says; off: none (errors still)
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO if access else logging.WARNING)
    kafka_client = logging.getLogger(KAFKA_CLIENT_LOGGER)
    kafka_client.setLevel(logging.WARNING if numeric == logging.INFO else logging.NOTSET)
