"""The fleet's metadata (docs/metadata.md): records and their codec, the pure rules and state
of one shard, stream ids and the topic index; the Kafka adapter (store, reader, shard group,
assignor).
"""
