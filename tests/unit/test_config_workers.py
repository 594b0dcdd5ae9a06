"""`workers: N` in the config: validated, and each worker's own name, WAL and ports
(proxy/config/workers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import ConfigError, parse_config
from proxy.config.workers import unused_wal_directories, wal_directories, worker_config
from proxy.server.supervisor import check_wal_directories
from proxy.wal.fs import OsFilesystem
from proxy.wal.segments import write_checkpoint

BASE = {
    "upstream": {"bootstrap": "k:1"},
    "listeners": {"advertised_host": "10.0.0.5", "bootstrap_port": 9092},
    "fleet": {"zone": "zone-a"},
    "metrics": {"port": 9100},
    "admin": {"port": 9644},
    "tiering": {"peer_port": 9190, "wal": {"directory": "/var/lib/tierproxy/wal"}},
}


def _config(**top):
    return parse_config({**BASE, **top})


def test_workers_default_to_one_and_one_worker_is_the_file_as_it_is():
    config = _config()
    assert config.workers == 1
    assert worker_config(config, 0) is config
    assert wal_directories(config) == [Path("/var/lib/tierproxy/wal")]


@pytest.mark.parametrize("value", [0, 65, -1, "2", 1.5, True])
def test_workers_outside_1_to_64_is_a_config_error(value):
    with pytest.raises(ConfigError) as error:
        _config(workers=value)
    assert error.value.key == "workers"
    assert "1..64" in error.value.reason


def test_each_worker_gets_its_name_wal_and_ports_and_shares_the_client_ports():
    config = _config(workers=3)
    worker = worker_config(config, 2)
    assert worker.fleet.name == "10.0.0.5:9092/w2"
    assert worker.tiering.wal_directory == Path("/var/lib/tierproxy/wal/worker-2")
    assert (worker.tiering.peer_port, worker.metrics.port, worker.admin.port) == (9192, 9102, 9646)
    assert worker.listeners == config.listeners  # the same bootstrap and broker ports
    assert worker.workers == 3


def test_ports_left_at_zero_stay_any_free_port_per_worker():
    raw = {**BASE, "metrics": {}, "tiering": {"peer_port": 0}}
    worker = worker_config(parse_config({**raw, "workers": 2}), 1)
    assert (worker.tiering.peer_port, worker.metrics.port) == (0, 0)


def test_more_workers_need_a_fixed_bootstrap_port():
    with pytest.raises(ConfigError) as error:
        parse_config({**BASE, "listeners": {"bootstrap_port": 0}, "workers": 2})
    assert error.value.key == "listeners.bootstrap_port"


def test_per_worker_port_ranges_must_not_overlap():
    raw = {**BASE, "workers": 4, "tiering": {"peer_port": 9642}}  # 9642..9645 meets admin 9644
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    assert error.value.key == "admin.port"
    assert "overlaps tiering.peer_port 9642..9645" in error.value.reason


def test_the_last_worker_port_must_be_a_port():
    with pytest.raises(ConfigError) as error:
        parse_config({**BASE, "workers": 3, "metrics": {"port": 65534}})
    assert error.value.key == "metrics.port"


def test_a_worker_index_beyond_the_count_is_refused():
    with pytest.raises(ConfigError):
        worker_config(_config(workers=2), 2)


def test_the_wal_directories_a_count_does_not_replay():
    base = Path("/var/lib/tierproxy/wal")
    names = ["worker-0", "worker-1", "worker-2", "00000000000000000000.wal", "trim-checkpoint"]
    assert unused_wal_directories(_config(workers=2), names) == [base, base / "worker-2"]
    assert unused_wal_directories(_config(), names) == [base / f"worker-{i}" for i in range(3)]


def test_a_wal_left_with_records_by_a_worker_no_longer_run_refuses_the_start(tmp_path):
    raw = {**BASE, "tiering": {"wal": {"directory": str(tmp_path)}}}
    removed = tmp_path / "worker-2"  # of an earlier `workers: 3`, killed, not uploaded
    removed.mkdir()
    (removed / "00000000000000000000.wal").write_bytes(b"x" * 100)
    (tmp_path / "worker-0").mkdir()
    check_wal_directories(parse_config({**raw, "workers": 3}))  # it is run: replayed
    with pytest.raises(ConfigError) as error:
        check_wal_directories(parse_config({**raw, "workers": 2}))
    assert error.value.key == "workers"
    assert f"{removed} holds 100 WAL bytes not uploaded" in error.value.reason
    # uploaded (the trim checkpoint at its end, as a clean stop leaves it): no longer needed
    write_checkpoint(OsFilesystem(), str(removed), 100)
    check_wal_directories(parse_config({**raw, "workers": 2}))


def test_the_single_process_wal_with_records_refuses_a_start_of_more_workers(tmp_path):
    raw = {**BASE, "tiering": {"wal": {"directory": str(tmp_path)}}}
    (tmp_path / "00000000000000000000.wal").write_bytes(b"x" * 10)  # workers: 1, killed
    check_wal_directories(parse_config(raw))
    with pytest.raises(ConfigError) as error:
        check_wal_directories(parse_config({**raw, "workers": 2}))
    assert f"{tmp_path} holds 10 WAL bytes not uploaded" in error.value.reason
