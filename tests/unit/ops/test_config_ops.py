"""The `admin` and `logging` config sections (proxy/config/ops.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, load_config, parse_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TOKEN = "0123456789abcdef-token"


def _config(admin=None, logging=None):
    raw = {"upstream": {"bootstrap": "127.0.0.1:9092"}}
    if admin is not None:
        raw["admin"] = admin
    if logging is not None:
        raw["logging"] = logging
    return parse_config(raw)


def test_defaults_no_admin_api_auto_logs_no_access_lines():
    config = _config()
    assert not config.admin.enabled and config.admin.bind_host == "127.0.0.1"
    assert config.logging.format == "auto" and config.logging.access is False
    assert _config({"port": 0}).admin.enabled  # 0: any free port


def test_the_token_comes_from_the_environment_and_is_never_printed(monkeypatch):
    monkeypatch.setenv("ADMIN_TOKEN_FOR_TEST", TOKEN)
    config = _config({"bind_host": "0.0.0.0", "port": 9644, "token": "${ADMIN_TOKEN_FOR_TEST}"})
    assert config.admin.token == TOKEN
    assert TOKEN not in repr(config) and TOKEN not in str(config.admin)


@pytest.mark.parametrize(
    ("admin", "key", "words"),
    [
        ({"bind_host": "0.0.0.0", "port": 9644}, "admin.token", "not a loopback address"),
        ({"bind_host": "10.0.1.21", "port": 9644}, "admin.token", "10.0.1.21"),
        ({"port": 9644, "token": "short"}, "admin.token", "at least 16 characters (got 5)"),
        ({"port": 9644, "token": 1234}, "admin.token", "not a string"),
        ({"port": 70000}, "admin.port", "70000 is not a port"),
        ({"bind_host": "admin.local", "port": 1}, "admin.bind_host", "not an IP address"),
        ({"port": 1, "tokn": TOKEN}, "admin.tokn", "is not a known setting"),
        ({"port": 1, "token": "${NOT_SET_ANYWHERE_42}"}, "admin.token", "is not set"),
    ],
)
def test_bad_admin_settings_name_the_key_and_reason(admin, key, words):
    with pytest.raises(ConfigError) as bad:
        _config(admin)
    assert bad.value.key == key and words in bad.value.reason
    token = admin.get("token")
    if isinstance(token, str) and not token.startswith("${"):
        assert token not in str(bad.value)  # a wrong secret is not echoed either


def test_loopback_needs_no_token():
    assert _config({"bind_host": "::1", "port": 9644}).admin.token is None


def test_logging_format():
    assert _config(logging={"format": "json"}).logging.format == "json"
    assert _config(logging={"access": True}).logging.access is True
    with pytest.raises(ConfigError) as bad:
        _config(logging={"format": "xml"})
    assert bad.value.key == "logging.format"
    assert "'xml' is not one of auto, text, json" in str(bad.value)


def test_the_example_configs_enable_the_admin_api_on_loopback():
    for name in ("local.yaml", "tiered.yaml"):
        config = load_config(CONFIGS / name)
        assert config.admin.port == 9644 and config.admin.bind_host == "127.0.0.1", name
    assert load_config(CONFIGS / "tiered.yaml").logging.format == "json"


def test_the_three_zone_demo_configs_differ_only_in_name_zone_and_ports(monkeypatch):
    monkeypatch.setenv("KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    configs = [load_config(CONFIGS / "three-zones" / f"proxy-{z}.yaml") for z in "abc"]
    assert [c.fleet.zone for c in configs] == ["zone-a", "zone-b", "zone-c"]
    assert len({c.fleet.name for c in configs}) == 3
    ports = [
        (
            c.listeners.bootstrap_port,
            c.listeners.broker_port_base,
            c.tiering.peer_port,
            c.admin.port,
        )
        for c in configs
    ]
    assert len({p for group in ports for p in group}) == 12  # no two proxies share a port
    assert len({c.tiering.wal_directory for c in configs}) == 3
    shared = {(c.fleet.topic, c.tiering.metadata_topic, c.tiering.shard_count) for c in configs}
    assert len(shared) == 1 and all(c.upstream.bootstrap == (("127.0.0.1", 9092),) for c in configs)


def test_a_sasl_password_of_the_wrong_type_is_not_echoed():
    raw = {
        "upstream": {
            "bootstrap": "127.0.0.1:9092",
            "sasl": {"mechanism": "PLAIN", "username": "u", "password": 918273645},
        }
    }
    with pytest.raises(ConfigError) as bad:
        parse_config(raw)
    assert bad.value.key == "upstream.sasl.password" and "is a int, not a string" in str(bad.value)
    assert "918273645" not in str(bad.value)
