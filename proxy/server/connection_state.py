"""The pure state of a client connection: request frame sizes, and answers owed in order.

No I/O here (h11's shape): the connection's two asyncio loops (`connection.py`) read and
write, and ask this state whether a frame size is acceptable and which answers may be
sent now. Kafka answers a connection's requests in the order they came; the proxy, which
answers some here (ApiVersions, tiered partitions) and forwards the rest, queues every
answer owed in request order and sends each once all before it are sent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.apis.api18_api_versions import (
    Ranges,
    check_api_versions_request,
    unsupported_version_response,
)
from proxy.kafka.api_keys import ApiKey
from proxy.kafka.frames import FrameError
from proxy.kafka.headers import (
    RequestHeader,
    header_rejection_reason,
    parse_request_header,
    produce_acks,
    response_header,
)
from proxy.kafka.versions import is_known

if TYPE_CHECKING:
    from proxy.tiered.planners import Plan


class RejectedFrame(FrameError):
    """Bad input from the client; `reason` is the label of `tierproxy_rejected_frames`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_request_size(size: int, max_frame: int) -> None:
    """A request frame's size, judged before any of its body is read."""
    if size < 0:
        raise RejectedFrame("negative_frame_size", f"negative frame size {size}")
    if size > max_frame:
        raise RejectedFrame("oversized_frame", f"frame size {size} exceeds limit {max_frame}")


def read_request_header(frame: memoryview) -> RequestHeader:
    try:
        return parse_request_header(frame)
    except FrameError as exc:
        raise RejectedFrame(header_rejection_reason(frame), str(exc)) from None


def check_forwardable(header: RequestHeader, frame: memoryview) -> bool:
    """Whether a request to forward expects an answer (not a Produce with acks=0);
    RejectedFrame for an API or version the proxy does not know: never forwarded."""
    if not is_known(header.api_key, header.api_version):
        raise RejectedFrame(
            "unsupported_version",
            f"unsupported version {header.api_version} of api key {header.api_key}",
        )
    if header.api_key != ApiKey.PRODUCE:
        return True
    try:
        return produce_acks(header.api_version, frame[header.size :]) != 0
    except FrameError as exc:
        raise RejectedFrame("malformed_request", str(exc)) from None


def api_versions_answer(
    header: RequestHeader,
    body: memoryview,
    encoded_body: Callable[[int], bytes],
    ranges: Callable[[], Ranges],
) -> bytes:
    """The proxy's answer to ApiVersions (its header included, unframed): the versions
    both the proxy and every broker serve (`encoded_body(version)`, encoded once)."""
    if not is_known(ApiKey.API_VERSIONS, header.api_version):
        # as Kafka does: a v0 answer saying UNSUPPORTED_VERSION, so the client downgrades
        return unsupported_version_response(header.correlation_id, ranges())
    try:
        check_api_versions_request(header.api_version, body)
    except FrameError as exc:  # Kafka closes on a body it cannot read
        raise RejectedFrame(
            "malformed_request", f"ApiVersions v{header.api_version} request: {exc}"
        ) from None
    payload = response_header(header.correlation_id, ApiKey.API_VERSIONS, header.api_version)
    return payload + encoded_body(header.api_version)


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
    ready_at: float = 0.0  # perf_counter() when its tiered part was done (stage "answer")


class AnswerOrder:
    """The answers a connection owes (`pending`, in request order) and, among them, those
    a broker is to give (`awaiting_upstream`, in the order they were forwarded: a broker
    answers a connection in order too)."""

    def __init__(self, max_inflight: int) -> None:
        self.max_inflight = max_inflight
        self.pending: deque[Slot] = deque()
        self.awaiting_upstream: deque[Slot] = deque()

    def owe(self, slot: Slot, now: float) -> None:
        slot.read_at = now
        self.pending.append(slot)

    @property
    def has_room(self) -> bool:
        """Whether another request may be read: fewer than the limit are unanswered."""
        return len(self.pending) < self.max_inflight

    @property
    def all_answered(self) -> bool:
        return not self.pending

    def forwarded(self, slot: Slot) -> None:
        self.awaiting_upstream.append(slot)

    def next_from_upstream(self) -> Slot | None:
        """The request upstream's next answer is for (None: an answer to no request)."""
        return self.awaiting_upstream[0] if self.awaiting_upstream else None

    def answered_upstream(self) -> Slot:
        return self.awaiting_upstream.popleft()

    def ready(self) -> Iterator[Slot]:
        """The answers that may be sent now, each taken off the queue as it is yielded."""
        pending = self.pending
        while pending and pending[0].data is not None:
            yield pending.popleft()

    def is_next(self, slot: Slot) -> bool:
        """Whether every answer owed before `slot`'s is sent (its own may be streamed)."""
        return self.pending[0] is slot

    def streamed(self, slot: Slot) -> None:
        """`slot`'s answer was sent as it streamed, never held in the queue."""
        assert self.pending[0] is slot
        self.pending.popleft()
