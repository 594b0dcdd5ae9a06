"""A bad config names the key and the reason; a good one gives typed settings."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError, load_config, parse_config


def test_minimal_config_gets_defaults():
    config = parse_config({"upstream": {"bootstrap": "kafka-1:9092, kafka-2:9093"}})
    assert config.upstream.bootstrap == (("kafka-1", 9092), ("kafka-2", 9093))
    assert config.limits.max_frame_bytes == 100 * 1024 * 1024
    assert config.listeners.bootstrap_port == 19092


@pytest.mark.parametrize(
    ("raw", "key", "reason"),
    [
        ({}, "upstream", "is required"),
        ({"upstream": {}}, "upstream.bootstrap", "is required"),
        ({"upstream": {"bootstrap": "nohost"}}, "upstream.bootstrap", "'nohost' is not host:port"),
        (
            {"upstream": {"bootstrap": "k:1"}, "listeners": {"bootstrap_port": 70000}},
            "listeners.bootstrap_port",
            "70000 is not a port",
        ),
        (
            {"upstream": {"bootstrap": "k:1"}, "limits": {"max_frame_bytes": "big"}},
            "limits.max_frame_bytes",
            "'big' is not a whole number",
        ),
        (
            {"upstream": {"bootstrap": "k:1"}, "listeners": {"tls": {"enabled": True}}},
            "listeners.tls.cert_file",
            "required when TLS is enabled",
        ),
        ({"upstream": {"bootstrap": "k:1", "bootstrapp": 1}}, "upstream.bootstrapp", "not a known"),
        ({"upstream": {"bootstrap": "k:1"}, "log_level": "loud"}, "log_level", "not one of"),
        (
            {"upstream": {"bootstrap": "k:1"}, "listeners": {"bind_host": "example"}},
            "listeners.bind_host",
            "not an IP address",
        ),
        (
            {"upstream": {"bootstrap": "${TIERPROXY_TEST_UNSET_VARIABLE}"}},
            "upstream.bootstrap",
            "is not set",
        ),
    ],
)
def test_bad_config_names_key_and_reason(raw, key, reason):
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    assert caught.value.key == key
    assert reason in caught.value.reason
    assert key in str(caught.value)


def test_environment_reference_is_resolved(monkeypatch):
    monkeypatch.setenv("TIERPROXY_TEST_BOOTSTRAP_ADDR", "secret-host:9092")
    config = parse_config({"upstream": {"bootstrap": "${TIERPROXY_TEST_BOOTSTRAP_ADDR}"}})
    assert config.upstream.bootstrap == (("secret-host", 9092),)


def test_load_config_reports_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("upstream: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_sasl_settings_are_checked_and_the_password_never_printed(monkeypatch):
    monkeypatch.setenv("TIERPROXY_TEST_SASL_PASSWORD", "s3cret-value")
    config = parse_config(
        {
            "upstream": {
                "bootstrap": "k:1",
                "sasl": {
                    "mechanism": "SCRAM-SHA-512",
                    "username": "proxy",
                    "password": "${TIERPROXY_TEST_SASL_PASSWORD}",
                },
            }
        }
    )
    assert config.upstream.sasl is not None
    assert config.upstream.sasl.password == "s3cret-value"
    assert "s3cret-value" not in repr(config)
    with pytest.raises(ConfigError) as missing:
        parse_config({"upstream": {"bootstrap": "k:1", "sasl": {"mechanism": "PLAIN"}}})
    assert missing.value.key == "upstream.sasl.username"
    with pytest.raises(ConfigError) as unknown:
        parse_config(
            {
                "upstream": {
                    "bootstrap": "k:1",
                    "sasl": {"mechanism": "GSSAPI", "username": "u", "password": "p"},
                }
            }
        )
    assert unknown.value.key == "upstream.sasl.mechanism"
    assert "'GSSAPI' is not one of PLAIN" in unknown.value.reason


def test_shipped_example_configs_parse(monkeypatch):
    root = __import__("pathlib").Path(__file__).resolve().parents[2] / "configs"
    local = load_config(root / "local.yaml")
    assert local.upstream.bootstrap == (("127.0.0.1", 9092),)
    fleet = load_config(root / "fleet.yaml")
    assert fleet.fleet.membership == "kafka" and fleet.fleet.zone == "eu-west-1a"
    assert dict(fleet.routing.cidr_zones)["10.0.2.0/24"] == "eu-west-1b"
    assert fleet.listeners.proxy_protocol == "off"
    assert not fleet.tiering.enabled
    tiered = load_config(root / "tiered.yaml").tiering
    assert tiered.enabled and tiered.shard_count == 16 and tiered.peer_port == 19090
    assert tiered.object_store.kind == "s3" and tiered.object_store.s3.bucket.startswith("tier")
    assert tiered.unclean_takeover_after_s is None
    # the production example names files of a real deployment: here they are missing
    monkeypatch.setenv("TIERPROXY_SASL_PASSWORD", "x")
    with pytest.raises(ConfigError) as missing:
        load_config(root / "tls-sasl.yaml")
    assert missing.value.key == "upstream.tls.ca_file"


def test_fleet_routing_and_metrics_sections():
    config = parse_config(
        {
            "upstream": {"bootstrap": "k:1"},
            "listeners": {"advertised_host": "proxy-a1", "proxy_protocol": "optional"},
            "fleet": {"zone": "eu-west-1a", "heartbeat_interval_s": 0.5},
            "routing": {"cidr_zones": {"10.1.0.0/16": "eu-west-1a", "10.2.0.0/16": "eu-west-1b"}},
            "metrics": {"port": 9404},
        }
    )
    assert config.fleet.membership == "kafka"  # a fleet section means a fleet
    assert config.fleet.name == "proxy-a1:19092"
    assert config.fleet.zone == "eu-west-1a"
    assert config.routing.cidr_zones == (
        ("10.1.0.0/16", "eu-west-1a"),
        ("10.2.0.0/16", "eu-west-1b"),
    )
    assert config.listeners.proxy_protocol == "optional"
    assert config.metrics.port == 9404
    alone = parse_config({"upstream": {"bootstrap": "k:1"}})
    assert alone.fleet.membership == "none" and alone.metrics.port == 0


@pytest.mark.parametrize(
    ("settings", "key", "reason"),
    [
        ({"fleet": {"zone": "a b"}}, "fleet.zone", "is not a zone name"),
        ({"fleet": {"membership": "zk"}}, "fleet.membership", "is not one of none, kafka"),
        (
            {"fleet": {"heartbeat_interval_s": 2, "member_timeout_s": 3}},
            "fleet.member_timeout_s",
            "under two heartbeat intervals",
        ),
        ({"fleet": {"topic": "bad topic"}}, "fleet.topic", "is not a Kafka topic name"),
        (
            {"routing": {"cidr_zones": {"10.0.0.0/33": "a"}}},
            "routing.cidr_zones.10.0.0.0/33",
            "not a network",
        ),
        ({"routing": {"cidr_zones": ["10.0.0.0/8"]}}, "routing.cidr_zones", "expected a mapping"),
        ({"listeners": {"proxy_protocol": "v3"}}, "listeners.proxy_protocol", "is not one of"),
        (
            {"listeners": {"proxy_protocol": "optional"}, "limits": {"max_frame_bytes": 1 << 30}},
            "limits.max_frame_bytes",
            "must be below",
        ),
        ({"metrics": {"port": 70000}}, "metrics.port", "is not a port"),
    ],
)
def test_bad_fleet_settings_name_the_key(settings, key, reason):
    with pytest.raises(ConfigError) as error:
        parse_config({"upstream": {"bootstrap": "k:1"}, **settings})
    assert error.value.key == key
    assert reason in error.value.reason


def test_the_advertised_peer_port_defaults_to_the_listened_one_and_is_checked():
    base = {"upstream": {"bootstrap": "k:1"}}
    assert parse_config({**base, "tiering": {"enabled": True}}).tiering.advertised_peer_port == 0
    mapped = parse_config({**base, "tiering": {"enabled": True, "advertised_peer_port": 23456}})
    assert (mapped.tiering.peer_port, mapped.tiering.advertised_peer_port) == (0, 23456)
    with pytest.raises(ConfigError) as caught:
        parse_config({**base, "tiering": {"enabled": True, "advertised_peer_port": 70000}})
    assert caught.value.key == "tiering.advertised_peer_port"
