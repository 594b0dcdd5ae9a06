"""kafka-python, imported once for the tests that use it as a client or to read batches.

kafka-python 3.0 loads its schemas with importlib.resources.read_text, which Python 3.11
deprecates, and the suite turns warnings into errors: the import happens here, under a
filter for that one warning, and tests import the classes from this module. A test that
runs kafka-python code which warns again filters `IMPORT_WARNING` itself.
"""

from __future__ import annotations

import warnings

IMPORT_WARNING = "(read_text|open_text) is deprecated"

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", IMPORT_WARNING, DeprecationWarning)
    from kafka import (
        ConsumerRebalanceListener,
        KafkaAdminClient,
        KafkaConsumer,
        KafkaProducer,
        TopicPartition,
    )
    from kafka.record.default_records import DefaultRecordBatch
    from kafka.record.memory_records import MemoryRecords

__all__ = [
    "IMPORT_WARNING",
    "ConsumerRebalanceListener",
    "DefaultRecordBatch",
    "KafkaAdminClient",
    "KafkaConsumer",
    "KafkaProducer",
    "MemoryRecords",
    "TopicPartition",
]
