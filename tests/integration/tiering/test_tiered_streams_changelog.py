"""A Kafka Streams application whose state store's changelog is a compacted tiered topic
(issue 20), restored after a restart from the changelog as the proxy's log cleaner left
it (docs/tiering.md, "Compacted topics").

The application is test_tiered_streams_eos.py's (java/EosSum.java run by streams_app.py,
exactly_once_v2): per key g<v % GROUPS>, the count and sum of its values in a RocksDB
store whose changelog <app>-totals-changelog is compacted (min.cleanable.dirty.ratio
0.01) and tiered; its input, repartition and output topics are passthrough. One proxy in
this process owns both metadata shards; its cleaner's pass is called directly, as in
test_tiered_compacted.py (the loop waits an hour).

1. The input's values 1..RECORDS go in; the output holds every update (the EOS test's check).
2. The application is closed, the changelog's tail uploaded, and the proxy cleans it: a
   read_committed read of the changelog then finds each key once, its value the
   expected "<count>,<sum>", where RECORDS updates were written.
3. The application's state directory is removed, so its store can only be rebuilt from
   the cleaned changelog, and it is started again: its restore listener reports each of
   the store's partitions restored with exactly the records the cleaned changelog holds.
4. One more value per key: each key's next update continues its count and sum, so the
   restored store is the state before the restart.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from cutover_load import one_proxy, started, tiered_topic_id, topics_command
from streams_app import StreamsApp
from test_tiered_streams_eos import GROUPS, PARTITIONS, RECORDS, InputProducer, OutputReader, _check

from proxy.metadata.streams import stream_id
from tests.support.clients import watermarks
from tests.support.waiting import wait_for, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]


def _create_topics(bootstrap: str, topics: dict[str, dict[str, str]]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics(
        [NewTopic(name, PARTITIONS, 3, config=config) for name, config in topics.items()]
    )
    for future in futures.values():
        future.result(30)


def _read_changelog(bootstrap: str, topic: str, ends: dict[int, int]):
    """Every record of the changelog below `ends`, read_committed: partition -> [(key,
    value)] in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"changelog-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
    got: dict[int, list[tuple[str, str]]] = defaultdict(list)
    done: set[int] = {p for p, end in ends.items() if end == 0}
    deadline = time.monotonic() + 60
    try:
        while len(done) < len(ends) and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                got[msg.partition()].append((msg.key().decode(), msg.value().decode()))
            # holes and markers at the end: the position, not the last record, says done
            for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
    finally:
        consumer.close()
    assert len(done) == len(ends), f"changelog read to {done} only"
    return got


def test_streams_restores_its_store_from_a_cleaned_tiered_changelog(kafka_cluster, tmp_path):
    app_id = f"changelog-{uuid.uuid4().hex[:6]}"
    name = {short: f"{app_id}-{short}" for short in ("in", "out", "rekey-repartition")}
    changelog = f"{app_id}-totals-changelog"
    cleaned = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    with one_proxy(kafka_cluster, tmp_path, "changelog", log_cleaner_interval_s=3600) as proxy:
        tiering = proxy.proxy.tiering
        _create_topics(
            kafka_cluster.bootstrap,
            {
                name["in"]: {},
                name["out"]: {},
                name["rekey-repartition"]: {"cleanup.policy": "delete", "retention.ms": "-1"},
                changelog: cleaned,
            },
        )
        assert topics_command("tier", changelog, tiering.peer_port).returncode == 0
        topic_id = tiered_topic_id(proxy, changelog)
        streams = [stream_id(topic_id, p) for p in range(PARTITIONS)]
        wait_until(lambda: all(started(tiering, s) for s in streams), 30, "changelog started")

        expected: dict[str, list[int]] = defaultdict(list)
        for n in range(1, RECORDS + 1):
            expected[f"g{n % GROUPS}"].append(n)
        app = StreamsApp(tmp_path / "app", proxy.bootstrap, app_id, name["in"], name["out"], GROUPS)
        output = OutputReader(proxy.bootstrap, name["out"]).start()
        try:
            app.start()
            app.wait_running()
            source = InputProducer(proxy.bootstrap, name["in"]).start()
            source.join()
            assert source.errors == [] and source.left == 0, source.errors[:5]
            wait_for(lambda: output.complete(expected), bool, "every update in the output", 90)
            app.close()  # its last transaction committed

            # 2. the changelog uploaded whole and cleaned
            ends = {p: watermarks(proxy.bootstrap, changelog, p)[1] for p in range(PARTITIONS)}
            assert sum(ends.values()) > RECORDS  # every update, and the markers
            proxy.run(lambda: tiering.uploader.flush())
            for s, p in zip(streams, range(PARTITIONS), strict=True):
                state = tiering.state(s)
                wait_until(lambda st=state, s=s, p=p: st.stream_end(s) == ends[p], 30, "uploaded")
            cleaner = tiering.log_cleaner
            report = proxy.run(lambda: cleaner.run_once(None, refresh_configs=True))
            assert set(report.cleaned) == set(streams), report
            totals = {g: f"{len(values)},{sum(values)}" for g, values in expected.items()}
            kept = _read_changelog(proxy.bootstrap, changelog, ends)
            assert sorted(k for records in kept.values() for k, _ in records) == sorted(totals)
            assert {k: v for records in kept.values() for k, v in records} == totals

            # 3. the store rebuilt from the cleaned changelog alone
            shutil.rmtree(tmp_path / "app" / "state")
            app.start()
            app.wait_running()
            want = {f"{changelog}-{p}": len(records) for p, records in kept.items()}
            restored = wait_for(
                lambda: [line.split() for line in app.lines if line.startswith("2 restored ")],
                lambda lines: {words[3] for words in lines} >= set(want),
                "the store's partitions restored",
                60,
            )
            counts = {words[3]: int(words[-1]) for words in restored}
            assert {tp: n for tp, n in counts.items() if n} == want, restored

            # 4. the state restored is the state before: each key's next update continues
            more = range(RECORDS + 1, RECORDS + GROUPS + 1)
            for n in more:
                expected[f"g{n % GROUPS}"].append(n)
            source = InputProducer(proxy.bootstrap, name["in"], more).start()
            source.join()
            assert source.errors == [] and source.left == 0, source.errors[:5]
            wait_for(lambda: output.complete(expected), bool, "the updates after the restore", 90)
        finally:
            output.stop()
            app.close()
        print(
            f"changelog: {sum(ends.values())} offsets written, {report.records_read} records "
            f"read by the clean, {sum(map(len, kept.values()))} kept; restored {counts}"
        )
        assert output.errors == []
        _check(dict(output.updates), expected)
