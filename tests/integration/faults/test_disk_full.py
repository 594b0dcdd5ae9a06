"""A full disk under a proxy's local WAL (issue 18; docs/reliability.md, "Disk full").

Zone-b's `tierproxy run` keeps its WAL on a small tmpfs of its own: the process starts
under `unshare --user --map-root-user --mount`, which mounts the tmpfs in a mount
namespace of the process's own, so the test needs no root (the test reaches the tmpfs
through /proc/PID/root). Under the fault suite's load (an idempotent librdkafka producer
per zone, a consumer through the fleet; faultload.py), a filler writes into that tmpfs
until it is full and keeps it full (what the WAL's trims free, the filler takes) for
FULL_S, then removes its file.

While the disk is full, zone-b's WAL writes fail with ENOSPC: the appends wait, in
order, and are written again once there is room (proxy/wal/log.py); the WAL must not
break and the proxy must not stop. After the space returns the fleet must recover
(faultsteps.py's "recovered", 30 s), and the end checks are the fault suite's
(faultchecks.py): nothing acknowledged lost, nothing twice, committed == consumed,
nothing left behind. Uses the session's Kafka, a MinIO of its own; about 1.5 minutes.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from cutover_load import LoadProducer
from faultchecks import TIERING, assert_nothing_lost, close_run, finish, write_figures
from faultload import Figures
from faultsteps import steady_load
from tieredfleet import TieredFleet

from proxy.devstack import MinioServer

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

PARTITIONS = 4
MiB = 1 << 20
DISK_BYTES = 16 * MiB  # zone-b's tmpfs
FULL_S = 15.0  # how long the disk is kept full
FILL_CHUNK = 64 * 1024
SMALL_ZONE = "zone-b"
# mount the tmpfs over $0 in the process's own mount namespace, then run the proxy
_MOUNT = 'mount -t tmpfs -o size={size} tmpfs "$0" && exec "$@"'


class SmallDiskFleet(TieredFleet):
    """The tiered fleet, SMALL_ZONE's WAL on a tmpfs of DISK_BYTES that only its process
    sees (1 MiB segments, so that trims free space as they do on a large disk)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        proxy = self.proxies[SMALL_ZONE]
        self.mountpoint = self.base_dir / proxy.name / "disk"
        self.mountpoint.mkdir(parents=True)
        shell = _MOUNT.format(size=DISK_BYTES)
        unshare = [shutil.which("unshare") or "unshare", "--user", "--map-root-user", "--mount"]
        proxy.process.argv = [
            *unshare,
            "sh",
            "-c",
            shell,
            str(self.mountpoint),
            *proxy.process.argv,
        ]

    def _config(self, name: str, zone: str, base: int, wal_dir: Path) -> dict:
        config = super()._config(name, zone, base, wal_dir)
        if zone == SMALL_ZONE:
            wal = config["tiering"]["wal"]
            wal.update(directory=str(self.base_dir / name / "disk" / "wal"), segment_bytes=MiB)
        return config

    def disk(self) -> Path:
        """The tmpfs as SMALL_ZONE's process sees it (its mount namespace)."""
        pid = self.proxies[SMALL_ZONE].process.pid
        return Path(f"/proc/{pid}/root{self.mountpoint}")

    def start(self, *zones: str, timeout: float = 60.0) -> None:
        super().start(*zones, timeout=timeout)
        proxy = self.proxies[SMALL_ZONE]
        if proxy.process.running():  # the WAL as the proxy sees it (finish() reads it)
            proxy.wal_dir = self.disk() / "wal"
        self.wait_until_owned()


class DiskFiller(threading.Thread):
    """Writes into a directory until its filesystem is full, and keeps it full (what is
    freed there is taken again), until `stop`; then removes its file."""

    def __init__(self, directory: Path) -> None:
        super().__init__(name="disk-filler", daemon=True)
        self.path = directory / "filler"
        self.full_at: float | None = None
        self.bytes = 0
        self.errors: list[str] = []
        self._halt = threading.Event()

    def run(self) -> None:
        chunk = bytes(FILL_CHUNK)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            self.errors.append(repr(exc))
            return
        try:
            while not self._halt.is_set():
                try:
                    self.bytes += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        self.errors.append(repr(exc))
                        return
                    try:  # the last few bytes free, smaller than a chunk
                        self.bytes += os.write(fd, bytes(4096))
                        continue
                    except OSError:
                        pass
                    if self.full_at is None:
                        self.full_at = time.monotonic()
                    self._halt.wait(0.02)
        finally:
            os.close(fd)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        self.path.unlink(missing_ok=True)


def test_a_full_disk_under_the_wal_makes_appends_wait_and_loses_nothing(kafka_cluster, tmp_path):
    figures = Figures(seed=0)  # nothing random is chosen here
    began = time.monotonic()
    minio = MinioServer(name="minio-diskfull", base_dir=tmp_path / "minio")
    fleet = None
    producers: list[LoadProducer] = []
    consumer = None
    filler = None
    try:
        minio.start()
        fleet = SmallDiskFleet(kafka_cluster.bootstrap, minio, tmp_path, tiering=TIERING)
        fleet.start()  # and every shard owned
        topic_id, injector = steady_load(fleet, PARTITIONS, producers, tmp_path, figures)
        progress, consumer = injector.progress, injector.consumer
        figures.notes["setup_s"] = round(time.monotonic() - began, 1)

        small = fleet[SMALL_ZONE]
        owned = [p for p in range(PARTITIONS) if fleet.stream_owner(topic_id, p) == small.name]
        injected = time.monotonic()
        filler = DiskFiller(fleet.disk())
        filler.start()
        # (s since the injection, waiting, broken, running, offsets acknowledged in its partitions)
        samples = []
        while time.monotonic() - injected < FULL_S or not any(s[1] for s in samples):
            if time.monotonic() - injected > FULL_S + 30:
                break  # it never waited: asserted below
            progress.update()
            samples.append(
                (
                    round(time.monotonic() - injected, 2),
                    small.metric("tierproxy_wal_waiting_for_space"),
                    small.metric("tierproxy_wal_broken"),
                    small.process.running(),
                    sum(progress.max_offset.get(p, -1) + 1 for p in owned),
                )
            )
            time.sleep(0.25)
        filler.stop()
        ended = time.monotonic()
        injector.recovered("disk full", injected, ended, 30)
        waiting = [s for s in samples if s[1]]
        figures.notes["disk_full"] = {
            "disk_bytes": DISK_BYTES,
            "filled_after_s": None
            if filler.full_at is None
            else round(filler.full_at - injected, 2),
            "filler_bytes": filler.bytes,
            "filler_errors": filler.errors,
            "held_s": round(ended - injected, 1),
            "waiting_samples": len(waiting),
            "samples": len(samples),
            "first_waiting_s": waiting[0][0] if waiting else None,
            "broken_samples": sum(1 for s in samples if s[2]),
            "not_running_samples": sum(1 for s in samples if not s[3]),
            "offsets_acknowledged_in_its_partitions_while_full": (
                samples[-1][4] - waiting[0][4] if waiting else None
            ),
            "no_space_waits": small.metric("tierproxy_wal_no_space_waits_total"),
            "no_space_seconds": round(small.metric("tierproxy_wal_no_space_seconds_total"), 1),
            "its_partitions": owned,
        }
        finish(fleet, minio, topic_id, producers, progress, consumer, figures)
    finally:
        if filler is not None and filler.is_alive():
            filler.stop()
        close_run([*producers, consumer], fleet, minio)
    write_figures(figures, fleet, [minio], began, tmp_path / "disk-full-figures.json")

    full = figures.notes["disk_full"]
    assert full["filler_errors"] == [], full
    assert full["filled_after_s"] is not None, f"the tmpfs never filled: {full}"
    assert full["waiting_samples"] > 0, f"the WAL never waited for space: {full}"
    assert full["no_space_waits"] >= 1 and full["no_space_seconds"] > 0, full
    assert full["broken_samples"] == 0, f"the full disk broke the WAL: {full}"
    assert full["not_running_samples"] == 0, f"the proxy stopped: {full}"
    assert figures.records_acknowledged > 2_000
    assert_nothing_lost(figures)
    assert figures.notes["proxy_errors"] == [], "the proxies logged errors (see their logs)"
