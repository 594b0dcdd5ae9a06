"""The three-zone fleet fixture (see zonefleet.py)."""

from __future__ import annotations

import pytest
from zonefleet import ZoneFleet


@pytest.fixture(scope="module")
def zone_fleet(kafka_cluster, tmp_path_factory):
    fleet = ZoneFleet(kafka_cluster.bootstrap, tmp_path_factory.mktemp("zone-fleet"))
    try:
        fleet.start()
        fleet.wait_until_members(6)
        yield fleet
    finally:
        fleet.stop()
