"""Which proxy of a zone hosts which upstream broker, for the clients of that zone.

Rendezvous (highest-random-weight) hashing with bounded loads: each broker ranks the
zone's live proxies by a hash of (broker, proxy) and goes to the first one not yet full,
where full is ceil((1 + epsilon) * brokers / proxies). The result depends only on the
sets of brokers and live proxies, so every proxy of the fleet computes the same mapping
with no coordination. When a proxy leaves, the brokers it hosted move; where the bound
binds, a few others may move as well, since the bound changes with the number of proxies.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable


def _weight(broker_id: int, proxy: str) -> int:
    digest = hashlib.blake2b(f"{broker_id}|{proxy}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def place_brokers(
    broker_ids: Iterable[int], proxies: Iterable[str], epsilon: float = 0.25
) -> dict[int, str]:
    """broker id -> proxy name, over the live proxies of one zone."""
    if epsilon < 0:
        raise ValueError(f"epsilon {epsilon} is negative")
    brokers = sorted(set(broker_ids))
    candidates = sorted(set(proxies))
    if not brokers:
        return {}
    if not candidates:
        raise ValueError("no live proxy to place brokers on")
    capacity = max(1, math.ceil((1 + epsilon) * len(brokers) / len(candidates)))
    load = dict.fromkeys(candidates, 0)
    placement: dict[int, str] = {}
    for broker in brokers:
        ranked = sorted(candidates, key=lambda proxy: (-_weight(broker, proxy), proxy))
        chosen = next(proxy for proxy in ranked if load[proxy] < capacity)
        placement[broker] = chosen
        load[chosen] += 1
    return placement
