"""Local runtime of the real components tierproxy works with: Apache Kafka, MinIO, PySpark.

Shared by the tests, the benchmarks and `tierproxy dev`. Every component runs as a
real process started from the project's cache (see docs/devstack.md):

- `KafkaCluster`: Apache Kafka in KRaft mode from its released jars, one node or
  several with `broker.rack` set, on free loopback ports.
- `MinioServer`: MinIO built from source at a pinned version, with a bucket.
- `spark.spark_session`: PySpark `local[*]` running the project's own interpreter.
"""

from proxy.devstack.kafka import KafkaCluster
from proxy.devstack.minio import MinioServer
from proxy.devstack.paths import DevstackError, cache_dir, versions
from proxy.devstack.process import ManagedProcess

__all__ = [
    "DevstackError",
    "KafkaCluster",
    "ManagedProcess",
    "MinioServer",
    "cache_dir",
    "versions",
]
