"""The orphan sweep: objects no shard names and S3-WAL objects left behind, deleted by one
proxy of the fleet (docs/reliability.md, "Orphans"; the decisions are orphan_plan.py).

The owner of metadata shard 0 runs it, every `orphan_sweep_interval_s`: any proxy reads
every shard (its `ShardReader`s), so one is enough, and shard 0 always has an owner while
the fleet runs. Two owners for a moment (a hand-over) sweep twice by the same rules:
deletes are idempotent.

A round: note the time, list the bucket (ListObjectsV2, paginated by the store), then
read every shard to its end, so that each commit written before the listing is applied
here; a shard that cannot be read to its end in time skips the round (judging from a
stale state could take a committed object for an orphan). Then `plan_sweep`, a last
listing of each offload orphan (a job run again PUTs the very same key), and batched
DeleteObjects.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from proxy.metadata.state import MetadataState
from proxy.objects.store import ObjectInfo, ObjectStore, ObjectStoreError
from proxy.upkeep.orphan_plan import SweepLimits, SweepPlan, plan_sweep, still_old
from proxy.upkeep.ports import UpkeepHost

log = logging.getLogger("tierproxy.orphans")

CATCH_UP_TIMEOUT_S = 30.0
DELETE_BATCH = 1000  # keys per DeleteObjects request (S3's limit)


class SweepMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.registry = r
        self.objects = Counter(
            "tierproxy_orphan_objects_swept",
            "Objects no metadata names deleted by the orphan sweep, by kind "
            "(stream: upload path and compaction, offload, s3wal)",
            ["kind"],
            registry=r,
        )
        self.bytes = Counter(
            "tierproxy_orphan_bytes_swept",
            "Bytes of the objects the orphan sweep deleted, by kind",
            ["kind"],
            registry=r,
        )
        self.rounds = Counter(
            "tierproxy_orphan_sweeps",
            "Orphan sweep rounds, by outcome (done, skipped: metadata not read to its end, failed)",
            ["outcome"],
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@dataclass(frozen=True, slots=True)
class SweepResult:
    plan: SweepPlan
    deleted: tuple[str, ...]


class OrphanSweep:
    """`run()` forever (on the schedule, while `is_sweeper()`), or `run_once()` now."""

    def __init__(
        self,
        store: ObjectStore,
        shard_count: int,
        *,
        state_of: Callable[[int], MetadataState],
        read_to_end: Callable[[int], Awaitable[object]],
        is_sweeper: Callable[[], bool],
        limits: SweepLimits,
        interval_s: float,
        metrics: SweepMetrics | None = None,
        wall_clock: Callable[[], float] = time.time,
        live_writers: Callable[[], Sequence[str]] = tuple,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"tiering.orphan_sweep_interval_s: {interval_s!r} is not positive")
        self.limits, self.interval_s = limits, interval_s
        self.metrics = metrics or SweepMetrics()
        self._store, self._shard_count = store, shard_count
        self._state_of, self._read_to_end = state_of, read_to_end
        self._is_sweeper, self._wall_clock = is_sweeper, wall_clock
        # the writer-id prefixes of the S3-WAL writers running now (objects.writer_prefix)
        self._live_writers = live_writers

    @classmethod
    def for_service(cls, service: UpkeepHost) -> OrphanSweep:
        """The sweep of a started TieringService, configured from its TieringConfig."""
        config = service.config
        assert service.store is not None  # the service is started
        return cls(
            service.store,
            config.shard_count,
            state_of=lambda k: service.readers[k].state,
            read_to_end=lambda k: service.readers[k].read_to_end(),
            is_sweeper=lambda: service.shard_owner(0) is not None,
            limits=SweepLimits(
                config.orphan_grace_s, config.offload_orphan_grace_s, config.s3wal_retention_s
            ),
            interval_s=config.orphan_sweep_interval_s,
            metrics=SweepMetrics(service.registry),
            live_writers=service.live_writer_prefixes,
        )

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if not self._is_sweeper():
                continue
            try:
                await self.run_once()
            except ObjectStoreError as exc:  # the store is down: the next round tries again
                self.metrics.rounds.labels("failed").inc()
                log.warning("orphan sweep failed, next round in %s s: %s", self.interval_s, exc)
            except Exception:  # a metadata reader, or a bug: logged whole, the schedule goes on
                self.metrics.rounds.labels("failed").inc()
                log.exception("orphan sweep failed, next round in %s s", self.interval_s)

    async def run_once(self) -> SweepResult | None:
        """One round; None if the metadata could not be read to its end (skipped)."""
        listed_at = self._wall_clock()
        listed = [info async for info in self._store.list("")]
        try:
            async with asyncio.timeout(CATCH_UP_TIMEOUT_S):
                await asyncio.gather(*(self._read_to_end(k) for k in range(self._shard_count)))
        except TimeoutError:
            self.metrics.rounds.labels("skipped").inc()
            log.warning("orphan sweep skipped: the metadata shards were not read to their end")
            return None
        states = [self._state_of(k) for k in range(self._shard_count)]

        def named(object_id: int) -> bool:
            return any(state.object_commit(object_id) is not None for state in states)

        prefixes = tuple(self._live_writers())

        def live_writer(writer_id: str) -> bool:
            return writer_id.startswith(prefixes)

        plan = plan_sweep(listed, named, listed_at, self.limits, live_writer)
        offload = [info for info in plan.offload_orphans if await self._unchanged(info)]
        deleted: list[str] = []
        for kind, infos in (("stream", plan.orphans), ("offload", offload), ("s3wal", plan.s3wal)):
            deleted.extend(await self._delete(kind, infos))
        self.metrics.rounds.labels("done").inc()
        if deleted or plan.young:
            log.info(
                "orphan sweep: %d deleted (%d orphans, %d offload, %d S3-WAL), %d younger "
                "than their grace, %d named",
                *(len(deleted), len(plan.orphans), len(offload), len(plan.s3wal)),
                *(plan.young, plan.named),
            )
        return SweepResult(plan, tuple(deleted))

    async def _unchanged(self, info: ObjectInfo) -> bool:
        async for again in self._store.list(info.key):
            if again.key == info.key:
                return still_old(info, again)
        return False  # gone already

    async def _delete(self, kind: str, infos: Sequence[ObjectInfo]) -> list[str]:
        done: list[str] = []
        for first in range(0, len(infos), DELETE_BATCH):
            batch = infos[first : first + DELETE_BATCH]
            keys = [info.key for info in batch]
            try:
                await self._store.delete(keys)
            except ObjectStoreError as exc:
                log.warning(
                    "orphan sweep: could not delete %d %s objects: %s", len(keys), kind, exc
                )
                continue
            self.metrics.objects.labels(kind).inc(len(batch))
            self.metrics.bytes.labels(kind).inc(sum(info.size for info in batch))
            done.extend(keys)
        return done
