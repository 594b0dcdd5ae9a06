"""`tierproxy fleet status`: the fleet's members and cross-zone bytes, read from Kafka.

Every proxy's heartbeat carries its cumulative zone byte counts, so reading the
membership topic to its end is enough to sum the whole fleet: no proxy is scraped. The
counts are each proxy's since it started (a restart begins again from zero); members
gone longer than the topic keeps them are not included.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict

from aiokafka import AIOKafkaConsumer, TopicPartition

from proxy.routing.fleet import (
    Heartbeat,
    HeartbeatError,
    cross_zone_bytes,
    crossing_hops,
    decode_heartbeat,
)


async def read_fleet(kafka: dict, topic: str, timeout_s: float = 30.0) -> dict:
    """{name: (heartbeat, age in seconds)} of every member in the topic; `kafka` holds
    aiokafka settings (bootstrap servers, and TLS/SASL as the proxies use them)."""
    consumer = AIOKafkaConsumer(
        **{**kafka, "client_id": "tierproxy-fleet-status"},
        group_id=None,
        enable_auto_commit=False,
    )
    await consumer.start()
    members: dict[str, tuple[Heartbeat, float]] = {}
    try:
        partition = TopicPartition(topic, 0)
        if topic not in await consumer.topics():
            raise LookupError(f"no fleet topic {topic!r} in that cluster")
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        end = (await consumer.end_offsets([partition]))[partition]
        async with asyncio.timeout(timeout_s):
            while await consumer.position(partition) < end:
                batches = await consumer.getmany(partition, timeout_ms=500)
                for record in batches.get(partition, []):
                    if record.key is None:
                        continue
                    name = record.key.decode(errors="replace")
                    if record.value is None:
                        members.pop(name, None)
                        continue
                    try:
                        heartbeat = decode_heartbeat(record.value)
                    except HeartbeatError:
                        continue
                    members[name] = (heartbeat, max(0.0, time.time() - record.timestamp / 1000))
    finally:
        await consumer.stop()
    return members


def summarize(members: dict[str, tuple[Heartbeat, float]], member_timeout_s: float) -> dict:
    """The report: members with their liveness, and the zone byte table summed."""
    totals: dict[tuple[str, str, str, str], int] = defaultdict(int)
    rows = []
    for name, (heartbeat, age) in sorted(members.items()):
        member = heartbeat.member
        rows.append(
            {
                "name": name,
                "zone": member.zone,
                "address": f"{member.host}:{member.bootstrap_port}",
                "live": age <= member_timeout_s,
                "last_heartbeat_s": round(age, 1),
                "uploader_lag_bytes": None
                if heartbeat.uploader_lag is None
                else heartbeat.uploader_lag[0],
            }
        )
        for key, count in heartbeat.zone_bytes.items():
            totals[key] += count
    total_bytes = sum(totals.values())
    crossing = cross_zone_bytes(totals.items())
    return {
        "members": rows,
        "zone_bytes": [
            {
                "client_zone": client,
                "proxy_zone": proxy,
                "broker_zone": broker,
                "direction": direction,
                "bytes": count,
            }
            for (client, proxy, broker, direction), count in sorted(totals.items())
        ],
        "total_bytes": total_bytes,
        "cross_zone_bytes": crossing,
        "client_proxy_cross_zone_bytes": sum(
            count for key, count in totals.items() if crossing_hops(key)[0]
        ),
    }


def render(report: dict) -> str:
    lines = ["members:"]
    for row in report["members"]:
        state = "live" if row["live"] else "DEAD"
        lines.append(
            f"  {row['name']:<24} {row['zone']:<16} {row['address']:<24} {state} "
            f"(last heartbeat {row['last_heartbeat_s']} s ago)"
            + (
                ""
                if row["uploader_lag_bytes"] is None
                else f", uploader lag {row['uploader_lag_bytes']:,} bytes"
            )
        )
    lines.append("bytes by client zone -> proxy zone -> broker zone:")
    for row in report["zone_bytes"]:
        lines.append(
            f"  {row['client_zone']:<12} -> {row['proxy_zone']:<12} -> {row['broker_zone']:<12} "
            f"{row['direction']:<9} {row['bytes']:>16,}"
        )
    total, crossing = report["total_bytes"], report["cross_zone_bytes"]
    lines.append(f"client traffic through the fleet: {total:,} bytes")
    lines.append(
        f"cross-zone bytes (each crossing hop counted): {crossing:,}"
        + (f" ({crossing / total:.3f} per byte)" if total else "")
    )
    lines.append(
        f"of which client -> proxy hops across zones: {report['client_proxy_cross_zone_bytes']:,}"
    )
    return "\n".join(lines)


def fleet_status(kafka: dict, topic: str, member_timeout_s: float, as_json: bool) -> str:
    report = summarize(asyncio.run(read_fleet(kafka, topic)), member_timeout_s)
    return json.dumps(report, indent=2) if as_json else render(report)
