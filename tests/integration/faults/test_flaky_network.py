"""A slow and flaky network between the proxies and the object store, not a dead one
(issue 18; docs/reliability.md, "Flaky network").

Two `tierproxy run` processes (zone-a, zone-b; tieredfleet.py) on the session's Kafka
reach a MinIO of this test's own only through toxiproxy (proxy/devstack/toxiproxy.py), a
real TCP proxy that injects faults. `notify: s3` as in the fault suite: a produce to a
partition the other proxy owns is acknowledged only once its S3-WAL object is PUT by the
proxy the client is connected to and read back (GET) by the owner, so S3 is on the
acknowledgement path of half of the load (each zone's producer writes to every
partition), and the uploads and compaction (PUT, GET, DELETE) and the orphan sweep (LIST)
run through the same link. An idempotent librdkafka producer per zone writes a steady
load and a consumer reads every partition through the fleet (faultload.py). In turn,
each held for a while and then removed, with the recovery measured (faultsteps.py):

1. latency 250 ms ± 150 ms each way, closes passed on 1 s late;
2. a bandwidth limit of 32 KB/s each way (below what the load PUTs);
3. connections cut mid-PUT: half the connections closed once 8 KiB went up them, a fifth
   reset (RST) 300 ms after they opened;
4. connections cut mid-GET: half the connections closed once 8 KiB came down them;
5. half-open connections: nothing comes back, nothing is closed (toxiproxy's `timeout`
   toxic at 0), for longer than the S3 client's read timeout (10 s) and librdkafka's
   request timeout (10 s): requests in flight are given up on both sides and retried;
6. the peer link between the proxies cut both ways (each proxy reaches the other's peer
   listener only through a link of its own, `tiering.advertised_peer_port`): every
   connection reset as it opens, those open at once, while clients produce in both zones;
7. the peer link cut one way, silently: zone-a's requests to zone-b vanish (nothing comes
   back, nothing is closed), zone-b's to zone-a go through.

The end checks are the fault suite's (faultchecks.py): nothing acknowledged lost, nothing
in the log twice, no offset served twice, the metadata's commits equal to what the
consumer read, no garbage, orphan or S3-WAL object left past its grace, no process left.
The proxies' own counts of failed S3 attempts show that the faults reached them, and
they log no ERROR (a traceback: what they did not expect).
Each fault is held 12 s; the test takes about 3 minutes (its own MinIO and toxiproxy, the
session's Kafka).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cutover_load import LoadProducer
from faultchecks import TIERING, assert_nothing_lost, close_run, finish, write_figures
from faultload import Figures
from faultsteps import steady_load
from tieredfleet import TieredFleet

from proxy.devstack import MinioServer
from proxy.devstack.toxiproxy import (
    Link,
    ToxiproxyServer,
    bandwidth,
    latency,
    limit_data,
    reset_peer,
    slow_close,
    timeout,
)

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

PARTITIONS = 4
HOLD_S = 12.0  # each fault: the half-open one past the S3 and librdkafka timeouts (10 s)
FAULTS = [
    (
        "latency 250±150 ms",
        [
            latency(250, 150, "upstream"),
            latency(250, 150, "downstream"),
            slow_close(1000, "downstream"),
        ],
    ),
    ("bandwidth 32 KB/s", [bandwidth(32, "upstream"), bandwidth(32, "downstream")]),
    (
        "reset mid-PUT",
        [limit_data(8192, "upstream", toxicity=0.5), reset_peer(300, "upstream", toxicity=0.2)],
    ),
    ("reset mid-GET", [limit_data(8192, "downstream", toxicity=0.5)]),
    ("half-open", [timeout(0, "downstream")]),
]
# MinIO answers 429 TooManyRequests to a request that finds this many in progress
# (its `api requests_max`): throttling, more of it when the network is slow
MINIO_REQUESTS_MAX = 4
PEER_FAULTS = ["peer link cut both ways", "peer link cut a -> b"]
PEER_CUT = [reset_peer(0)]  # every connection reset as it opens, those open at once
PEER_ONE_WAY = [timeout(0, "upstream")]  # the link's client's requests vanish
# failed S3 attempts, as the proxies count them (proxy/objects/s3retry.py's outcomes)
FAILURES = ("connection_error", "timeout", "throttled", "server_error")


class FlakyFleet(TieredFleet):
    """The tiered fleet, its proxies reaching the object store through the toxiproxy
    link `s3`, and each other's peer listener through a link of its own (`peer_links`,
    by zone: `tiering.advertised_peer_port` tells the fleet the link's port); the fleet's
    own readers and `tier` go to MinIO and the peer listeners directly."""

    def __init__(self, *args, toxiproxy: ToxiproxyServer, s3: Link, **kwargs) -> None:
        self.toxiproxy, self.s3 = toxiproxy, s3  # before _config runs
        self.peer_links: dict[str, Link] = {}
        super().__init__(*args, **kwargs)

    def _config(self, name: str, zone: str, base: int, wal_dir: Path) -> dict:
        config = super()._config(name, zone, base, wal_dir)
        tiering = config["tiering"]
        tiering["object_store"] = {
            **tiering["object_store"],
            "endpoint_url": f"http://{self.s3.listen}",
        }
        link = self.toxiproxy.link(f"peer-{zone}", f"127.0.0.1:{tiering['peer_port']}")
        link.arm(*PEER_CUT)  # the one-way cut follows it on zone-b's link
        self.peer_links[zone] = link
        tiering["advertised_peer_port"] = link.port
        return config


def test_fleet_over_a_flaky_network_loses_and_repeats_nothing(kafka_cluster, tmp_path):
    figures = Figures(seed=0)  # nothing random is chosen here
    began = time.monotonic()
    toxiproxy = ToxiproxyServer(tmp_path)
    minio = MinioServer(
        name="minio-flaky",
        base_dir=tmp_path / "minio",
        env={"MINIO_API_REQUESTS_MAX": str(MINIO_REQUESTS_MAX)},
    )
    fleet = None
    producers: list[LoadProducer] = []
    consumer = None
    try:
        toxiproxy.start()
        minio.start()
        s3 = toxiproxy.link("s3", f"127.0.0.1:{minio.port}")
        # every toxic but a `timeout`, which is added and removed: a toxic removed and
        # others added after it can crash toxiproxy (proxy/devstack/toxiproxy.py)
        s3.arm(*(t for _, toxics in FAULTS for t in toxics if t.type != "timeout"))
        fleet = FlakyFleet(
            kafka_cluster.bootstrap, minio, tmp_path, tiering=TIERING, toxiproxy=toxiproxy, s3=s3
        )
        fleet.start()
        fleet.wait_until_owned()
        topic_id, injector = steady_load(fleet, PARTITIONS, producers, tmp_path, figures)
        progress, consumer = injector.progress, injector.consumer
        figures.notes["setup_s"] = round(time.monotonic() - began, 1)

        for kind, toxics in FAULTS:
            injector.network_fault(kind, [s3], toxics, HOLD_S)
        links = list(fleet.peer_links.values())
        # refused, both ways
        injector.network_fault("peer link cut both ways", links, PEER_CUT, HOLD_S)
        # zone-a's requests to zone-b vanish, zone-b's to zone-a go through
        injector.network_fault(
            "peer link cut a -> b", [fleet.peer_links["zone-b"]], PEER_ONE_WAY, HOLD_S
        )

        figures.notes["s3_attempts_failed"] = {
            proxy.zone: {
                outcome: proxy.metric("tierproxy_object_store_requests_total", outcome=outcome)
                for outcome in FAILURES
            }
            for proxy in fleet.proxies.values()
        }
        finish(fleet, minio, topic_id, producers, progress, consumer, figures)
    finally:
        close_run([*producers, consumer], fleet, minio, toxiproxy)
    # a flaky network is expected: each ERROR line in the figures is a finding (two were,
    # docs/reliability.md)
    path = tmp_path / "flaky-network-figures.json"
    write_figures(figures, fleet, [toxiproxy, minio], began, path)

    assert figures.faults == {kind: 1 for kind in [*(k for k, _ in FAULTS), *PEER_FAULTS]}
    assert figures.records_acknowledged > 5_000
    assert_nothing_lost(figures)
    assert figures.notes["proxy_errors"] == [], "the proxies logged errors (see their logs)"
    failed = figures.notes["s3_attempts_failed"]
    for outcome in ("connection_error", "timeout", "throttled"):
        assert sum(by_zone[outcome] for by_zone in failed.values()) > 0, (
            f"no S3 attempt failed with {outcome}: the faults did not reach the proxies"
        )
