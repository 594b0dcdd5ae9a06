"""The proxy's own errors share one base, and each subsystem's family its own under it."""

import pytest

from proxy.errors import TierproxyError
from proxy.handoff.writer import S3WalClosedError, S3WalError, S3WalPutError
from proxy.metadata.group import MetadataTopicError
from proxy.metadata.records import MetadataError, MetadataRecordError
from proxy.metadata.store import ShardFenced
from proxy.objects.store import ObjectExists, ObjectNotFound, ObjectStoreError
from proxy.wal.types import (
    WalBrokenError,
    WalClosedError,
    WalCorruptError,
    WalError,
    WalOffsetOutOfRange,
)

FAMILIES = {
    ObjectStoreError: (ObjectNotFound, ObjectExists),
    WalError: (WalBrokenError, WalClosedError, WalCorruptError, WalOffsetOutOfRange),
    MetadataError: (MetadataRecordError, ShardFenced, MetadataTopicError),
    S3WalError: (S3WalPutError, S3WalClosedError),
}


@pytest.mark.parametrize("base", FAMILIES, ids=lambda base: base.__name__)
def test_each_family_is_the_proxys(base):
    assert issubclass(base, TierproxyError)
    for error in FAMILIES[base]:
        assert issubclass(error, base), error


def test_bad_metadata_bytes_are_still_a_value_error():
    assert issubclass(MetadataRecordError, ValueError)
