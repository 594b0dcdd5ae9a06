"""The CLI's side of the admin API: GET a path of a proxy's admin API, render a table.

`tierproxy topics list|status` and `tierproxy fleet status --admin` use it. The token
comes from `--token` or the environment (TIERPROXY_ADMIN_TOKEN), so it need not appear
in a shell's history or a process list.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from urllib.parse import quote

TOKEN_ENV = "TIERPROXY_ADMIN_TOKEN"
ADMIN_ENV = "TIERPROXY_ADMIN"


class AdminError(Exception):
    """The admin API could not be asked, or answered an error; the message says which."""


def get(admin: str, path: str, token: str | None = None, timeout_s: float = 30.0) -> dict:
    token = token or os.environ.get(TOKEN_ENV) or None
    url = admin.rstrip("/") + path
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            message = exc.reason
        hint = f" (set --token or {TOKEN_ENV})" if exc.code == 401 else ""
        raise AdminError(f"{url}: HTTP {exc.code}: {message}{hint}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AdminError(f"{url}: {reason}") from None


def topic_path(name: str) -> str:
    return "/v1/topics/" + quote(name, safe="")


def table(headers: list[str], rows: list[list[object]]) -> str:
    """Columns as wide as their widest cell; numbers right-aligned."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(headers))]

    def line(values: list[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def render_topics(report: dict) -> str:
    rows = []
    for t in report["topics"]:
        parts = t.get("tiered_partitions") or []
        rows.append(
            [
                t["topic"],
                t["mode"],
                t["partitions"],
                len(parts) if t["mode"] == "tiered" else None,
                sum(p["objects"] for p in parts) if parts else None,
                sum(p["offsets_only_in_kafka"] for p in parts) if parts else None,
            ]
        )
    headers = ["TOPIC", "MODE", "PARTITIONS", "CUT OVER", "OBJECTS", "OFFSETS ONLY IN KAFKA"]
    return table(headers, rows)


def render_topic(report: dict) -> str:
    lines = [f"topic {report['topic']}: {report['mode']}, {report['partitions']} partitions"]
    if report["mode"] != "tiered":
        return "\n".join(lines)
    lines[0] += f", id {report['topic_id']}"
    rows = [
        [
            p["partition"],
            p["shard"],
            p["owner"] or None,
            p["log_start_offset"],
            p["cutover_offset"],
            p["committed_end_offset"],
            p["high_watermark"],
            p["objects"],
            p["object_bytes"],
        ]
        for p in report["tiered_partitions"]
    ]
    headers = [
        "PARTITION", "SHARD", "OWNER", "LOG START", "CUTOVER", "COMMITTED END",
        "HIGH WATERMARK", "OBJECTS", "OBJECT BYTES",
    ]  # fmt: skip
    lines.append(table(headers, rows))
    lines.append("(high watermark: shown by the partition's owner; ask its admin API)")
    return "\n".join(lines)


def render_fleet(report: dict) -> str:
    rows = []
    for m in report["members"]:
        lag = m.get("uploader") or {}
        rows.append(
            [
                m["name"],
                m["zone"],
                m["address"],
                "live" if m["live"] else "DEAD",
                m["last_heartbeat_s"],
                m["shards"],
                lag.get("lag_bytes"),
                lag.get("lag_seconds"),
            ]
        )
    headers = ["MEMBER", "ZONE", "ADDRESS", "STATE", "HEARTBEAT AGE S", "SHARDS",
               "UPLOADER LAG BYTES", "LAG S"]  # fmt: skip
    zones = ", ".join(f"{zone}: {count}" for zone, count in sorted(report["zones"].items()))
    unowned = [s["shard"] for s in report["shards"] if not s["owner_live"]]
    lines = [
        f"as seen by {report['self']}; live members by zone: {zones or '-'}",
        table(headers, rows),
        "(uploader lag of the others: as of their last heartbeat)",
    ]
    if report["shards"]:
        lines.append(f"shards: {len(report['shards'])}, without a live owner: {unowned or 'none'}")
    return "\n".join(lines)
