"""The tiered planners, one per API that `proxy.apis.HANDLING` marks `tiered`.

A client connection of a proxy that tiers topics asks `PLANNERS[api_key]` for each such
request: the plan says which part goes upstream (`upstream_frame`, framed) and which is
under way here (`local`), and how to merge the two answers. None means the request goes
upstream as it came. The per-API planners keep their own signatures; this module gives them one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from proxy.apis import TIERED_API_KEYS, api00_produce, api01_fetch, api02_list_offsets
from proxy.apis import api20_delete_topics as api20
from proxy.apis import api21_delete_records as api21
from proxy.apis import api22_init_producer_id as api22
from proxy.apis import api23_offset_for_leader_epoch as api23
from proxy.apis import api24_add_partitions_to_txn as api24
from proxy.apis import api33_alter_configs as api33
from proxy.apis import api44_incremental_alter_configs as api44
from proxy.apis import api61_describe_producers as api61
from proxy.apis.api00_produce import TopicKey
from proxy.kafka.frames import framed
from proxy.tiered.config_changes import plan_config_changes
from proxy.tiered.deletes import plan_delete_records
from proxy.tiered.epochs import plan_offset_for_leader_epoch
from proxy.tiered.fencing import plan_init_producer_id
from proxy.tiered.fetch import plan_fetch
from proxy.tiered.offsets import plan_list_offsets
from proxy.tiered.produce import plan_produce
from proxy.tiered.producers import plan_describe_producers
from proxy.tiered.topic_deletes import plan_delete_topics
from proxy.tiered.txn import plan_add_partitions_to_txn


class Plan(Protocol):
    """A request split by a proxy that tiers topics (`ProducePlan`, `FetchPlan`, ...)."""

    # The part for upstream, framed (header included); None: nothing goes upstream.
    @property
    def upstream_frame(self) -> tuple[bytes | memoryview, ...] | None: ...

    # The tiered partitions' results, under way; None: nothing tiered (a Produce).
    @property
    def local(self) -> asyncio.Future[Any] | None: ...

    # The passthrough topics counted in flight until upstream answers (cutover drains).
    @property
    def passthrough_topics(self) -> tuple[TopicKey, ...]: ...

    def merge(self, api_version: int, upstream: memoryview | None, local: Any) -> bytes: ...

    def failed(self, error: BaseException) -> Any: ...


@runtime_checkable
class AfterUpstream(Protocol):
    """A plan whose `local` part starts once upstream answered (txn.py, fencing.py)."""

    def upstream_answered(self, api_version: int, upstream: memoryview) -> None:
        """Upstream's answer body (no header), before `local` is awaited and merged."""
        ...


@dataclass(frozen=True, slots=True)
class TieredRequest:
    """A request as a client connection hands it to a planner."""

    head: memoryview  # the request header
    body: memoryview
    api_version: int
    reader: object  # who reads (a Fetch session's owner): one per client connection
    client: str  # the client's address, for the logs


async def _produce(tiering, r: TieredRequest) -> Plan | None:
    return plan_produce(tiering, r.head, r.body, r.api_version)


async def _fetch(tiering, r: TieredRequest) -> Plan | None:
    return await plan_fetch(tiering, r.head, r.body, r.api_version, reader=r.reader)


async def _list_offsets(tiering, r: TieredRequest) -> Plan | None:
    return plan_list_offsets(tiering, r.head, r.body, r.api_version)


async def _delete_topics(tiering, r: TieredRequest) -> Plan | None:
    return plan_delete_topics(tiering, framed(r.head, r.body))


async def _delete_records(tiering, r: TieredRequest) -> Plan | None:
    return await plan_delete_records(tiering, r.head, r.body, r.api_version)


async def _init_producer_id(tiering, r: TieredRequest) -> Plan | None:
    return plan_init_producer_id(tiering, framed(r.head, r.body), r.body, r.api_version)


async def _offset_for_leader_epoch(tiering, r: TieredRequest) -> Plan | None:
    return plan_offset_for_leader_epoch(tiering, r.head, r.body, r.api_version)


async def _add_partitions_to_txn(tiering, r: TieredRequest) -> Plan | None:
    return plan_add_partitions_to_txn(tiering, framed(r.head, r.body), r.body, r.api_version)


async def _describe_producers(tiering, r: TieredRequest) -> Plan | None:
    return plan_describe_producers(tiering, r.head, r.body, r.api_version)


async def _alter_configs(tiering, r: TieredRequest) -> Plan | None:
    return plan_config_changes(tiering, framed(r.head, r.body), api33.read_alter_configs_response)


async def _incremental_alter_configs(tiering, r: TieredRequest) -> Plan | None:
    return plan_config_changes(
        tiering, framed(r.head, r.body), api44.read_incremental_alter_configs_response
    )


# (tiering service, request) -> the plan, or None to forward the request as it came;
# FrameError if the request cannot be read
Planner = Callable[[Any, TieredRequest], Awaitable[Plan | None]]

PLANNERS: dict[int, Planner] = {
    api00_produce.API_KEY: _produce,
    api01_fetch.API_KEY: _fetch,
    api02_list_offsets.API_KEY: _list_offsets,
    api20.API_KEY: _delete_topics,
    api21.API_KEY: _delete_records,
    api22.API_KEY: _init_producer_id,
    api23.API_KEY: _offset_for_leader_epoch,
    api24.API_KEY: _add_partitions_to_txn,
    api33.API_KEY: _alter_configs,
    api44.API_KEY: _incremental_alter_configs,
    api61.API_KEY: _describe_producers,
}
if PLANNERS.keys() != TIERED_API_KEYS:  # the registry and the planners say the same
    raise AssertionError(f"tiered planners {sorted(PLANNERS)} != {sorted(TIERED_API_KEYS)}")


__all__ = ["PLANNERS", "AfterUpstream", "Plan", "Planner", "TieredRequest"]
