"""The operational sections of the config: `admin` (the HTTP admin API) and `logging`.

Kept apart from proxy/config.py so that file stays about the data path.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from proxy.config.section import ConfigError, Section

MIN_TOKEN_CHARS = 16  # a bearer token shorter than this is guessable by brute force
LOG_FORMATS = ("auto", "text", "json")


@dataclass(frozen=True)
class AdminConfig:
    """GET /healthz, /readyz, /v1/topics, /v1/fleet and /metrics over HTTP.

    `port` None: no admin API; 0: any free port (tests). Off loopback a token is required;
    with a token, every path but /healthz and /readyz needs `Authorization: Bearer <token>`.
    """

    bind_host: str = "127.0.0.1"
    port: int | None = None
    token: str | None = field(default=None, repr=False)  # never printed, never logged

    @property
    def enabled(self) -> bool:
        return self.port is not None


@dataclass(frozen=True)
class LoggingConfig:
    # auto: text on a terminal, JSON otherwise; json: one JSON object a line (proxy/logs.py)
    format: str = "auto"
    access: bool = False  # a `tierproxy.access` line per client connection


def parse_admin(section: Section) -> AdminConfig:
    bind_host = section.string("bind_host", AdminConfig.bind_host)
    try:
        address = ipaddress.ip_address(bind_host)
    except ValueError:
        raise ConfigError(section.key("bind_host"), f"{bind_host!r} is not an IP address") from None
    port = section.port("port", -1)
    token = section.get("token")
    if token is not None and (not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS):
        # the value is a secret: its length is named, never the value
        length = len(token) if isinstance(token, str) else "not a string"
        raise ConfigError(
            section.key("token"),
            f"must be a string of at least {MIN_TOKEN_CHARS} characters (got {length})",
        )
    if port >= 0 and not address.is_loopback and token is None:
        raise ConfigError(
            section.key("token"),
            f"required when admin.bind_host {bind_host} is not a loopback address: "
            "the admin API would be open to the network",
        )
    section.reject_unknown()
    return AdminConfig(bind_host=bind_host, port=None if port < 0 else port, token=token)


def parse_logging(section: Section) -> LoggingConfig:
    config = LoggingConfig(
        format=section.choice("format", LoggingConfig.format, LOG_FORMATS),
        access=section.boolean("access", LoggingConfig.access),
    )
    section.reject_unknown()
    return config
