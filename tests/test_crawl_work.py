"""The distributed crawl's remaining work as a worker counts it (``distributed/pending.py``), on an
injected clock: when a look at the workers stands in for a full count, and when it does not."""

from __future__ import annotations

from scrapy_openclaw.distributed.pending import RECOUNT_EVERY, CrawlWork
from scrapy_openclaw.distributed.rounds import Round


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _count(ready: int, others_busy: int) -> Round:
    res = Round()
    res.count, res.others_busy, res.stable = (ready, 0, 0, ready), others_busy, True
    return res


def _look(others_busy: int) -> Round:
    res = Round()
    res.others_busy = others_busy
    return res


def test_a_look_stands_in_for_a_count_only_while_another_worker_is_busy() -> None:
    clock = Clock()
    work = CrawlWork(clock)
    assert not work.look_suffices()  # nothing counted yet
    work.counted(_count(0, others_busy=1))
    assert work.look_suffices()
    clock.now += 2.5
    work.looked(_look(1))
    assert work.asked_age() == 0 and work.age() == 2.5  # a look is not a count
    assert work.look_suffices() and work.pending(0, 0, background=True) == (1, False)  # cannot close
    clock.now += RECOUNT_EVERY
    assert not work.look_suffices()  # a full count now and then, for the progress figures


def test_a_look_that_finds_nobody_busy_asks_for_a_full_count_at_once() -> None:
    clock = Clock()
    work = CrawlWork(clock)
    work.counted(_count(3, others_busy=1))
    clock.now += 2.0
    work.looked(_look(0))  # the crawl may be over: the stale count cannot say so
    assert not work.look_suffices()
    assert work.asked_age() > RECOUNT_EVERY  # the next look at the pending count counts


def test_a_worker_turning_idle_makes_the_next_look_a_count() -> None:
    clock = Clock()
    work = CrawlWork(clock)
    work.counted(_count(0, others_busy=1))
    work.recount()
    assert not work.look_suffices() and work.asked_age() > RECOUNT_EVERY
