"""kio's schema classes per API version, and whole-message decode/encode with kio.

The proxy encodes with kio (its writers are plain Python) but never decodes bytes from
the network with it. kio 0.6.5's native reader
- sizes an allocation from an array count it has just read, so one corrupt count aborts
  the whole interpreter ("memory allocation of 159266111472 bytes failed"), and
- raises KeyError on a tagged field it does not know, while Kafka adds tagged fields to
  existing versions without a version bump.
So the proxy reads by hand what it must (`headers`, `rewrite`, `schema_walk`), checks a
body it must not forward malformed with `schema_walk.validate`, and `decode` is for
tests and for bytes the proxy produced itself.
"""

from __future__ import annotations

import importlib
import io
import re
from typing import Any, TypeVar

from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from proxy.kafka.frames import FrameError
from proxy.kafka.versions import APIS, api_name

E = TypeVar("E")
# SerialError for short or bad input; ValueError for values kio cannot build (an error
# code it does not know); KeyError for a tagged field it does not know.
_KIO_DECODE_ERRORS = (SerialError, ValueError, KeyError)


def load_types(api_key: int, kind: str = "response") -> dict[int, type]:
    """{version: kio class} of this API's "request" or "response", for every version."""
    api = APIS[api_key]
    module = re.sub(r"(?<!^)(?=[A-Z])", "_", api.name).lower()  # FindCoordinator: find_coordinator
    return {
        version: getattr(
            importlib.import_module(f"kio.schema.{module}.v{version}.{kind}"),
            f"{api.name}{kind.title()}",
        )
        for version in range(api.min_version, api.max_version + 1)
    }


def load_response_types(api_key: int) -> dict[int, type]:
    return load_types(api_key, "response")


def response_type(types: dict[int, type], api_key: int, api_version: int) -> type:
    """The kio class for this version, or FrameError naming the API and version."""
    try:
        return types[api_version]
    except KeyError:
        raise FrameError(
            f"unsupported version {api_version} of {api_name(api_key)} (api key {api_key})"
        ) from None


def describe(entity_type: type) -> str:
    return f"{entity_type.__name__} v{entity_type.__version__}"


def decode(entity_type: type[E], body: memoryview | bytes) -> E:
    """The whole body as a kio dataclass; FrameError if it is malformed or has extra bytes.

    Not for bytes from the network: see the module docstring.
    """
    try:
        value, size = entity_reader(entity_type)(body, 0)
    except _KIO_DECODE_ERRORS as exc:
        raise FrameError(f"malformed {describe(entity_type)}: {exc}") from None
    if size != len(body):
        raise FrameError(f"{len(body) - size} bytes after the end of {describe(entity_type)}")
    return value


def encode(value: Any) -> bytes:
    out = io.BytesIO()
    entity_writer(type(value))(out, value)
    return out.getvalue()
