"""Replace broker addresses inside a response body, copying every other byte through.

No upstream broker address may reach a client: every response that names a broker has
its host and port replaced by those of the proxy listener standing for that broker. The
proxy decides the mapping (`Advertise`); these functions only apply it.

Every struct that names a broker in Kafka's schemas (Metadata brokers, FindCoordinator,
DescribeCluster brokers, KIP-951 node endpoints) holds the id, host and port as three
consecutive fields. Only that triple is read and rewritten; the walker (`schema_walk`)
finds it and steps over the rest, so fields the proxy does not read, tagged fields
added by a newer broker included, pass through unchanged, and large answers are copied
once, never decoded.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from kio.static.protocol import Entity

from proxy.kafka.codec import describe, response_type
from proxy.kafka.frames import FrameError
from proxy.kafka.schema_walk import (
    field_offset,
    field_span,
    item_type,
    skip_entity,
    tagged_fields_offset,
)
from proxy.kafka.wire import (
    INT32,
    read_array_length,
    read_int32,
    read_string,
    read_tagged_fields,
    write_array_length,
    write_string,
    write_uvarint,
)

# (node id, upstream host, upstream port) -> (host, port) to show the client. Called for
# every broker a response names, so the proxy also learns brokers it had not seen.
Advertise = Callable[[int, str, int], tuple[str, int]]

# (api version, response body after the header, advertise) -> new body. Returns the same
# memoryview when nothing in the body names a broker, so the caller can skip a copy.
Rewriter = Callable[[int, memoryview, Advertise], bytes | memoryview]

F = TypeVar("F", bound=Callable[..., Any])


def _naming_the_message(function: F) -> F:
    """Prefix the FrameError of a truncated or malformed body with the message's name."""

    @functools.wraps(function)
    def wrapper(entity_type: type[Entity], *args: Any, **kwargs: Any) -> Any:
        try:
            return function(entity_type, *args, **kwargs)
        except FrameError as exc:
            raise FrameError(f"malformed {describe(entity_type)}: {exc}") from None

    return wrapper  # type: ignore[return-value]


@_naming_the_message
def rewrite_address(
    entity_type: type[Entity], body: memoryview, advertise: Advertise, id_field: str = "node_id"
) -> bytes | memoryview:
    """The body with the top-level (id, host, port) triple rewritten."""
    _check_triple(entity_type, id_field)
    start = field_offset(entity_type, body, id_field)
    triple, end = _address(body, start, entity_type.__flexible__, advertise)
    if triple is None:
        return body
    return b"".join((body[:start], triple, body[end:]))


@_naming_the_message
def rewrite_address_array(
    entity_type: type[Entity],
    name: str,
    body: memoryview,
    advertise: Advertise,
    id_field: str = "node_id",
) -> bytes | memoryview:
    """The body with the triple of every item of top-level array `name` rewritten."""
    start = field_offset(entity_type, body, name)
    pieces: list[bytes | memoryview] = [body[:start]]
    end = _rewrite_array(item_type(entity_type, name), id_field, body, start, advertise, pieces)
    if len(pieces) == 1:
        return body
    pieces.append(body[end:])
    return b"".join(pieces)


@_naming_the_message
def rewrite_tagged_address_array(
    entity_type: type[Entity],
    name: str,
    body: memoryview,
    advertise: Advertise,
    id_field: str = "node_id",
) -> bytes | memoryview:
    """As `rewrite_address_array`, for an array in the top-level tagged fields."""
    start = tagged_fields_offset(entity_type, body)
    fields = rewrite_tagged_fields(entity_type, name, body[start:], advertise, id_field)
    if fields is None:
        return body
    return b"".join((body[:start], *encode_tagged_fields(fields)))


def rewrite_tagged_fields(
    entity_type: type[Entity],
    name: str,
    section: memoryview,
    advertise: Advertise,
    id_field: str = "node_id",
) -> list[tuple[int, bytes | memoryview]] | None:
    """The (tag, value) pairs of a top-level tagged-field section (nothing after it), with
    the triple of every item of the tagged array `name` rewritten; None if none changed."""
    tag = entity_type.__dataclass_fields__[name].metadata["tag"]
    fields, end = read_tagged_fields(section, 0)
    if end != len(section):
        raise FrameError(f"{len(section) - end} bytes after the tagged fields")
    spans = [(value_start, value_end) for each, value_start, value_end in fields if each == tag]
    if not spans:
        return None
    value = section[spans[0][0] : spans[0][1]]
    pieces: list[bytes | memoryview] = []
    used = _rewrite_array(item_type(entity_type, name), id_field, value, 0, advertise, pieces)
    if used != len(value):
        raise FrameError(f"tagged field {tag} holds {len(value)} bytes, its value {used}")
    if not pieces:
        return None
    new_value = b"".join(pieces)
    return [
        (each, new_value if each == tag else section[each_start:each_end])
        for each, each_start, each_end in fields
    ]


def encode_tagged_fields(fields: list[tuple[int, bytes | memoryview]]) -> list[bytes | memoryview]:
    """A tagged-field section of these (tag, value) pairs, in pieces."""
    section: list[bytes | memoryview] = [write_uvarint(len(fields))]
    for tag, value in fields:
        section += (write_uvarint(tag), write_uvarint(len(value)), value)
    return section


@_naming_the_message
def empty_array(entity_type: type[Entity], name: str, body: memoryview) -> bytes | memoryview:
    """The body with top-level array `name` emptied."""
    start, end = field_span(entity_type, body, name)
    count, _ = read_array_length(body, start, entity_type.__flexible__)
    if count <= 0:
        return body
    return b"".join((body[:start], write_array_length(0, entity_type.__flexible__), body[end:]))


def _rewrite_array(
    item_type: type[Entity],
    id_field: str,
    buf: memoryview,
    offset: int,
    advertise: Advertise,
    pieces: list[bytes | memoryview],
) -> int:
    """Append to `pieces` the array at `offset` with its addresses rewritten, if any
    changed; return the offset after the array."""
    _check_triple(item_type, id_field)
    flexible = item_type.__flexible__
    copied_up_to = offset
    count, offset = read_array_length(buf, offset, flexible)
    changes: list[bytes | memoryview] = []
    for _ in range(max(count, 0)):
        triple_start = field_offset(item_type, buf, id_field, offset)
        triple, triple_end = _address(buf, triple_start, flexible, advertise)
        offset = skip_entity(item_type, buf, offset)
        if triple is not None:
            changes += (buf[copied_up_to:triple_start], triple)
            copied_up_to = triple_end
    if changes:
        pieces += changes
        pieces.append(buf[copied_up_to:offset])
    return offset


def _address(
    buf: memoryview, offset: int, flexible: bool, advertise: Advertise
) -> tuple[bytes | None, int]:
    """(new encoding of the triple at offset or None if it names no broker, its end)."""
    node_id, pos = read_int32(buf, offset)
    host, pos = read_string(buf, pos, flexible)
    port, end = read_int32(buf, pos)
    if node_id < 0:  # Kafka's Node.noNode() (-1, "", -1), sent with an error: no broker
        return None, end
    if host is None:
        raise FrameError(f"null host for node {node_id} at byte {offset}")
    new_host, new_port = advertise(node_id, host, port)
    return INT32.pack(node_id) + write_string(new_host, flexible) + INT32.pack(new_port), end


@functools.cache
def _check_triple(entity_type: type[Entity], id_field: str) -> None:
    """Fail loudly, once, if a kio upgrade broke the id/host/port layout relied on."""
    fields = [f for f in dataclasses.fields(entity_type) if "tag" not in f.metadata]
    names = [f.name for f in fields]
    at = names.index(id_field)
    layout = [(f.name, f.metadata.get("kafka_type")) for f in fields[at : at + 3]]
    if layout != [(id_field, "int32"), ("host", "string"), ("port", "int32")]:
        raise TypeError(f"{entity_type.__name__}: no ({id_field}, host, port) triple: {layout}")


def node_endpoints_rewriter(api_key: int, first_version: int, responses: dict) -> Rewriter:
    """The rewriter of an answer whose only broker addresses are KIP-951 node endpoints
    (Produce, Fetch): a top-level tagged field present from `first_version` on."""

    def rewrite_response(
        api_version: int, body: memoryview, advertise: Advertise
    ) -> bytes | memoryview:
        response = response_type(responses, api_key, api_version)  # checks the version
        if api_version < first_version:
            return body
        return rewrite_tagged_address_array(response, "node_endpoints", body, advertise)

    return rewrite_response
