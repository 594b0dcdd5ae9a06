"""The test ports: below the kernel's ephemeral range, never the same one twice."""

from pathlib import Path

from proxy.devstack.paths import free_port, free_port_block


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
