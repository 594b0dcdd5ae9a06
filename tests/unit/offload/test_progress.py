"""The offload jobs' progress: the plain line and the terminal's bar (tasks, bytes, rate,
time left), and where each goes. The Spark session is a fake here (its status tracker
and accumulator); the CLI tests run the real one."""

from __future__ import annotations

import io
import threading

from offload_jobs.progress import Console, Snapshot, TaskProgress, duration

MIB = 1 << 20


def test_duration_reads_as_a_person_says_it():
    assert duration(0.4) == "0 s"
    assert duration(42) == "42 s"
    assert duration(185) == "3 min 5 s"
    assert duration(2 * 3600 + 7 * 60 + 9) == "2 h 7 min"


def test_a_plain_line_says_tasks_bytes_rate_and_time_left():
    running = Snapshot(done=3, total=7, bytes=12 * MIB, seconds=3.0)
    assert running.rate == 4.0
    assert running.eta == 4.0  # 1 s a task so far, 4 to go
    assert running.line("ranges written") == (
        "3/7 ranges written, 12.0 MiB, 4.0 MiB/s, about 4 s left"
    )
    first = Snapshot(done=0, total=7, bytes=0, seconds=2.0)
    assert first.eta is None
    assert first.line("ranges written").endswith("0.0 MiB/s, time left unknown")
    done = Snapshot(done=7, total=7, bytes=28 * MIB, seconds=7.0)
    assert done.line("ranges written") == "7/7 ranges written, 28.0 MiB in 7 s (4.0 MiB/s)"


def test_the_bar_fills_with_the_tasks_done():
    assert Snapshot(3, 12, 6 * MIB, 3.0).bar("partitions verified", width=12) == (
        "[###.........] 3/12 partitions verified  6.0 MiB  2.0 MiB/s  ETA 9 s"
    )
    assert Snapshot(0, 4, 0, 0.0).bar("x", width=4) == "[....] 0/4 x  0.0 MiB  0.0 MiB/s  ETA --"
    assert Snapshot(4, 4, MIB, 1.0).bar("x", width=4).startswith("[####] 4/4 x")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_console_redraws_a_bar_only_on_a_terminal():
    piped = io.StringIO()
    console = Console(piped)
    assert console.redraw is None
    console.line("a line")
    assert piped.getvalue() == "a line\n"

    screen = Tty()
    console = Console(screen)
    assert console.redraw is not None
    console.redraw("[#...] long text")
    console.redraw("[##..] short")  # padded over the longer one
    console.line("summary")  # starts below the bar
    assert screen.getvalue() == "\r[#...] long text\r[##..] short    \nsummary\n"


class FakeStage:
    def __init__(self, done: int) -> None:
        self.numCompletedTasks = done


class FakeTracker:
    def __init__(self) -> None:
        self.done = 0
        self.looked = threading.Event()

    def getActiveStageIds(self):
        self.looked.set()
        return [1]

    def getStageInfo(self, stage):
        return FakeStage(self.done)


class FakeAccumulator:
    def __init__(self, value: int) -> None:
        self.value = value

    def add(self, n: int) -> None:
        self.value += n


class FakeContext:
    def __init__(self) -> None:
        self.tracker = FakeTracker()

    def statusTracker(self):
        return self.tracker

    def accumulator(self, value: int) -> FakeAccumulator:
        return FakeAccumulator(value)


class FakeSpark:
    def __init__(self) -> None:
        self.sparkContext = FakeContext()


def test_task_progress_counts_the_bytes_of_each_task_and_ends_with_the_total():
    spark = FakeSpark()
    lines: list[str] = []
    watcher = TaskProgress(spark, 2, "partitions exported", lines.append)
    task = watcher.counting(lambda n: {"bytes": n * MIB}, lambda r: r["bytes"])
    assert [task(1), task(3)] == [{"bytes": MIB}, {"bytes": 3 * MIB}]
    assert spark.sparkContext.tracker.looked.wait(10)
    watcher.finished()
    assert lines[-1].startswith("  2/2 partitions exported, 4.0 MiB in ")
    assert lines[-1].endswith(" MiB/s)")
    assert all("\r" not in line for line in lines)


def test_on_a_terminal_the_last_bar_is_full_and_the_summary_line_follows():
    spark = FakeSpark()
    screen = Tty()
    console = Console(screen)
    watcher = TaskProgress(spark, 4, "ranges written", console.line, console.redraw)
    task = watcher.counting(lambda n: n, lambda n: n)
    task(2 * MIB)
    watcher.finished()
    shown = screen.getvalue()
    assert "\r[########################] 4/4 ranges written  2.0 MiB  " in shown
    assert shown.endswith(" MiB/s)\n") and "\n  4/4 ranges written, 2.0 MiB in " in shown
