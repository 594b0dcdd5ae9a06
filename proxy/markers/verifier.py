"""KIP-890 partition verification of tiered partitions, the asyncio runner of verify.py
(docs/tiering.md, "Transactions": verification).

`TxnVerifier.verify(...)` is what a partition's owner awaits before it sequences the
first transactional batch of a producer with no transaction open there
(proxy/partition/txn_gate.py): None once the coordinator said the partition is in the
producer's ongoing transaction with that epoch, else the answer to give the Produce.

One coordinator round trip: the coordinator of a transactional id is looked up once
(FindCoordinator, cached until it answers NOT_COORDINATOR or cannot be reached), then
AddPartitionsToTxn v4 with `verify_only`. The verifications asked in the same turn of
the event loop (the partitions of one Produce, several producers) go in one request per
coordinator, as Kafka's AddPartitionsToTxnManager batches them per node. A coordinator
that cannot be reached answers NOT_ENOUGH_REPLICAS (retriable), as Kafka does; a broker
too old for v4 is not asked (the batch is appended, logged once), as Kafka does.
"""

from __future__ import annotations

import asyncio
import io
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from aiokafka import AIOKafkaClient
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError
from aiokafka.protocol.api import Request, RequestStruct
from aiokafka.protocol.types import Schema
from kio.schema.errors import ErrorCode
from prometheus_client import CollectorRegistry, Counter

from proxy.apis.api24_add_partitions_to_txn import Key
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.frames import FrameError
from proxy.markers.upstream_log import Bootstrap
from proxy.markers.verify import (
    VERIFY_VERSION,
    Verification,
    coordinator_codes,
    produce_refusal,
    read_verify_answer,
    verify_request,
)
from proxy.metadata.client_start import start_client
from proxy.partition.rules import ProduceResult

log = logging.getLogger("tierproxy.transactions")

TRANSACTION_COORDINATOR = 1  # FindCoordinator's key type for a transactional id
TIMEOUT_S = 10.0  # a verification not answered by then is answered retriable
_UNSUPPORTED = -1  # internal: the broker does not serve AddPartitionsToTxn v4


class _RawResponse:
    """aiokafka's response type for a body read by hand (verify.py): the bytes as they came."""

    @classmethod
    def decode(cls, data: io.BytesIO | bytes) -> bytes:
        return data.read() if isinstance(data, io.BytesIO) else bytes(data)


class _VerifyStruct(RequestStruct):
    """An AddPartitionsToTxn v4 body encoded with kio, sent through aiokafka's client."""

    API_KEY = int(ApiKey.ADD_PARTITIONS_TO_TXN)
    API_VERSION = VERIFY_VERSION
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE: ClassVar[Any] = _RawResponse
    SCHEMA = Schema()

    def __init__(self, body: bytes) -> None:
        super().__init__()
        self.__dict__["body"] = body

    def encode(self) -> bytes:
        return self.__dict__["body"]


class _VerifyRequest(Request[_VerifyStruct]):
    API_KEY = int(ApiKey.ADD_PARTITIONS_TO_TXN)

    def __init__(self, body: bytes) -> None:
        self._body = body

    def build(self, request_struct_class: type[_VerifyStruct]) -> _VerifyStruct:
        return request_struct_class(self._body)


class VerifierMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self._registry = registry
        self.verifications = Counter(
            "tierproxy_txn_verifications",
            "Transactional batches of tiered partitions verified with the coordinator (KIP-890)",
            registry=registry,
        )
        self.refused = Counter(
            "tierproxy_txn_verifications_refused",
            "Verified transactional batches refused, by the error answered",
            ["error"],
            registry=registry,
        )

    def close(self) -> None:
        if self._registry is not None:
            for metric in (self.verifications, self.refused):
                self._registry.unregister(metric)


@dataclass(eq=False, slots=True)
class _Asked:
    """The verifications of one transaction (id, producer id, epoch) asked in one turn."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    waiters: dict[Key, list[asyncio.Future[int]]] = field(default_factory=dict)

    def verification(self) -> Verification:
        return Verification(
            self.transactional_id, self.producer_id, self.producer_epoch, tuple(self.waiters)
        )

    def answer(self, codes: dict[Key, int]) -> None:
        for key, futures in self.waiters.items():
            for future in futures:
                if not future.done():
                    future.set_result(codes.get(key, 0))

    def answer_all(self, code: int) -> None:
        self.answer(dict.fromkeys(self.waiters, code))


class TxnVerifier:
    """`start()`, `verify(...)`, `close()`."""

    def __init__(
        self,
        kafka_settings: dict,
        registry: CollectorRegistry | None = None,
        *,
        timeout_s: float = TIMEOUT_S,
    ) -> None:
        self._settings = dict(kafka_settings)
        self._timeout_s = timeout_s
        self.metrics = VerifierMetrics(registry)
        self._client: AIOKafkaClient | None = None
        self._coordinators: dict[str, int] = {}  # transactional id -> node id
        self._asked: dict[tuple[str, int, int], _Asked] = {}
        self._flush: asyncio.Handle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._unsupported_logged = False

    async def start(self) -> None:
        settings = self._settings
        settings["client_id"] = f"{settings.get('client_id', 'tierproxy')},txn-verify"
        self._client = AIOKafkaClient(**settings)
        await start_client(Bootstrap(self._client))

    async def close(self) -> None:
        if self._flush is not None:
            self._flush.cancel()
        for asked in self._asked.values():
            asked.answer_all(ErrorCode.coordinator_not_available.value)
        self._asked.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        self.metrics.close()

    async def verify(
        self,
        transactional_id: str,
        produce_version: int,
        key: Key,
        producer_id: int,
        producer_epoch: int,
    ) -> ProduceResult | None:
        """None if `key` is in the producer's ongoing transaction with this epoch, else
        the Produce answer (verify.produce_refusal)."""
        self.metrics.verifications.inc()
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        ident = (transactional_id, producer_id, producer_epoch)
        asked = self._asked.get(ident)
        if asked is None:
            asked = self._asked[ident] = _Asked(transactional_id, producer_id, producer_epoch)
        asked.waiters.setdefault(key, []).append(future)
        if self._flush is None:  # the rest of this turn's verifications join the request
            self._flush = asyncio.get_running_loop().call_soon(self._send_asked)
        code = await future
        if code == _UNSUPPORTED:
            return None
        refusal = produce_refusal(code, produce_version)
        if refusal is not None:
            self.metrics.refused.labels(ErrorCode(refusal.error_code).name.upper()).inc()
        return refusal

    def _send_asked(self) -> None:
        self._flush = None
        asked, self._asked = list(self._asked.values()), {}
        task = asyncio.ensure_future(self._send(asked))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, asked: list[_Asked]) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                nodes = await asyncio.gather(*(self._coordinator(a) for a in asked))
                by_node: dict[int, list[_Asked]] = {}
                for entry, node in zip(asked, nodes, strict=True):
                    if node is not None:
                        by_node.setdefault(node, []).append(entry)
                await asyncio.gather(
                    *(
                        self._ask(node, batch)
                        for node, entries in by_node.items()
                        for batch in _distinct_ids(entries)
                    )
                )
        except TimeoutError:
            log.warning("transaction verification not answered within %s s", self._timeout_s)
        finally:  # whatever was not answered: the coordinator could not be asked
            for entry in asked:
                entry.answer_all(ErrorCode.network_exception.value)

    async def _coordinator(self, asked: _Asked) -> int | None:
        """The coordinator's node id of the transaction, None (and `asked` answered) if it
        cannot be found."""
        transactional_id = asked.transactional_id
        node = self._coordinators.get(transactional_id)
        if node is not None:
            return node
        client = self._client
        if client is None:
            asked.answer_all(ErrorCode.coordinator_not_available.value)
            return None
        try:
            node = await client.coordinator_lookup(TRANSACTION_COORDINATOR, transactional_id)
        except KafkaError as exc:
            code = getattr(exc, "errno", None)
            log.info("no coordinator for transactional id %r: %r", transactional_id, exc)
            asked.answer_all(
                code
                if isinstance(code, int) and code > 0
                else ErrorCode.coordinator_not_available.value
            )
            return None
        self._coordinators[transactional_id] = node
        return node

    async def _ask(self, node: int, entries: list[_Asked]) -> None:
        client = self._client
        assert client is not None
        verifications = [entry.verification() for entry in entries]
        try:
            body = await client.send(node, _VerifyRequest(verify_request(verifications)))
            answer = read_verify_answer(body)
        except (IncompatibleBrokerVersion, NotImplementedError):
            if not self._unsupported_logged:
                log.warning(
                    "broker %d does not serve AddPartitionsToTxn v%d: transactional batches of "
                    "tiered partitions are not verified (as Kafka does)",
                    node,
                    VERIFY_VERSION,
                )
                self._unsupported_logged = True
            for entry in entries:
                entry.answer_all(_UNSUPPORTED)
            return
        except (KafkaError, OSError, FrameError) as exc:
            log.warning("transaction verification with broker %d failed: %r", node, exc)
            self._forget(entries)
            for entry in entries:
                entry.answer_all(ErrorCode.network_exception.value)
            return
        if answer.error_code:
            log.error(
                "the coordinator (broker %d) answered AddPartitionsToTxn with error %d",
                node,
                answer.error_code,
            )
        for entry, verification in zip(entries, verifications, strict=True):
            codes = coordinator_codes(answer, verification)
            if ErrorCode.not_coordinator.value in codes.values():
                self._forget([entry])
            entry.answer(codes)

    def _forget(self, entries: list[_Asked]) -> None:
        for entry in entries:
            self._coordinators.pop(entry.transactional_id, None)


def _distinct_ids(entries: list[_Asked]) -> list[list[_Asked]]:
    """Requests in which each transactional id appears once (the answer is keyed by it)."""
    batches: list[list[_Asked]] = []
    for entry in entries:
        for batch in batches:
            if all(e.transactional_id != entry.transactional_id for e in batch):
                batch.append(entry)
                break
        else:
            batches.append([entry])
    return batches
