"""The test ports: below the kernel's ephemeral range, never the same one twice, and in
the process's own share of that range when several processes hand them out."""

from pathlib import Path

import pytest

from proxy.devstack.paths import PORT_RANGE_ENV, free_port, free_port_block, port_share


def _ephemeral_start() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_free_port_is_below_the_ephemeral_range_and_never_handed_out_twice():
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(10_000 < port < _ephemeral_start() for port in ports)


def test_a_block_shares_no_port_with_ports_handed_out_before():
    singles = {free_port() for _ in range(50)}
    blocks = [free_port_block(8) for _ in range(20)]
    taken = [port for base in blocks for port in range(base + 1, base + 9)]
    assert len(set(taken)) == len(taken)
    assert not singles.intersection(taken)
    assert all(base + 8 < _ephemeral_start() for base in blocks)


def test_port_shares_of_processes_are_disjoint_slices_below_the_ephemeral_range(monkeypatch):
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    shares = [tuple(map(int, port_share(i, 4).split("-"))) for i in range(4)]
    assert shares[0][0] == 10_000 and shares[-1][1] <= _ephemeral_start()
    for (_, end), (start, _) in zip(shares, shares[1:], strict=False):
        assert end <= start
    with pytest.raises(ValueError):
        port_share(4, 4)


def test_a_process_with_a_share_hands_out_only_ports_of_its_share(monkeypatch):
    monkeypatch.setenv(PORT_RANGE_ENV, "20000-20400")
    ports = [free_port() for _ in range(100)] + [free_port_block(4) + 4 for _ in range(10)]
    assert all(20_000 < port < 20_400 for port in ports)
