"""Segment files, the trim checkpoint, and recovery (docs/wal.md, "Segments", "Recovery").

Modelled on Kafka's LogSegment: a segment is named by its first WAL offset, zero-padded to
20 digits (`00000000000000000000.wal`); a state change is a rename (`.deleted` before a
removal, `.tmp` before a checkpoint becomes current); `recover` validates every entry,
cuts the torn tail of the last segment and reports how many bytes it cut.

Blocking code: the WAL runs it on a worker thread.
"""

from __future__ import annotations

import bisect
import posixpath
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

from proxy.wal.entry import HEADER_SIZE, Stop, announced_size, classify_stop, read_entries
from proxy.wal.fs import Filesystem, WalFile
from proxy.wal.types import WalCorruptError, WalEntry, WalOffsetOutOfRange, WalPosition

SEGMENT_SUFFIX = ".wal"
DELETED_SUFFIX = ".deleted"
TMP_SUFFIX = ".tmp"
CHECKPOINT_NAME = "trim-checkpoint"

_SEGMENT_NAME = re.compile(r"^(\d{20})\.wal$")
# version u8, trimmed_to u64 BE, then the CRC-32C of those 9 bytes
_CHECKPOINT = struct.Struct(">BQ")
_CHECKPOINT_VERSION = 1


def segment_name(base: int) -> str:
    return f"{base:020d}{SEGMENT_SUFFIX}"


def parse_segment_name(name: str) -> int | None:
    match = _SEGMENT_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class Segment:
    """A segment file holding the WAL offsets [base, base + size)."""

    path: str
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


@dataclass(frozen=True, slots=True)
class Recovery:
    """What `recover` found and did."""

    segments: tuple[Segment, ...]  # retained, in order; the last one is the active one
    trimmed_to: int  # entries ending at or before this were uploaded (the checkpoint)
    entries: int  # entries to replay: the ones ending after `trimmed_to`
    truncated_bytes: int  # torn tail cut from the last segment
    deleted_segments: int  # segments found wholly below the checkpoint and removed
    removed_files: tuple[str, ...]  # leftover `.deleted` / `.tmp` files removed

    @property
    def log_start(self) -> int:
        return self.segments[0].base

    @property
    def end(self) -> int:
        return self.segments[-1].end


# -- reading entries back ---------------------------------------------------------------


def read_segment(
    file: WalFile,
    segment_base: int,
    start: int,
    limit: int,
    max_bytes: int,
    at_least_one: bool = True,
) -> tuple[list[WalEntry], int, bytes]:
    """Entries of one segment file from in-file offset `start`, not past `limit`, taking
    at most `max_bytes` unless `at_least_one` and the first entry alone is larger (then
    just that one, as a Kafka fetch does). Returns them, the in-file offset after them,
    and the bytes read when nothing could be returned (for `classify_stop`)."""
    # enough for the first entry's header, whatever `max_bytes` says
    want = min(max(max_bytes, HEADER_SIZE) if at_least_one else max_bytes, limit - start)
    buf = file.read(start, want)
    entries, valid = read_entries(buf)
    if valid == 0 and at_least_one:
        announced = announced_size(buf)
        if announced is not None and want < announced <= limit - start:
            buf = file.read(start, announced)
            entries, valid = read_entries(buf)
    base = segment_base + start
    found = [
        WalEntry(
            position=WalPosition(base + entry.offset, base + entry.offset + entry.size),
            stream_id=entry.stream_id,
            base_offset=entry.base_offset,
            batch=entry.batch,
            reference=entry.reference,
        )
        for entry in entries
    ]
    return found, start + valid, buf if valid == 0 else b""


def read_range(
    fs: Filesystem, segments: Sequence[Segment], offset: int, end: int, max_bytes: int
) -> list[WalEntry]:
    """Entries from WAL offset `offset` (an entry's start) up to `end`, across segments,
    about `max_bytes` of them and at least one. Opens each file by name: a segment
    removed meanwhile is WalOffsetOutOfRange."""
    index = bisect.bisect_right([s.base for s in segments], offset) - 1
    found: list[WalEntry] = []
    budget = max_bytes
    while 0 <= index < len(segments) and offset < end and budget > 0:
        segment = segments[index]
        if offset >= segment.end:
            index += 1
            continue
        try:
            file = fs.open(segment.path, "read")
        except FileNotFoundError:
            raise WalOffsetOutOfRange(f"WAL offset {offset} was trimmed while being read") from None
        try:
            limit = min(segment.end, end) - segment.base
            entries, _, _ = read_segment(
                file, segment.base, offset - segment.base, limit, budget, not found
            )
        finally:
            file.close()
        if not entries:
            if found:
                break
            raise WalCorruptError(
                f"no whole entry starts at WAL offset {offset} in {segment.path}: "
                "not the start of an entry, or damaged data"
            )
        found.extend(entries)
        budget -= sum(entry.position.size for entry in entries)
        offset = entries[-1].position.end
    return found


def scan_segment(
    file: WalFile, segment_base: int, size: int, chunk_bytes: int, count_after: int
) -> tuple[int, Stop, int]:
    """Validate a whole segment file: the in-file offset where its whole entries end, why
    they end there, and how many of them end after WAL offset `count_after`."""
    pos = 0
    count = 0
    while pos < size:
        entries, after, rest = read_segment(file, segment_base, pos, size, chunk_bytes)
        if not entries:
            return pos, classify_stop(rest, 0), count
        count += sum(1 for entry in entries if entry.position.end > count_after)
        pos = after
    return pos, Stop.END, count


# -- the trim checkpoint ----------------------------------------------------------------


def encode_checkpoint(trimmed_to: int) -> bytes:
    body = _CHECKPOINT.pack(_CHECKPOINT_VERSION, trimmed_to)
    return body + struct.pack(">I", crc32c(body))


def decode_checkpoint(data: bytes) -> int | None:
    """The offset in a checkpoint file, or None when it is not a whole, valid one (it is
    never fsynced: after a crash it may be empty, and an older value is always safe)."""
    if len(data) != _CHECKPOINT.size + 4:
        return None
    body = data[: _CHECKPOINT.size]
    if struct.unpack(">I", data[_CHECKPOINT.size :])[0] != crc32c(body):
        return None
    version, trimmed_to = _CHECKPOINT.unpack(body)
    return trimmed_to if version == _CHECKPOINT_VERSION else None


def read_checkpoint(fs: Filesystem, directory: str) -> int:
    try:
        file = fs.open(posixpath.join(directory, CHECKPOINT_NAME), "read")
    except FileNotFoundError:
        return 0
    try:
        return decode_checkpoint(file.read(0, 64)) or 0
    finally:
        file.close()


def backlog_bytes(fs: Filesystem, directory: str) -> int:
    """WAL bytes past the trim checkpoint, from the files alone (the WAL may be running or
    not): what it acknowledged and has not committed yet, as far as the disk says. A
    directory that does not exist holds none."""
    try:
        names = fs.list_dir(directory)
    except FileNotFoundError:
        return 0
    end = 0
    for name in names:
        base = parse_segment_name(name)
        if base is None:
            continue
        file = fs.open(posixpath.join(directory, name), "read")
        try:
            end = max(end, base + file.size())
        finally:
            file.close()
    return max(0, end - read_checkpoint(fs, directory))


def write_checkpoint(fs: Filesystem, directory: str, trimmed_to: int) -> None:
    """Write the new value beside the old one, then rename it over: a reader sees one or
    the other, never half of one."""
    tmp = posixpath.join(directory, CHECKPOINT_NAME + TMP_SUFFIX)
    try:
        fs.unlink(tmp)
    except FileNotFoundError:
        pass
    file = fs.open(tmp, "create")
    try:
        file.write([encode_checkpoint(trimmed_to)])
    finally:
        file.close()
    fs.rename(tmp, posixpath.join(directory, CHECKPOINT_NAME))


# -- segment lifecycle ------------------------------------------------------------------


def create_segment(fs: Filesystem, directory: str, base: int) -> tuple[Segment, WalFile]:
    """A new, empty segment, its name durable before anything is written to it."""
    path = posixpath.join(directory, segment_name(base))
    file = fs.open(path, "create")
    try:
        fs.fsync_dir(directory)
    except BaseException:
        file.close()
        raise
    return Segment(path, base, 0), file


def delete_segment(fs: Filesystem, segment: Segment) -> None:
    """Rename, then remove: a crash in between leaves a `.deleted` file that the next
    `recover` removes, never a half-deleted segment taken for a live one."""
    deleted = segment.path + DELETED_SUFFIX
    try:
        fs.rename(segment.path, deleted)
    except FileNotFoundError:
        pass  # a retry: an earlier attempt got this far
    try:
        fs.unlink(deleted)
    except FileNotFoundError:
        pass


def trim_segments(
    fs: Filesystem, directory: str, doomed: Sequence[Segment], trimmed_to: int
) -> tuple[int, OSError | None]:
    """Remove `doomed` (the oldest segments, in order), then record the trim point. How
    many were removed, and the error that stopped it, if one did. A failure here does not
    break the WAL: the next trim retries the removal, and a stale checkpoint only means
    more replay."""
    deleted = 0
    try:
        for segment in doomed:
            delete_segment(fs, segment)
            deleted += 1
        write_checkpoint(fs, directory, trimmed_to)
    except OSError as exc:
        return deleted, exc
    return deleted, None


def recover(fs: Filesystem, directory: str, chunk_bytes: int = 8 << 20) -> Recovery:
    """Bring a WAL directory to a state `append` can continue from, after any crash.

    Removes leftover `.deleted` and `.tmp` files and segments wholly below the trim
    checkpoint; validates every entry of the other segments; cuts the last segment after
    its last whole entry (a torn or corrupt tail: writes that were never acknowledged)
    and makes the cut durable. Raises WalCorruptError rather than cut anything else: an
    earlier segment was fsynced whole before the next one was started, so damage there,
    a gap between segments, or entries of a newer format, mean acknowledged data is at
    stake and an operator must look."""
    fs.make_dirs(directory)
    removed: list[str] = []
    bases: list[tuple[int, str]] = []
    for name in sorted(fs.list_dir(directory)):
        if name.endswith(DELETED_SUFFIX) or name.endswith(TMP_SUFFIX):
            fs.unlink(posixpath.join(directory, name))
            removed.append(name)
        elif (base := parse_segment_name(name)) is not None:
            bases.append((base, posixpath.join(directory, name)))
    bases.sort()
    checkpoint = read_checkpoint(fs, directory)

    if not bases:
        segment, file = create_segment(fs, directory, checkpoint)
        file.close()
        return Recovery((segment,), checkpoint, 0, 0, 0, tuple(removed))

    deleted = 0
    segments: list[Segment] = []
    truncated = 0
    entries = 0
    for index, (base, path) in enumerate(bases):
        last = index == len(bases) - 1
        if not last and not segments and bases[index + 1][0] <= checkpoint:
            # wholly uploaded: its removal was cut short by a crash, or never made durable
            delete_segment(fs, Segment(path, base, 0))
            deleted += 1
            continue
        file = fs.open(path, "append" if last else "read")
        try:
            size = file.size()
            if segments and segments[-1].end != base:
                raise WalCorruptError(
                    f"WAL segments are not contiguous: {segments[-1].path} ends at WAL "
                    f"offset {segments[-1].end}, the next segment {path} starts at {base}"
                )
            valid, stop, count = scan_segment(file, base, size, chunk_bytes, checkpoint)
            entries += count
            if stop is Stop.UNKNOWN_VERSION:
                raise WalCorruptError(
                    f"{path} at byte {valid}: an entry of a WAL format newer than this "
                    "code reads (a newer proxy wrote it); refusing to cut it"
                )
            if stop is not Stop.END and not last:
                raise WalCorruptError(
                    f"{path} at byte {valid} of {size}: {stop.value} entry in a segment "
                    "that was complete and fsynced before the next one began"
                )
            if valid < size:
                file.truncate(valid)
                file.fsync()
                truncated = size - valid
            segments.append(Segment(path, base, valid))
        finally:
            file.close()

    trimmed_to = min(max(checkpoint, segments[0].base), segments[-1].end)
    return Recovery(tuple(segments), trimmed_to, entries, truncated, deleted, tuple(removed))
