"""`tierproxy clean` (offload_jobs/clean.py) against Kafka's own cleaner, the oracle, on a
log the proxy's cleaner refuses (above `log_cleaner_max_bytes`; docs/offload.md,
"Cleaning a compacted topic").

The workload of test_tiered_compacted.py (compacted_load.py: keyed updates, tombstones,
every codec, a committed and an aborted transaction) goes to a passthrough topic and a
tiered one, both `compact,delete` so that DeleteRecords is allowed on both. The proxy
(one, owning both metadata shards, its cleaner's loop waiting an hour) is given a
`log_cleaner_max_bytes` of 1 KiB: its pass leaves the stream dirty. The job then runs on
the session's local Spark, with objects of about 2 KB of input so that it writes several:

1. its commit held until a DeleteRecords moved the log start into the log (both topics):
   the objects whose ranges the trim changed are refused and deleted, the others
   commit, and the job's exit status counts it a race (ok);
2. run again: everything left commits; the survivors from the new log start are
   Kafka's, record for record (offset, key, value, headers, timestamp), aborted records
   gone, tombstones kept, the key -> latest value map the workload's;
3. run a third time, as `tierproxy clean` with a proxy's YAML: nothing to write, exit
   status 0; and the proxy's own pass, given the job's clean end as its checkpoint,
   finds nothing dirty.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import pytest
from compacted_load import (
    BASE_TS,
    CODECS,
    SEGMENT_MS,
    Pair,
    latest,
    produce,
    read_all,
    round_records,
    transaction,
)
from cutover_load import one_proxy

import offload_jobs.fleet
from offload_jobs import clean_cli
from offload_jobs.clean import CleanJob, clean
from offload_jobs.migrate import StoreSpec
from tests.support.clients import watermarks

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _job(proxy, kafka_cluster, topic: str) -> CleanJob:
    config = proxy.proxy.tiering.config
    return CleanJob(
        topic=topic,
        bootstrap=kafka_cluster.bootstrap,
        metadata_topic=config.metadata_topic,
        shard_count=config.shard_count,
        store=StoreSpec.from_settings(config.object_store),
        peer=("127.0.0.1", proxy.proxy.tiering.peer_port),
        target_object_bytes=2000,
        object_format_version=config.object_format_version,
    )


def _objects(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}


def _clean_command(proxy, kafka_cluster, topic: str, spark, tmp_path, capsys):
    """`tierproxy clean` in this process, on the session's Spark: (exit code, output)."""
    config = proxy.proxy.tiering.config
    yaml = tmp_path / "proxy.yaml"
    yaml.write_text(
        f"upstream: {{bootstrap: '{kafka_cluster.bootstrap}'}}\n"
        "fleet: {name: operator, zone: zone-a}\n"
        f"tiering:\n  metadata_topic: {config.metadata_topic}\n"
        f"  shard_count: {config.shard_count}\n"
        f"  object_store: {{kind: local, directory: '{config.object_store.directory}'}}\n"
    )
    peer = f"127.0.0.1:{proxy.proxy.tiering.peer_port}"
    argv = ["--topic", topic, "--config", str(yaml), "--peer", peer]
    parser = argparse.ArgumentParser()
    clean_cli.add_arguments(parser)
    code = clean_cli.run(parser.parse_args(argv), spark=spark)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_the_clean_job_cleans_as_kafka_and_commits_as_the_proxy(
    kafka_cluster, spark, tmp_path, caplog, capsys, monkeypatch
) -> None:
    with one_proxy(
        kafka_cluster,
        tmp_path,
        "sparkclean",
        log_cleaner_interval_s=3600,
        log_cleaner_max_bytes=1024,
    ) as proxy:
        pair = Pair(kafka_cluster, proxy, "compact,delete")
        for n, codec in enumerate(CODECS):
            records = round_records(n)
            pair.both(lambda b, t, r=records, c=codec: produce(b, t, r, c))
            if n == 1:
                txn = [
                    (f"k{i}".encode(), f"txn-{i}".encode(), [], BASE_TS + 9000 + i)
                    for i in range(3)
                ]
                pair.both(lambda b, t, r=txn: transaction(b, t, r, True))
            if n == 3:
                txn = [(f"k{i}".encode(), b"aborted", [], BASE_TS + 9500 + i) for i in range(4)]
                pair.both(lambda b, t, r=txn: transaction(b, t, r, False))
            pair.committed()
        time.sleep(SEGMENT_MS / 1000 + 0.5)  # Kafka's roll rule (test_tiered_compacted.py)
        pair.both(lambda b, t: produce(b, t, [(b"roll", b"roll", [], 0)], "none"))
        last = watermarks(kafka_cluster.bootstrap, pair.plain)[1] - 1
        pair.committed()

        with caplog.at_level(logging.WARNING, logger="tierproxy.cleaner"):
            report = pair.clean()
        assert pair.stream not in report.cleaned
        assert "above log_cleaner_max_bytes" in caplog.text

        job = _job(proxy, kafka_cluster, pair.tiered)
        store = Path(proxy.proxy.tiering.config.object_store.directory)
        before = _objects(store)
        everything = read_all(proxy.bootstrap, pair.tiered, last)
        cut = everything[len(everything) // 3][0]

        commit = offload_jobs.fleet.commit_cleaned

        async def trimmed_first(peer, requests):
            assert pair.delete_records(cut) == {pair.plain: cut, pair.tiered: cut}
            return await commit(peer, requests)

        monkeypatch.setattr(offload_jobs.fleet, "commit_cleaned", trimmed_first)
        raced = clean(spark, job, progress=lambda _: None)
        monkeypatch.setattr(offload_jobs.fleet, "commit_cleaned", commit)
        assert raced.ok and raced.objects > 1, raced.line()
        assert raced.refused and not raced.committed_streams, raced.line()
        # the refused objects are gone from the store; the committed ones replace others
        written = _objects(store) - before
        assert len(written) < raced.objects, raced.line()

        done = clean(spark, job, progress=lambda _: None)
        assert done.ok and done.committed_streams == 1 and not done.refused, done.line()
        plain, tiered = pair.both_cleaned_from(cut, last)
        assert tiered[:-1] == plain[:-1]  # the last: the roll record, stamped by each client
        assert watermarks(proxy.bootstrap, pair.tiered)[0] == cut
        # the log read before the clean holds the aborted records (read_uncommitted)
        survivors = {r[1]: r[2] for r in everything if r[0] >= cut and r[2] != b"aborted"}
        assert latest(tiered) == survivors
        assert any(value is None for _, _, value, _, _ in tiered)  # tombstones kept
        assert b"aborted" not in {value for _, _, value, _, _ in tiered}
        assert len({r[1] for r in tiered}) == len(tiered)

        # `tierproxy clean` as an operator runs it, with a proxy's YAML
        code, out = _clean_command(proxy, kafka_cluster, pair.tiered, spark, tmp_path, capsys)
        assert code == 0 and "0 objects (0 partitions committed, 1 clean already)" in out, out
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tierproxy.cleaner"):
            report = pair.clean()
        assert pair.stream not in report.cleaned and "log_cleaner_max_bytes" not in caplog.text
        assert read_all(proxy.bootstrap, pair.tiered, last) == tiered
