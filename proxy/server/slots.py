"""A request of a client connection awaiting its answer, in request order."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.tiered.deletes import DeletePlan
from proxy.tiered.epochs import EpochsPlan
from proxy.tiered.fetch import FetchPlan
from proxy.tiered.offsets import OffsetsPlan
from proxy.tiered.produce import ProducePlan
from proxy.tiered.txn_refusal import AddPartitionsPlan

# each has upstream_frame, local, merge, failed
Plan = ProducePlan | FetchPlan | OffsetsPlan | DeletePlan | EpochsPlan | AddPartitionsPlan


@dataclass(slots=True)
class Slot:
    """A request awaiting its answer; `data` is the framed answer, in pieces written one
    after the other, once it is known."""

    correlation_id: int
    api_key: int
    api_version: int
    data: tuple[bytes | bytearray | memoryview, ...] | None = None
    local: bool = False  # answered by the proxy itself, not by a broker
    plan: Plan | None = None  # a request split by a proxy that tiers topics
    read_at: float = 0.0  # perf_counter() when queued, for tierproxy_request_seconds
