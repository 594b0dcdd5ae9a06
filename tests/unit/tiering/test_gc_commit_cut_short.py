"""Garbage collection of an object whose commit was cut short (proxy/upkeep/object_gc.py).

The uploader commits an object shard by shard. Killed between two shards' commits (the
fault-injection suite does it), the object is committed in some shards only, and the
restarted uploader uploads the other shards' part again, in a new object. Once the
object's ranges are replaced where it was committed, it is garbage there; the shards
that never got its commit never will (a commit must continue the stream's end, which is
past its blocks now), so it goes after the grace. It stayed for ever before. The same
object while the other shard's stream has not reached its block stays (its commit may
still come): test_compactor.py, test_an_object_a_shard_does_not_know_yet_is_kept.
"""

from __future__ import annotations

import pytest
from test_compactor import GRACE, Fleet, kafka_batch

from proxy.metadata.records import ObjectCommit, OffsetRange
from proxy.objects.format import ObjectWriter
from proxy.objects.keys import ObjectKind
from proxy.records.batches import with_base_offset


@pytest.fixture
async def fleet(tmp_path):
    made = Fleet(tmp_path, shard_count=2)
    yield made
    await made.compactor.close()
    await made.store.close()


async def test_an_object_committed_in_some_of_its_shards_goes_once_the_others_moved_past(fleet):
    f = fleet
    keys = [await f.upload(n, shards=(0,)) for n in range(1, 3)]
    # object 3 spans both shards; its commit reached shard 0 only (the uploader was killed)
    s0, s1 = f.streams
    writer = ObjectWriter(3, ObjectKind.STREAM_SET)
    writer.add_batches(s0, with_base_offset(kafka_batch(3), 6))
    writer.add_batches(s1, with_base_offset(kafka_batch(3), 0))
    cut_short = writer.build()
    await f.store.put(cut_short.key, cut_short.pieces)
    f.apply(
        0,
        ObjectCommit(0, 3, ObjectKind.STREAM_SET, cut_short.size, 1, 3, (OffsetRange(s0, 6, 9),)),
    )
    await f.compactor.run_once()  # objects 1-3 replaced in shard 0: garbage there
    assert [c.object_id for c in f.owner.state.garbage_objects()] == [1, 2, 3]
    f.now += 2 * GRACE
    assert await f.compactor.collect_garbage() == []  # 1, 2 seen garbage everywhere from now
    f.now += GRACE
    assert sorted(await f.compactor.collect_garbage()) == [1, 2]  # shard 1 may yet commit 3
    assert await f.exists(cut_short.key)
    # restarted, the uploader puts shard 1's part in a new object, committed there
    f.apply(1, ObjectCommit(0, 4, ObjectKind.STREAM_SET, 100, 1, 4, (OffsetRange(s1, 0, 3),)))
    f.now += GRACE
    assert await f.compactor.collect_garbage() == []  # 3 seen garbage everywhere from now
    f.now += GRACE
    assert await f.compactor.collect_garbage() == [3]
    assert not await f.exists(cut_short.key)
    assert not any([await f.exists(k) for k in keys])
    assert f.states[1].object_commit(3) is None  # never known there
