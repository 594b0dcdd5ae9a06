"""The uploader (docs/uploader.md): WAL data into stream objects, committed, then trimmed; its
pure plan and settings beside the asyncio runner.
"""
