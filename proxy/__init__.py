"""tierproxy: a Kafka-protocol proxy fleet in front of an existing Kafka cluster."""

__version__ = "0.1.0"
