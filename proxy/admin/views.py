"""What the admin API answers, as plain JSON values built from a proxy's state.

Run on the proxy's event loop (the state's owner), so nothing here takes a lock. No
value here comes from the configuration's secrets: only names, zones, addresses,
offsets and counts.

Readiness (GET /readyz) is the AND of these checks, each reported with its reason:
- `upstream`: the last refresh of the upstream cluster's brokers and API versions
  answered (it runs every `upstream.metadata_refresh_s`);
- `fleet`: with `fleet.membership: kafka`, this proxy's own heartbeat came back from
  the membership topic within `fleet.member_timeout_s` (other proxies see it alive);
- `tiering` (when on): the metadata shards were read to their end at start, every shard
  the group assigned to this proxy is owned (claimed and its partitions recovered from
  the WAL), and neither the WAL nor the uploader is stopped by an error.
A shard owned by no live member is reported (`shards_without_live_owner`) but does not
make this proxy unready: during a rolling upgrade that is another proxy's state.
"""

from __future__ import annotations

import time

from proxy.metadata.streams import shard_of


def health(proxy) -> dict:
    member = proxy.fleet.self_member
    return {
        "status": "ok",
        "name": member.name,
        "zone": member.zone,
        "uptime_s": round(time.time() - proxy.started_at, 1),
    }


def readiness(proxy) -> tuple[bool, dict]:
    checks = {"upstream": _upstream_check(proxy), "fleet": _fleet_check(proxy)}
    if proxy.tiering is not None:
        checks["tiering"] = _tiering_check(proxy.tiering)
    ready = all(check["ok"] for check in checks.values())
    return ready, {"ready": ready, "checks": checks}


def _upstream_check(proxy) -> dict:
    error = getattr(proxy, "upstream_error", None)
    if error:
        return {"ok": False, "reason": f"the last upstream refresh failed: {error}"}
    return {"ok": True, "brokers": len(proxy.brokers.brokers())}


def _fleet_check(proxy) -> dict:
    fleet = proxy.fleet
    if proxy.config.fleet.membership != "kafka":
        return {"ok": True, "membership": "none"}
    seen = fleet.heartbeats().get(fleet.self_member.name)
    if seen is None:
        return {"ok": False, "reason": "this proxy's heartbeat has not come back yet"}
    age = time.time() - seen[1]
    if age > fleet.member_timeout_s:
        return {"ok": False, "reason": f"this proxy's last heartbeat came back {age:.1f} s ago"}
    return {"ok": True, "live_members": len(fleet.live())}


def _tiering_check(tiering) -> dict:
    assignment = tiering.assignment
    if assignment is None or tiering.wal is None:
        return {"ok": False, "reason": "tiering is starting"}
    assigned, owned = assignment.assigned(), assignment.owned()
    check: dict = {
        "ok": True,
        "assigned_shards": assigned,
        "owned_shards": owned,
        "shards_without_live_owner": _shards_without_live_owner(tiering),
    }
    reasons = []
    if set(assigned) - set(owned):
        waiting = sorted(set(assigned) - set(owned))
        held = assignment.held()
        reasons.append(
            f"shards {waiting} assigned and not owned yet"
            + (f" (waiting for their last owners {held})" if held else "")
        )
    if tiering.wal.broken is not None:
        reasons.append(f"the WAL is broken: {tiering.wal.broken!r}")
    uploader = tiering.uploader
    if uploader is not None and uploader.failed is not None:
        reasons.append(f"the uploader stopped: {uploader.failed}")
    if reasons:
        check.update(ok=False, reason="; ".join(reasons))
    return check


def _shards_without_live_owner(tiering) -> list[int]:
    live = {member.name for member in tiering.proxy.fleet.live()}
    return [
        reader.shard
        for reader in tiering.readers
        if not reader.state.owner or reader.state.released or reader.state.owner not in live
    ]


def fleet(proxy) -> dict:
    """The members this proxy has heard from, the shards' owners, and each member's
    uploader lag: this proxy's now, the others' from their last heartbeat."""
    view, now = proxy.fleet, time.time()
    live = {member.name for member in view.live()}
    owners: dict[str, list[int]] = {}
    shards = []
    if proxy.tiering is not None:
        for reader in proxy.tiering.readers:
            state = reader.state
            holder = "" if state.released else state.owner
            shards.append(
                {
                    "shard": reader.shard,
                    "owner": holder,
                    "epoch": state.epoch,
                    "owner_live": holder in live,
                }
            )
            if holder:
                owners.setdefault(holder, []).append(reader.shard)
    heard = view.heartbeats()
    names = sorted(set(heard) | {view.self_member.name})
    members = []
    for name in names:
        heartbeat, seen_at = heard.get(name, (None, now))
        member = heartbeat.member if heartbeat is not None else view.self_member
        row = {
            "name": name,
            "zone": member.zone,
            "address": f"{member.host}:{member.bootstrap_port}",
            "live": name in live,
            "last_heartbeat_s": None if heartbeat is None else round(now - seen_at, 1),
            "peer_port": heartbeat.peer_port if heartbeat is not None else None,
            "shards": owners.get(name, []),
            "self": name == view.self_member.name,
        }
        if row["self"]:
            row["uploader"] = uploader_lag(proxy)
        elif heartbeat is not None and heartbeat.uploader_lag is not None:
            lag_bytes, lag_seconds = heartbeat.uploader_lag  # as of its last heartbeat
            row["uploader"] = {"lag_bytes": lag_bytes, "lag_seconds": lag_seconds}
        members.append(row)
    zones: dict[str, int] = {}
    for member in view.live():
        zones[member.zone] = zones.get(member.zone, 0) + 1
    return {"self": view.self_member.name, "zones": zones, "members": members, "shards": shards}


def uploader_lag(proxy) -> dict | None:
    """This proxy's WAL bytes not yet uploaded and how long the oldest has waited."""
    tiering = proxy.tiering
    if tiering is None or tiering.uploader is None:
        return None
    uploader = tiering.uploader
    return {
        "lag_bytes": uploader.stats.backlog_bytes,
        "lag_seconds": round(uploader.backlog_seconds, 3),
        "failed": None if uploader.failed is None else str(uploader.failed),
    }


def topics(proxy, upstream: dict[str, int]) -> list[dict]:
    """Every topic: Kafka's (name -> partition count, internal ones left out) and the
    tiered ones; tiered topics with their partitions (see `tiered_partitions`)."""
    tiered = {t.name: t for t in proxy.tiering.topics.topics()} if proxy.tiering else {}
    rows = []
    for name in sorted(set(upstream) | set(tiered)):
        if name.startswith("__") and name not in tiered:
            continue
        rows.append(topic(proxy, name, upstream.get(name)))
    return rows


def topic(proxy, name: str, partitions: int | None) -> dict:
    tiering = proxy.tiering
    found = tiering.topics.topic(name) if tiering is not None else None
    if found is None:
        return {"topic": name, "mode": "passthrough", "partitions": partitions}
    streams = tiered_partitions(tiering, found.topic_id)
    return {
        "topic": name,
        "mode": "tiered",
        "topic_id": str(found.topic_id),
        "tiered_since_ms": found.since_ms,
        "partitions": partitions if partitions is not None else len(streams),
        "tiered_partitions": streams,
    }


def tiered_partitions(tiering, topic_id) -> list[dict]:
    """Per partition cut over: Kafka holds [log start, cutover) until offloaded, the
    proxy the rest; `committed_end` is what objects hold, `high_watermark` includes the
    WAL (known where the partition's owner is this proxy)."""
    rows = []
    for reader in tiering.readers:
        state = reader.state
        for stream in state.stream_ids():
            info = state.stream(stream)
            if info is None or info.topic_id != topic_id:
                continue
            ranges = state.committed_ranges(stream)
            objects = {r.object_id: r.object_size for r in ranges}
            partition = tiering.partitions.get(stream) if tiering.partitions else None
            rows.append(
                {
                    "partition": info.partition,
                    "stream_id": stream,
                    "shard": shard_of(stream, tiering.config.shard_count),
                    "owner": state.owner,
                    "cutover_offset": info.cutover_offset,
                    "log_start_offset": info.log_start_offset,
                    "committed_end_offset": info.end_offset,
                    "high_watermark": None if partition is None else partition.high_watermark,
                    "objects": len(objects),
                    # a stream set object holds other streams too: counted whole
                    "object_bytes": sum(objects.values()),
                    "offsets_only_in_kafka": sum(e - s for s, e in state.backfill_gaps(stream)),
                }
            )
    return sorted(rows, key=lambda row: row["partition"])
