"""The proxy's configuration: a YAML file validated at start.

Every error names the key, the value and the reason, e.g.
`config error at listeners.broker_port_base: 70000 is not a port (1..65535)`.
Secrets may come from the environment: a string value `${ENV_NAME}` is replaced by that
variable, and an unset variable is an error naming the key.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from proxy.config.ops import AdminConfig, LoggingConfig, parse_admin, parse_logging
from proxy.config.section import ConfigError, Section
from proxy.config.tiering import TieringConfig, parse_tiering
from proxy.config.workers import check_workers, parse_workers
from proxy.kafka.sasl import MECHANISMS as SASL_MECHANISMS

__all__ = ["ConfigError", "ProxyConfig", "load_config", "parse_config"]


@dataclass(frozen=True)
class TlsConfig:
    enabled: bool = False
    cert_file: Path | None = None
    key_file: Path | None = None
    ca_file: Path | None = None
    # client listener: require client certificates; upstream: verify the broker's name
    client_auth: bool = False
    check_hostname: bool = True


@dataclass(frozen=True)
class SaslConfig:
    """The proxy's own credentials, for its control connection only (Metadata refresh).
    Clients authenticate themselves, through the proxy, with their own."""

    mechanism: str
    username: str
    password: str = field(repr=False)  # never printed, never logged


@dataclass(frozen=True)
class UpstreamConfig:
    bootstrap: tuple[tuple[str, int], ...] = ()
    tls: TlsConfig = field(default_factory=TlsConfig)
    sasl: SaslConfig | None = None
    connect_timeout_s: float = 10.0
    metadata_refresh_s: float = 30.0


PROXY_PROTOCOL_MODES = ("off", "optional", "required")
_PROXY_SIGNATURE_AS_SIZE = 0x0D0A0D0A  # the PROXY v2 signature read as a frame size


@dataclass(frozen=True)
class ListenerConfig:
    bind_host: str = "127.0.0.1"
    advertised_host: str = "127.0.0.1"
    bootstrap_port: int = 19092
    # the listener standing for upstream broker N is at broker_port_base + N
    broker_port_base: int = 19100
    tls: TlsConfig = field(default_factory=TlsConfig)
    # HAProxy PROXY protocol v1/v2 from a load balancer in front: off, optional (a
    # connection may start with a PROXY header), required (every connection must)
    proxy_protocol: str = "off"


@dataclass(frozen=True)
class FleetConfig:
    """This proxy's place in the fleet. `membership: none` is a proxy alone: every broker
    is shown at its own address. `kafka` finds the others through heartbeats on `topic`."""

    name: str = ""  # unique in the fleet; default advertised_host:bootstrap_port
    zone: str = "default"
    membership: str = "none"
    topic: str = "__tierproxy_fleet"
    heartbeat_interval_s: float = 1.0
    member_timeout_s: float = 5.0
    forget_after_s: float = 3600.0


@dataclass(frozen=True)
class RoutingConfig:
    # source network -> zone, for clients whose client.id names no zone
    cidr_zones: tuple[tuple[str, str], ...] = ()
    # how unevenly brokers may spread over a zone's proxies (bounded-load hashing)
    placement_epsilon: float = 0.25


@dataclass(frozen=True)
class MetricsConfig:
    """A Prometheus endpoint (GET /metrics); port 0 or absent: none."""

    bind_host: str = "127.0.0.1"
    port: int = 0


@dataclass(frozen=True)
class LimitsConfig:
    max_frame_bytes: int = 100 * 1024 * 1024  # like Kafka's socket.request.max.bytes
    max_inflight_requests: int = 1000
    buffer_bytes: int = 1024 * 1024  # per direction, before backpressure


@dataclass(frozen=True)
class ProxyConfig:
    upstream: UpstreamConfig
    listeners: ListenerConfig = field(default_factory=ListenerConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    tiering: TieringConfig = field(default_factory=TieringConfig)
    log_level: str = "info"
    admin: AdminConfig = field(default_factory=AdminConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # processes on this host, one fleet member each, sharing the client ports
    # (proxy/config/workers.py; 1: one process, no parent)
    workers: int = 1


def load_config(path: Path) -> ProxyConfig:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError("--config", f"{path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--config", f"{path} is not valid YAML: {exc}") from None
    return parse_config(raw or {})


def parse_config(raw: Any) -> ProxyConfig:
    root = Section(raw, "")
    upstream = root.section("upstream", required=True)
    upstream_config = UpstreamConfig(
        bootstrap=upstream.addresses("bootstrap"),
        tls=_tls(upstream.section("tls"), listener=False),
        sasl=_sasl(upstream.section("sasl")),
        connect_timeout_s=upstream.number("connect_timeout_s", 10.0, minimum=0.1),
        metadata_refresh_s=upstream.number("metadata_refresh_s", 30.0, minimum=1.0),
    )
    listeners = _listeners(root.section("listeners"))
    limits = _limits(root.section("limits"))
    if listeners.proxy_protocol != "off" and limits.max_frame_bytes >= _PROXY_SIGNATURE_AS_SIZE:
        raise ConfigError(
            "limits.max_frame_bytes",
            f"must be below {_PROXY_SIGNATURE_AS_SIZE} with listeners.proxy_protocol on: "
            "a PROXY header's first bytes read as a frame size that large",
        )
    fleet = _fleet(root.section("fleet"), listeners)
    config = ProxyConfig(
        upstream=upstream_config,
        listeners=listeners,
        limits=limits,
        fleet=fleet,
        routing=_routing(root.section("routing")),
        metrics=_metrics(root.section("metrics")),
        tiering=parse_tiering(root.section("tiering"), fleet.name),
        log_level=root.choice("log_level", "info", ("debug", "info", "warning", "error")),
        admin=parse_admin(root.section("admin")),
        logging=parse_logging(root.section("logging")),
        workers=parse_workers(root),
    )
    check_workers(config)
    upstream.reject_unknown()
    root.reject_unknown()
    return config


def _listeners(section: Section) -> ListenerConfig:
    defaults = ListenerConfig()
    bind_host = section.string("bind_host", defaults.bind_host)
    try:
        ipaddress.ip_address(bind_host)
    except ValueError:
        raise ConfigError(section.key("bind_host"), f"{bind_host!r} is not an IP address") from None
    config = ListenerConfig(
        bind_host=bind_host,
        advertised_host=section.string("advertised_host", bind_host),
        bootstrap_port=section.port("bootstrap_port", defaults.bootstrap_port),
        broker_port_base=section.port("broker_port_base", defaults.broker_port_base),
        tls=_tls(section.section("tls"), listener=True),
        proxy_protocol=_proxy_protocol(section),
    )
    section.reject_unknown()
    return config


def _proxy_protocol(section: Section) -> str:
    if section.raw.get("proxy_protocol") is False:  # YAML reads a bare `off` as false
        section.get("proxy_protocol")
        return "off"
    return section.choice("proxy_protocol", "off", PROXY_PROTOCOL_MODES)


def _fleet(section: Section, listeners: ListenerConfig) -> FleetConfig:
    defaults = FleetConfig()
    # A fleet section means a fleet: membership through Kafka unless told otherwise.
    membership_default = "kafka" if section.raw else "none"
    config = FleetConfig(
        name=section.string("name", f"{listeners.advertised_host}:{listeners.bootstrap_port}"),
        zone=_zone_name(section, "zone", defaults.zone),
        membership=section.choice("membership", membership_default, ("none", "kafka")),
        topic=section.string("topic", defaults.topic),
        heartbeat_interval_s=section.number(
            "heartbeat_interval_s", defaults.heartbeat_interval_s, minimum=0.05
        ),
        member_timeout_s=section.number("member_timeout_s", defaults.member_timeout_s, minimum=0.1),
        forget_after_s=section.number("forget_after_s", defaults.forget_after_s, minimum=1.0),
    )
    if config.member_timeout_s < 2 * config.heartbeat_interval_s:
        raise ConfigError(
            section.key("member_timeout_s"),
            f"{config.member_timeout_s} is under two heartbeat intervals "
            f"({config.heartbeat_interval_s} s each): live members would flap",
        )
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,249}", config.topic):
        raise ConfigError(section.key("topic"), f"{config.topic!r} is not a Kafka topic name")
    section.reject_unknown()
    return config


def _routing(section: Section) -> RoutingConfig:
    raw = section.get("cidr_zones")
    key = section.key("cidr_zones")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(key, f"expected a mapping of network to zone, got {raw!r}")
    entries = []
    for cidr, zone in raw.items():
        try:
            ipaddress.ip_network(str(cidr), strict=False)
        except ValueError as exc:
            raise ConfigError(f"{key}.{cidr}", f"not a network: {exc}") from None
        if not isinstance(zone, str) or not _ZONE.fullmatch(zone):
            raise ConfigError(f"{key}.{cidr}", f"{zone!r} is not a zone name")
        entries.append((str(cidr), zone))
    config = RoutingConfig(
        cidr_zones=tuple(entries),
        placement_epsilon=section.number("placement_epsilon", 0.25, minimum=0.0),
    )
    section.reject_unknown()
    return config


def _metrics(section: Section) -> MetricsConfig:
    config = MetricsConfig(
        bind_host=section.string("bind_host", MetricsConfig.bind_host),
        port=section.port("port", 0),
    )
    section.reject_unknown()
    return config


_ZONE = re.compile(r"[A-Za-z0-9._:-]{1,64}")


def _zone_name(section: Section, name: str, default: str) -> str:
    value = section.string(name, default)
    if not _ZONE.fullmatch(value):
        raise ConfigError(
            section.key(name), f"{value!r} is not a zone name (letters, digits, ._:-)"
        )
    return value


def _limits(section: Section) -> LimitsConfig:
    defaults = LimitsConfig()
    config = LimitsConfig(
        max_frame_bytes=section.integer("max_frame_bytes", defaults.max_frame_bytes, minimum=1024),
        max_inflight_requests=section.integer(
            "max_inflight_requests", defaults.max_inflight_requests, minimum=1
        ),
        buffer_bytes=section.integer("buffer_bytes", defaults.buffer_bytes, minimum=4096),
    )
    section.reject_unknown()
    return config


def _sasl(section: Section) -> SaslConfig | None:
    if not section.raw:
        return None
    for name in ("mechanism", "username", "password"):
        if section.raw.get(name) in (None, ""):
            raise ConfigError(section.key(name), "is required with sasl")
    password = section.get("password")
    if not isinstance(password, str):  # a secret: its type is named, never its value
        raise ConfigError(
            section.key("password"), f"is a {type(password).__name__}, not a string (quote it)"
        )
    config = SaslConfig(
        mechanism=section.choice("mechanism", "", SASL_MECHANISMS),
        username=section.string("username", ""),
        password=password,
    )
    section.reject_unknown()
    return config


def _tls(section: Section, listener: bool) -> TlsConfig:
    enabled = section.boolean("enabled", False)
    config = TlsConfig(
        enabled=enabled,
        cert_file=section.path("cert_file"),
        key_file=section.path("key_file"),
        ca_file=section.path("ca_file"),
        client_auth=section.boolean("client_auth", False),
        check_hostname=section.boolean("check_hostname", True),
    )
    if enabled and listener and (config.cert_file is None or config.key_file is None):
        missing = "cert_file" if config.cert_file is None else "key_file"
        raise ConfigError(section.key(missing), "required when TLS is enabled on a listener")
    if config.client_auth and config.ca_file is None:
        raise ConfigError(section.key("ca_file"), "required when client_auth is on")
    section.reject_unknown()
    return config
