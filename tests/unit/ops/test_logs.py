"""proxy/logs.py: JSON log lines, which lines an operator sees at the default level, and
in which format."""

from __future__ import annotations

import io
import json
import logging

import pytest

from proxy.logs import JsonFormatter, configure_logging, resolve_format


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


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    loggers = {name: logging.getLogger(name).level for name in ("aiokafka", "tierproxy.access")}
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name, old in loggers.items():
        logging.getLogger(name).setLevel(old)


def _lines(stream: io.StringIO) -> list[str]:
    return [line for line in stream.getvalue().splitlines() if line]


def test_auto_is_text_on_a_terminal_and_json_otherwise():
    assert resolve_format("auto", _Tty()) == "text"
    assert resolve_format("auto", io.StringIO()) == "json"
    assert resolve_format("text", io.StringIO()) == "text"
    assert resolve_format("json", _Tty()) == "json"


def test_the_kafka_clients_transient_states_are_debug_not_errors(restore_logging):
    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    fetcher.error(
        "Failed fetch offsets from 1: [Error 6] NotLeaderForPartitionError: TopicPartition"
    )
    logging.getLogger("aiokafka.consumer.group_coordinator").error(
        "Group Coordinator Request failed: [Error 15] GroupCoordinatorNotAvailableError"
    )
    logging.getLogger("aiokafka.consumer.group_coordinator").warning(
        "Marking the coordinator dead (node 1)for group g."
    )
    logging.getLogger("aiokafka.cluster").error("Topic t not found in cluster metadata")
    logging.getLogger("aiokafka.consumer.subscription_state").info("Updating subscribed topics")
    assert _lines(out) == []  # all transient or chatter: nothing at info
    fetcher.error("Unexpected error in fetcher routine")  # not a retried state: kept
    logging.getLogger("tierproxy.tiering").error("the uploader stopped")
    levels = [(r["level"], r["logger"]) for r in map(json.loads, _lines(out))]
    assert levels == [("error", "aiokafka.consumer.fetcher"), ("error", "tierproxy.tiering")]


@pytest.mark.parametrize("level", ["info", "warning", "error"])
def test_an_unknown_topic_the_client_retries_is_a_warning(restore_logging, level):
    # a broker that has not applied a topic's creation yet (CI of 2026-11-28), or a topic
    # deleted under the proxy: retried by aiokafka, worth seeing, not an error of the proxy
    out = io.StringIO()
    configure_logging(level, "json", stream=out)
    logging.getLogger("aiokafka.consumer.fetcher").error(
        "Failed fetch offsets from 3: [Error 3] UnknownTopicOrPartitionError: "
        "TopicPartition(topic='meta-1', partition=3)"
    )
    logging.getLogger("tierproxy.metadata").error("UnknownTopicOrPartitionError: not aiokafka's")
    levels = [(r["level"], r["logger"]) for r in map(json.loads, _lines(out))]
    client = [] if level == "error" else [("warning", "aiokafka.consumer.fetcher")]
    assert levels == [*client, ("error", "tierproxy.metadata")]


def test_at_debug_the_transient_states_are_written_as_debug(restore_logging):
    out = io.StringIO()
    configure_logging("debug", "json", stream=out)
    logging.getLogger("aiokafka.consumer.fetcher").error("[Error 6] NotLeaderForPartitionError")
    (record,) = map(json.loads, _lines(out))
    assert record["level"] == "debug" and "NotLeaderForPartitionError" in record["message"]


@pytest.mark.parametrize("access", [False, True])
def test_access_lines_only_when_turned_on(restore_logging, access):
    out = io.StringIO()
    configure_logging("info", "text", access=access, stream=out)
    logging.getLogger("tierproxy.access").info("client 127.0.0.1:5 on dev/bootstrap local")
    logging.getLogger("tierproxy.proxy").info("listening")
    loggers = [line.split()[3] for line in _lines(out)]
    assert loggers == (["tierproxy.access:"] if access else []) + ["tierproxy.proxy:"]
