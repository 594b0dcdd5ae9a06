"""What an Iceberg export's snapshot covers, in its summary: per partition, the offset it
has decided everything below (`end`) and the transactions it left open there (producer
id -> offset of the transaction's first batch). Pure: no I/O.

The table is the job's only state: a run reads the last snapshot that carries these
offsets, exports from there (`Resume.start`), and commits its files and the new offsets
in one snapshot, atomically. A run that dies before its commit leaves files no snapshot
names and the offsets as they were, so the next run writes the same records again, once;
a run after a commit starts past what it committed. Either way no record is exported
twice or never.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from offload_jobs.export_records import Resume

TOPIC_KEY = "tierproxy.topic"  # a table property and a summary property
OFFSETS_KEY = "tierproxy.offsets"  # a summary property: encode()'s JSON


class OffsetsError(ValueError):
    """A summary whose offsets cannot be read (written by something else)."""


def encode(topic: str, resumes: Mapping[int, Resume]) -> dict[str, str]:
    """The snapshot summary's properties."""
    body = {
        str(partition): {"end": r.end, "open": {str(p): o for p, o in sorted(r.open.items())}}
        for partition, r in sorted(resumes.items())
    }
    return {TOPIC_KEY: topic, OFFSETS_KEY: json.dumps(body, separators=(",", ":"))}


def decode(summary: Mapping[str, str]) -> dict[int, Resume] | None:
    """The offsets of a snapshot's summary; None for a snapshot without them (written
    by another tool: an expire, a compaction)."""
    text = summary.get(OFFSETS_KEY)
    if text is None:
        return None
    try:
        body = json.loads(text)
        return {
            int(partition): Resume(
                int(entry["end"]), {int(p): int(o) for p, o in entry.get("open", {}).items()}
            )
            for partition, entry in body.items()
        }
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise OffsetsError(f"snapshot property {OFFSETS_KEY} unreadable: {exc}") from None


def last_offsets(summaries: Iterable[Mapping[str, str]]) -> dict[int, Resume]:
    """From a table's snapshots, newest first along the current branch: the offsets of
    the newest that has them (empty: nothing exported yet)."""
    for summary in summaries:
        found = decode(summary)
        if found is not None:
            return found
    return {}


def advanced(
    before: Mapping[int, Resume], runs: Mapping[int, tuple[int, dict[int, int]]]
) -> dict[int, Resume]:
    """The offsets after a run: each partition the run read ends at the end of what it
    read, with the transactions still open there; the others keep theirs."""
    after = dict(before)
    for partition, (end, still_open) in runs.items():
        previous = before.get(partition, Resume())
        after[partition] = Resume(max(end, previous.end), dict(still_open))
    return after
