"""The bandwidth limiter: the token bucket's arithmetic, strict priority with FIFO inside
one, produce never waiting, requests above the burst, cancellation. Time is a manual clock
moved by the test in steps float arithmetic holds exactly (the limiter's timer reads that
clock, so a real timer firing early grants nothing); one test runs on the real clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.objects.ratelimit import BandwidthLimiter, Priority, TokenBucket

PRODUCE, TAIL, COMPACTION, CATCHUP = (
    Priority.PRODUCE,
    Priority.TAIL_READ,
    Priority.COMPACTION,
    Priority.CATCHUP_READ,
)


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return ManualClock()


def limiter_at(clock: ManualClock, rate: float = 100, burst: int = 1000) -> BandwidthLimiter:
    return BandwidthLimiter(rate, burst, clock=clock)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def start(limiter: BandwidthLimiter, priority: Priority, nbytes: int) -> asyncio.Task:
    task = asyncio.create_task(limiter.acquire(priority, nbytes))
    await settle()
    return task


async def advance(limiter: BandwidthLimiter, clock: ManualClock, seconds: float) -> None:
    clock.now += seconds
    limiter.poll()
    await settle()


async def drain(limiter: BandwidthLimiter) -> None:
    """Empty the bucket with one request that does not wait."""
    await limiter.acquire(TAIL, int(limiter.tokens))
    assert limiter.tokens == 0


# -- the bucket ---------------------------------------------------------------------------


def test_a_bucket_starts_full_and_refills_at_its_rate_up_to_the_burst():
    bucket = TokenBucket(rate=100, burst=500, now=10.0)
    assert bucket.tokens == 500
    bucket.take(400)
    bucket.refill(11.0)
    assert bucket.tokens == 200
    bucket.refill(20.0)
    assert bucket.tokens == 500


def test_taking_may_go_into_debt_and_a_request_above_the_burst_needs_it_full():
    bucket = TokenBucket(rate=100, burst=500, now=0.0)
    bucket.take(700)
    assert bucket.tokens == -200
    assert not bucket.ready(1)
    assert bucket.seconds_until_ready(100) == 3.0
    assert bucket.seconds_until_ready(10_000) == 7.0  # to full, not to 10,000
    bucket.refill(7.0)
    assert bucket.ready(10_000)


def test_a_clock_stepping_back_adds_no_tokens():
    bucket = TokenBucket(rate=100, burst=500, now=10.0)
    bucket.take(500)
    bucket.refill(5.0)
    assert bucket.tokens == 0
    bucket.refill(11.0)
    assert bucket.tokens == 100


def test_giving_back_never_fills_above_the_burst():
    bucket = TokenBucket(rate=100, burst=500, now=0.0)
    bucket.take(100)
    bucket.give_back(300)
    assert bucket.tokens == 500


# -- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(("rate", "burst", "key"), [(-1, None, "rate"), (10, 0, "burst")])
def test_a_bad_setting_is_refused_naming_it(rate, burst, key):
    with pytest.raises(ValueError, match=key):
        BandwidthLimiter(rate, burst)


def test_the_burst_defaults_to_one_second_of_the_rate(clock):
    assert BandwidthLimiter(250, clock=clock).tokens == 250


@pytest.mark.parametrize("rate", [None, 0])
async def test_rate_none_or_zero_is_unlimited(rate):
    limiter = BandwidthLimiter(rate)
    assert limiter.unlimited
    for priority in Priority:
        await asyncio.wait_for(limiter.acquire(priority, 10**12), 1)
    assert limiter.stats[CATCHUP].bytes_granted == 10**12
    assert limiter.stats[CATCHUP].waits == 0
    assert limiter.waiting == 0


async def test_a_negative_request_is_refused(clock):
    with pytest.raises(ValueError, match="nbytes"):
        await limiter_at(clock).acquire(TAIL, -1)


# -- priority -----------------------------------------------------------------------------


async def test_a_request_the_bucket_covers_is_granted_at_once(clock):
    limiter = limiter_at(clock)
    task = await start(limiter, CATCHUP, 600)
    assert task.done()
    assert limiter.tokens == 400
    assert limiter.stats[CATCHUP].waits == 0


async def test_a_zero_byte_request_never_waits(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    head = await start(limiter, TAIL, 100)
    empty = await start(limiter, CATCHUP, 0)
    assert empty.done()
    assert not head.done()
    await advance(limiter, clock, 1)
    assert head.done()


async def test_a_request_waits_until_the_bucket_has_refilled_enough(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    task = await start(limiter, TAIL, 300)
    await advance(limiter, clock, 2.5)
    assert not task.done()
    await advance(limiter, clock, 0.5)
    assert task.done()
    assert limiter.stats[TAIL].waits == 1
    assert limiter.stats[TAIL].seconds_waited == 3.0


async def test_produce_never_waits_and_drives_the_bucket_into_debt(clock):
    limiter = limiter_at(clock)
    waiting = await start(limiter, TAIL, 1000)  # takes the whole bucket
    assert waiting.done()
    blocked = await start(limiter, TAIL, 500)
    produce = await start(limiter, PRODUCE, 2000)
    assert produce.done()
    assert not blocked.done()
    assert limiter.tokens == -2000
    await advance(limiter, clock, 24)  # the debt is paid first: 25 s in all
    assert not blocked.done()
    await advance(limiter, clock, 1)
    assert blocked.done()
    assert limiter.stats[PRODUCE].bytes_granted == 2000
    assert limiter.stats[PRODUCE].waits == 0


async def test_waiters_are_served_by_priority_then_in_arrival_order(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    order: list[str] = []

    async def acquire(name: str, priority: Priority) -> None:
        await limiter.acquire(priority, 100)
        order.append(name)

    tasks = []
    for name, priority in [
        ("catchup-1", CATCHUP),
        ("compaction-1", COMPACTION),
        ("catchup-2", CATCHUP),
        ("tail-1", TAIL),
        ("compaction-2", COMPACTION),
        ("tail-2", TAIL),
    ]:
        tasks.append(asyncio.create_task(acquire(name, priority)))
        await settle()
    assert limiter.waiting == 6
    for _ in tasks:
        await advance(limiter, clock, 1)  # room for exactly one
    assert order == ["tail-1", "tail-2", "compaction-1", "compaction-2", "catchup-1", "catchup-2"]
    assert limiter.waiting == 0


async def test_a_small_low_priority_request_does_not_pass_a_large_head(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    large = await start(limiter, TAIL, 800)
    small = await start(limiter, CATCHUP, 10)
    await advance(limiter, clock, 5)  # 500 tokens: the small one would fit
    assert not large.done() and not small.done()
    arriving = await start(limiter, CATCHUP, 10)
    assert not arriving.done()
    await advance(limiter, clock, 3)
    assert large.done()
    assert not small.done()
    await advance(limiter, clock, 0.125)
    assert small.done()
    assert not arriving.done()
    await advance(limiter, clock, 0.125)
    assert arriving.done()


async def test_a_later_higher_priority_request_goes_first(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    catchup = await start(limiter, CATCHUP, 800)
    await advance(limiter, clock, 5)
    tail = await start(limiter, TAIL, 300)  # 500 tokens: it fits, and it is the head now
    assert tail.done()
    assert not catchup.done()
    await advance(limiter, clock, 5)  # 700 tokens
    assert not catchup.done()
    await advance(limiter, clock, 1)
    assert catchup.done()


async def test_a_request_above_the_burst_is_granted_once_the_bucket_is_full(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    huge = await start(limiter, CATCHUP, 5000)
    await advance(limiter, clock, 9.5)
    assert not huge.done()
    await advance(limiter, clock, 0.5)
    assert huge.done()
    assert limiter.tokens == -4000
    after = await start(limiter, TAIL, 100)  # pays the debt first
    await advance(limiter, clock, 40.5)
    assert not after.done()
    await advance(limiter, clock, 0.5)
    assert after.done()


# -- cancellation -------------------------------------------------------------------------


async def test_a_cancelled_head_leaves_and_the_next_waiter_is_served_without_it(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    await advance(limiter, clock, 2)  # 200 tokens
    head = await start(limiter, TAIL, 500)
    nxt = await start(limiter, TAIL, 200)  # would fit, but waits behind the head
    assert not nxt.done()
    head.cancel()
    await settle()
    assert head.cancelled()
    assert nxt.done()  # at once: the cancelled head was all that held it
    assert limiter.waiting == 0
    assert limiter.tokens == 0
    stats = limiter.stats[TAIL]
    assert (stats.grants, stats.waits, stats.seconds_waited) == (2, 1, 0.0)  # not the head


async def test_a_cancelled_waiter_behind_the_head_leaves_the_queue(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    head = await start(limiter, TAIL, 100)
    behind = await start(limiter, CATCHUP, 100)
    last = await start(limiter, CATCHUP, 100)
    behind.cancel()
    await settle()
    assert limiter.waiting == 2
    await advance(limiter, clock, 1)
    assert head.done()
    await advance(limiter, clock, 1)
    assert last.done()
    assert limiter.tokens == 0  # the cancelled one took nothing


async def test_a_waiter_cancelled_after_its_grant_gives_its_bytes_back(clock):
    limiter = limiter_at(clock)
    await drain(limiter)
    granted = await start(limiter, COMPACTION, 400)
    clock.now += 4
    limiter.poll()  # grants it; the task has not run yet
    granted.cancel()
    await settle()
    assert granted.cancelled()
    assert limiter.tokens == 400
    assert limiter.stats[COMPACTION].grants == 0
    assert limiter.stats[COMPACTION].bytes_granted == 0


async def test_counters_per_priority(clock):
    limiter = limiter_at(clock)
    await limiter.acquire(PRODUCE, 1500)
    tail = await start(limiter, TAIL, 100)
    catchup = await start(limiter, CATCHUP, 200)
    await advance(limiter, clock, 6)  # tail at 6 s (the produce left a debt of 500)
    await advance(limiter, clock, 2)  # catchup at 8 s
    assert tail.done() and catchup.done()
    stats = limiter.stats
    assert (stats[PRODUCE].grants, stats[PRODUCE].bytes_granted) == (1, 1500)
    assert (stats[TAIL].bytes_granted, stats[TAIL].waits) == (100, 1)
    assert stats[TAIL].seconds_waited == 6.0
    assert (stats[CATCHUP].bytes_granted, stats[CATCHUP].waits) == (200, 1)
    assert stats[CATCHUP].seconds_waited == 8.0
    assert stats[COMPACTION].grants == 0


# -- the real clock -----------------------------------------------------------------------


async def test_on_the_real_clock_waiters_are_woken_by_the_timer_in_priority_order():
    limiter = BandwidthLimiter(20_000, 1000)  # 1000 bytes every 50 ms
    await limiter.acquire(TAIL, 1000)
    order: list[Priority] = []

    async def acquire(priority: Priority) -> None:
        await limiter.acquire(priority, 1000)
        order.append(priority)

    started = time.monotonic()
    catchup = asyncio.create_task(acquire(CATCHUP))
    await asyncio.sleep(0)
    tail = asyncio.create_task(acquire(TAIL))
    await asyncio.wait_for(asyncio.gather(catchup, tail), 5)
    elapsed = time.monotonic() - started
    assert order == [TAIL, CATCHUP]
    assert elapsed >= 0.09  # two refills of 50 ms
    assert limiter.waiting == 0
