"""A job's progress while its Spark tasks run: tasks done of all, the bytes they moved,
the rate and an estimate of the time left.

On a terminal it is one bar redrawn in place; anywhere else (a pipe, a file, a CI log)
a plain line each time the count moves, so a log holds no carriage returns. The driver
reads tasks done from Spark's status tracker and the bytes from an accumulator each
finished task adds its bytes to (Spark merges it on the driver as tasks end), so the
tasks themselves report nothing. The formatting (`Snapshot`) is pure.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

T = TypeVar("T")
R = TypeVar("R")
MIB = 1 << 20


def duration(seconds: float) -> str:
    """`42 s`, `3 min 5 s`, `2 h 7 min`: how long, as a person reads it."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where a job stands: `done` of `total` tasks, `bytes` moved by the done ones, after
    `seconds`."""

    done: int
    total: int
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        """MiB/s so far."""
        return self.bytes / MIB / self.seconds if self.seconds > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left, from the pace of the tasks done so far; None before the first."""
        if self.done <= 0 or self.seconds <= 0:
            return None
        return self.seconds / self.done * max(self.total - self.done, 0)

    def line(self, label: str) -> str:
        """The plain line: `3/7 ranges written, 12.0 MiB, 4.0 MiB/s, about 4 s left`."""
        text = f"{self.done}/{self.total} {label}, {self.bytes / MIB:.1f} MiB"
        if self.done >= self.total:
            return f"{text} in {duration(self.seconds)} ({self.rate:.1f} MiB/s)"
        left = "time left unknown" if self.eta is None else f"about {duration(self.eta)} left"
        return f"{text}, {self.rate:.1f} MiB/s, {left}"

    def bar(self, label: str, width: int = 24) -> str:
        """The terminal's bar: `[#########...............] 3/7 ranges written ...`."""
        filled = width * self.done // self.total if self.total > 0 else width
        eta = "--" if self.eta is None else duration(self.eta)
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label}  "
            f"{self.bytes / MIB:.1f} MiB  {self.rate:.1f} MiB/s  ETA {eta}"
        )


class Console:
    """Where a job's lines go (`line`), and on a terminal its bar (`redraw`, else None):
    a line printed while a bar is shown starts below it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        try:
            terminal = self._stream.isatty()
        except (AttributeError, ValueError):
            terminal = False
        self._shown = 0  # the length of the bar on screen, 0 when none is
        self.redraw: Callable[[str], None] | None = self._redraw if terminal else None

    def line(self, text: str) -> None:
        if self._shown:
            self._stream.write("\n")
            self._shown = 0
        self._stream.write(text + "\n")
        self._stream.flush()

    def _redraw(self, text: str) -> None:
        self._stream.write("\r" + text.ljust(self._shown))
        self._stream.flush()
        self._shown = max(len(text), self._shown)


class TaskProgress:
    """Reports a job's progress until `finished()` (or `stop()` when it failed): a plain
    line through `progress` each time the count moves, or the bar through `redraw` each
    half second when given (a terminal). Wrap the task function with `counting` so its
    results' bytes are added up."""

    def __init__(
        self,
        spark,
        total: int,
        label: str,
        progress: Callable[[str], None],
        redraw: Callable[[str], None] | None = None,
    ) -> None:
        self._stop = threading.Event()
        self._total, self._label = total, label
        self._progress, self._redraw = progress, redraw
        self._bytes: Any = spark.sparkContext.accumulator(0)
        self._started = time.monotonic()
        tracker = spark.sparkContext.statusTracker()

        def completed() -> int:
            done = 0
            for stage in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage)
                if info is not None:
                    done += info.numCompletedTasks
            return done

        def watch() -> None:
            last = None
            while not self._stop.wait(0.5 if redraw is not None else 1.0):
                now = self._snapshot(completed())
                if redraw is not None:
                    redraw(now.bar(label))
                elif now.done != last:
                    progress("  " + now.line(label))
                    last = now.done

        self._thread = threading.Thread(target=watch, name=f"progress-{label}", daemon=True)
        self._thread.start()

    def _snapshot(self, done: int) -> Snapshot:
        done = min(done, self._total)
        return Snapshot(done, self._total, self._bytes.value, time.monotonic() - self._started)

    def counting(self, task: Callable[[T], R], size: Callable[[R], int]) -> Callable[[T], R]:
        """`task` as a Spark task that adds `size(result)` to this job's bytes."""
        moved = self._bytes  # the accumulator alone travels to the executors

        def run(item: T) -> R:
            result = task(item)
            moved.add(size(result))
            return result

        return run

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def finished(self) -> None:
        """The job's tasks all came back: stop, and say the last count (`total/total`,
        with the bytes, time and rate) even when the job ended between two looks."""
        self.stop()
        final = self._snapshot(self._total)
        if self._redraw is not None:
            self._redraw(final.bar(self._label))
        self._progress("  " + final.line(self._label))
