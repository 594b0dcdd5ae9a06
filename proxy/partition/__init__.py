"""The owner of a tiered partition (docs/sequencer.md): the pure sequencer, producer state and
produce checks beside the asyncio owner that makes batches durable and commits them.
"""
