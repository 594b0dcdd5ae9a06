"""A progress line per second while a Spark job runs: its tasks done of all."""

from __future__ import annotations

import threading
from collections.abc import Callable


class TaskProgress:
    """Reports `<done>/<total> <label>` each second the count moves; `stop()` when the
    job is over. Reads Spark's status tracker on the driver, so tasks report nothing."""

    def __init__(self, spark, total: int, label: str, progress: Callable[[str], None]) -> None:
        self._stop = threading.Event()
        self._total, self._label, self._progress = total, label, progress
        self._last: int | None = None
        tracker = spark.sparkContext.statusTracker()

        def watch() -> None:
            last = None
            while not self._stop.wait(1.0):
                done = 0
                for stage in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage)
                    if info is not None:
                        done += info.numCompletedTasks
                if done != last:
                    progress(f"  {done}/{total} {label}")
                    last = self._last = done

        self._thread = threading.Thread(target=watch, name=f"progress-{label}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def finished(self) -> None:
        """The job's tasks all came back: stop, with the last count (`total/total`) said
        even when the job ended between two looks."""
        self.stop()
        if self._last != self._total:
            self._progress(f"  {self._total}/{self._total} {self._label}")
