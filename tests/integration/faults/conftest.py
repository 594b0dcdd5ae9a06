"""The fault-injection suite (issue 8): a tiered fleet under load while proxies are
killed and paused, a broker restarts and the object store goes away.

It breaks what it runs on, so it runs on a Kafka cluster and a MinIO of its own (started
in the test, stopped at its end) and shares nothing with the session's `kafka_cluster`
and `s3_server`. The flaky-network test (test_flaky_network.py) breaks only the network
between the proxies and a MinIO of its own, the disk-full test (test_disk_full.py) only a
proxy's own tmpfs, the membership test (test_fleet_membership.py) breaks nothing, the
admin-operations test (test_admin_under_faults.py) and the unclean-takeover tests
(test_unclean_takeover.py) only kill proxies: they share the session's Kafka. All are
marked `faults`: `-m "not faults"` leaves them out.
"""

from __future__ import annotations

import sys
from pathlib import Path

# tieredfleet.py and cutover_load.py: the tiering tests' fleet, producers and readers
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tiering"))


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "faults: the fault-injection suite (its own Kafka and MinIO, ~6 min), the "
        "flaky-network test (toxiproxy, ~3 min), the disk-full test (a tmpfs, ~1 min), "
        "the membership test (three proxies, ~2 min), the unclean-takeover tests (three "
        "proxies, one killed, one taken over uncleanly, ~2 min) and the admin-operations "
        "test (DeleteRecords, retention, a cutover under kills, ~1.5 min)",
    )
