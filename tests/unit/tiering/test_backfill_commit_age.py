"""An offload job's object is committed only while its PUT (the store's modification
time) is younger than half of `tiering.offload_orphan_grace_s`; missing, it is refused
(proxy/upkeep/backfill.py `too_old`). On a LocalDirectoryStore, the file's mtime set back."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from proxy.metadata.streams import offload_object_id
from proxy.objects.keys import ObjectKind, object_key
from proxy.objects.local import LocalDirectoryStore
from proxy.upkeep.backfill import POLICY_VIOLATION, too_old

GRACE_S = 1000.0
KEY = object_key(offload_object_id(7, 0, 100), ObjectKind.STREAM)


@pytest.mark.parametrize(("age", "refused"), [(0.0, False), (490.0, False), (510.0, True)])
async def test_an_object_put_too_long_ago_is_refused(tmp_path, age, refused):
    async with LocalDirectoryStore(tmp_path) as store:
        await store.put(KEY, b"object bytes")
        then = time.time() - age
        os.utime(tmp_path.joinpath(*KEY.split("/")), (then, then))
        service = SimpleNamespace(
            config=SimpleNamespace(offload_orphan_grace_s=GRACE_S), store=store
        )
        answer = await too_old(service, KEY, "stream 7 [0, 100)")
    if refused:
        code, message = answer
        assert code == POLICY_VIOLATION
        assert KEY in message and "offload_orphan_grace_s" in message and "again" in message
    else:
        assert answer is None


async def test_a_missing_object_is_refused(tmp_path):
    async with LocalDirectoryStore(tmp_path) as store:
        service = SimpleNamespace(
            config=SimpleNamespace(offload_orphan_grace_s=GRACE_S), store=store
        )
        code, message = await too_old(service, KEY, "stream 7 [0, 100)")
    assert code == POLICY_VIOLATION and f"object {KEY} is not in the store" in message
