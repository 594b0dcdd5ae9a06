"""The owner's log cache: reads by Kafka's max-bytes rule, eviction of uploaded batches
only (oldest first across streams), the bound that never fails an append, and long-poll
waiters woken by append and drop and gone after their timeout."""

from __future__ import annotations

import asyncio

import pytest

from proxy.reads.logcache import LogCache

A, B, C = 1, 2, 3
LONG_MS = 10_000  # a wait the test ends long before


def data(size: int, fill: int = 7) -> bytes:
    return bytes([fill]) * size


def fill(cache: LogCache, stream: int, sizes: list[int], records: int = 1) -> None:
    """Append one entry per size, `records` offsets each, continuing the stream."""
    for size in sizes:
        base = cache.end_offset(stream) or 0
        cache.append(stream, base, base + records - 1, data(size, base % 251))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# -- append and read ----------------------------------------------------------------------


def test_a_read_returns_views_of_the_appended_bytes_not_copies():
    cache = LogCache(10_000)
    first, second = data(100, 1), bytearray(data(50, 2))
    view = memoryview(second)
    cache.append(A, 40, 44, first)
    cache.append(A, 45, 45, view)
    batches, next_offset = cache.read(A, 40, 10_000)
    assert [bytes(b) for b in batches] == [first, bytes(second)]
    assert batches[0].obj is first
    assert batches[1] is view
    assert next_offset == 46
    assert (cache.start_offset(A), cache.end_offset(A)) == (40, 46)
    assert (cache.hits, cache.misses, cache.bytes, cache.bytes_read) == (1, 0, 150, 150)


@pytest.mark.parametrize(
    ("max_bytes", "sizes", "next_offset"),
    [
        (50, [100], 1),  # the first whole, though above max_bytes
        (299, [100], 1),
        (300, [100, 200], 2),  # exactly max_bytes: included
        (10_000, [100, 200, 300], 3),
    ],
)
def test_a_read_takes_the_first_batch_whole_then_stops_before_max_bytes(
    max_bytes, sizes, next_offset
):
    cache = LogCache(10_000)
    fill(cache, A, [100, 200, 300])
    batches, got_next = cache.read(A, 0, max_bytes)
    assert [b.nbytes for b in batches] == sizes
    assert got_next == next_offset


def test_a_read_inside_a_batch_returns_that_batch_whole():
    cache = LogCache(10_000)
    fill(cache, A, [100, 100, 100], records=10)  # [0, 9], [10, 19], [20, 29]
    batches, next_offset = cache.read(A, 15, 100)
    assert batches[0].obj is cache.read(A, 10, 100)[0][0].obj
    assert next_offset == 20
    assert cache.read(A, 29, 10_000)[1] == 30


def test_below_what_the_cache_holds_is_a_miss_and_at_the_end_is_empty():
    cache = LogCache(10_000)
    cache.append(A, 100, 109, data(10))
    assert cache.read(A, 99, 1000) == ([], 99)
    assert cache.read(B, 0, 1000) == ([], 0)  # a stream it does not hold
    assert cache.misses == 2
    assert cache.read(A, 110, 1000) == ([], 110)
    assert cache.read(A, 500, 1000) == ([], 500)
    assert (cache.misses, cache.hits) == (2, 0)
    assert cache.end_offset(B) is None and cache.start_offset(B) is None


@pytest.mark.parametrize(
    ("base", "last", "size"),
    [(11, 11, 10), (9, 9, 10), (5, 15, 10), (10, 9, 10), (10, 10, 0)],
    ids=["gap", "overlap", "straddle", "last-before-base", "empty"],
)
def test_an_append_that_does_not_continue_the_stream_is_refused(base, last, size):
    cache = LogCache(10_000)
    fill(cache, A, [10], records=10)
    with pytest.raises(ValueError, match=f"stream {A}"):
        cache.append(A, base, last, data(size))
    assert (cache.end_offset(A), cache.bytes) == (10, 10)


@pytest.mark.parametrize("max_bytes", [0, -1, True, 1.5])
def test_a_bad_bound_is_refused_naming_it(max_bytes):
    with pytest.raises(ValueError, match="max_bytes"):
        LogCache(max_bytes)


# -- the bound ----------------------------------------------------------------------------


def test_over_the_bound_with_nothing_uploaded_the_append_succeeds_and_is_counted():
    cache = LogCache(300)
    fill(cache, A, [100, 100, 100])
    assert cache.overflows == 0
    fill(cache, A, [100])
    assert (cache.bytes, cache.overflows, cache.evictions) == (400, 1, 0)
    assert len(cache.read(A, 0, 10_000)[0]) == 4


def test_an_upload_lets_the_oldest_go_down_to_the_bound_and_no_further():
    cache = LogCache(300)
    fill(cache, A, [100, 100, 100, 100])
    cache.uploaded(A, 3)  # offsets 0, 1, 2 may go; one has to
    assert (cache.bytes, cache.evictions, cache.evicted_bytes) == (300, 1, 100)
    assert cache.start_offset(A) == 1
    assert cache.read(A, 0, 1000) == ([], 0)
    assert cache.read(A, 1, 1000)[1] == 4


def test_the_oldest_uploaded_batches_go_first_across_streams():
    cache = LogCache(400)
    for stream in (A, B, A, B):
        fill(cache, stream, [100])
    cache.uploaded(A, 2)
    cache.uploaded(B, 2)
    fill(cache, C, [100])
    assert (cache.start_offset(A), cache.start_offset(B)) == (1, 0)
    fill(cache, C, [100])
    assert (cache.start_offset(A), cache.start_offset(B)) == (1, 1)
    fill(cache, C, [100])
    assert (cache.start_offset(A), cache.start_offset(B)) == (2, 1)
    assert cache.evictions == 3 and cache.overflows == 0


def test_a_batch_is_uploaded_only_once_its_last_offset_is_below_the_end():
    cache = LogCache(100)
    fill(cache, A, [100, 100], records=10)  # [0, 9], [10, 19]; over the bound
    cache.uploaded(A, 9)
    assert cache.evictions == 0
    cache.uploaded(A, 10)
    assert cache.evictions == 1
    assert cache.start_offset(A) == 10


def test_a_batch_an_upload_already_covered_may_go_at_once():
    cache = LogCache(100)
    fill(cache, A, [100])
    cache.uploaded(A, 5)  # the commit of [0, 4] came before [1, 4] reached the cache
    fill(cache, B, [100])  # A's [0] goes: A holds nothing now
    assert (cache.start_offset(A), cache.evictions) == (1, 1)
    fill(cache, A, [100], records=4)  # [1, 4]: goes at once, B's is not uploaded
    assert (cache.start_offset(A), cache.start_offset(B)) == (5, 0)
    assert (cache.evictions, cache.overflows) == (2, 0)


def test_an_upload_of_a_stream_it_does_not_hold_is_ignored():
    cache = LogCache(100)
    cache.uploaded(A, 50)
    assert cache.end_offset(A) is None
    cache.append(A, 0, 0, data(200))
    assert (cache.evictions, cache.overflows) == (0, 1)


def test_a_batch_larger_than_the_bound_stays_until_uploaded_and_the_end_stays_after():
    cache = LogCache(100)
    fill(cache, A, [500], records=3)
    assert (cache.bytes, cache.overflows) == (500, 1)
    assert cache.read(A, 0, 100)[0][0].nbytes == 500
    cache.uploaded(A, 3)
    assert (cache.bytes, cache.evictions) == (0, 1)
    assert (cache.start_offset(A), cache.end_offset(A)) == (3, 3)
    misses = cache.misses
    assert cache.read(A, 3, 100) == ([], 3)
    assert cache.misses == misses
    fill(cache, A, [10])
    assert cache.read(A, 3, 100)[1] == 4


def test_drop_forgets_the_stream_without_counting_evictions():
    cache = LogCache(300)
    fill(cache, A, [100, 100])
    cache.uploaded(A, 2)  # in the eviction order, though nothing has to go yet
    fill(cache, B, [100])
    cache.drop(A)
    assert (cache.bytes, cache.evictions) == (100, 0)
    assert cache.end_offset(A) is None
    assert cache.read(A, 0, 100) == ([], 0)
    fill(cache, B, [100, 100, 100])  # over, and A left the eviction order with it
    assert (cache.bytes, cache.evictions, cache.overflows) == (400, 0, 1)
    cache.uploaded(B, 4)
    assert (cache.bytes, cache.evictions, cache.start_offset(B)) == (300, 1, 1)
    cache.append(A, 900, 900, data(10))  # a stream that comes back starts anywhere
    assert (cache.start_offset(A), cache.end_offset(A)) == (900, 901)


# -- long polls ---------------------------------------------------------------------------


async def test_a_wait_with_data_already_there_returns_at_once():
    cache = LogCache(1000)
    fill(cache, A, [10, 10])
    assert await cache.wait_for_data(A, 1, LONG_MS) is True
    assert await cache.wait_for_data(A, 0, 0) is True
    assert await cache.wait_for_data(A, 2, 0) is False
    assert cache.waiting == 0


async def test_an_append_wakes_every_waiter_it_reaches_and_no_other():
    cache = LogCache(1000)
    fill(cache, A, [10], records=5)  # end 5
    near = [asyncio.create_task(cache.wait_for_data(A, 5, LONG_MS)) for _ in range(3)]
    edge = asyncio.create_task(cache.wait_for_data(A, 7, LONG_MS))
    far = asyncio.create_task(cache.wait_for_data(A, 8, LONG_MS))
    other = asyncio.create_task(cache.wait_for_data(B, 0, LONG_MS))
    await settle()
    assert cache.waiting == 6
    fill(cache, A, [10], records=3)  # [5, 7]: end 8
    await settle()
    assert [t.result() for t in near if t.done()] == [True, True, True]
    assert edge.done() and edge.result() is True
    assert not far.done() and not other.done()
    assert cache.waiting == 2
    fill(cache, A, [10])
    fill(cache, B, [10])  # the first append of a stream wakes its waiters too
    assert await far is True
    assert await other is True
    assert cache.waiting == 0


async def test_a_wait_times_out_and_leaves_no_waiter_behind():
    cache = LogCache(1000)
    fill(cache, A, [10])
    for _ in range(3):
        assert await cache.wait_for_data(A, 1, 5) is False
    assert await cache.wait_for_data(B, 0, 5) is False
    assert cache.waiting == 0
    assert not cache._waiters  # no empty per-stream table left either


async def test_drop_wakes_the_waiters_of_that_stream_only():
    cache = LogCache(1000)
    fill(cache, A, [10])
    fill(cache, B, [10])
    dropped = [asyncio.create_task(cache.wait_for_data(A, 1, LONG_MS)) for _ in range(2)]
    kept = asyncio.create_task(cache.wait_for_data(B, 1, LONG_MS))
    await settle()
    cache.drop(A)
    assert await asyncio.gather(*dropped) == [False, False]
    assert not kept.done()
    kept.cancel()
    await settle()
    assert kept.cancelled()
    assert cache.waiting == 0


async def test_a_cancelled_waiter_leaves_and_the_others_still_wake():
    cache = LogCache(1000)
    fill(cache, A, [10])
    gone = asyncio.create_task(cache.wait_for_data(A, 1, LONG_MS))
    stays = asyncio.create_task(cache.wait_for_data(A, 1, LONG_MS))
    await settle()
    gone.cancel()
    await settle()
    assert cache.waiting == 1
    fill(cache, A, [10])
    assert await stays is True
    assert cache.waiting == 0


# -- a rebuilt partition's tail -----------------------------------------------------------


def test_entries_left_in_the_wal_are_found_until_uploaded_or_dropped():
    cache = LogCache(1_000)
    cache.in_wal(A, 10, 14, "at-0")
    cache.in_wal(A, 15, 15, "at-9")
    cache.append(A, 16, 19, data(100))  # the newest recovered entry fits
    assert [cache.wal_position(A, o) for o in (9, 10, 14, 15, 16)] == [
        None,
        "at-0",
        "at-0",
        "at-9",
        None,
    ]
    assert cache.read(A, 12, 1_000) == ([], 12)  # a miss: the reader goes to the WAL
    cache.uploaded(A, 15)
    assert (cache.wal_position(A, 14), cache.wal_position(A, 15)) == (None, "at-9")
    cache.uploaded(A, 16)
    assert cache.wal_position(A, 15) is None
    cache.in_wal(B, 0, 0, "b")
    cache.drop(B)
    assert cache.wal_position(B, 0) is None


def test_room_is_the_bound_less_what_is_not_uploaded():
    cache = LogCache(1_000)
    fill(cache, A, [300, 200])
    fill(cache, B, [100])
    assert cache.room == 400
    cache.uploaded(A, 1)  # A's first entry may be evicted
    assert cache.room == 700
    fill(cache, B, [2_000])  # over the bound: no room, never negative
    assert cache.room == 0
