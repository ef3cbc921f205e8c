"""The checkpoint's request tracker and record format as units: no crawl, no files."""

from __future__ import annotations

import hashlib

from scrapy import Request

from scrapy_openclaw.checkpoint import records
from scrapy_openclaw.checkpoint.state import RecoveredState
from scrapy_openclaw.checkpoint.tracker import RequestTracker


def _tracker(filtering: bool = True) -> RequestTracker:
    return RequestTracker(
        lambda r: hashlib.sha1(r.url.encode()).digest(), lambda r: f'{{"url":"{r.url}"}}', filtering=filtering
    )


def _replay(payloads: list[str], state: RecoveredState | None = None) -> RecoveredState:
    state = state or RecoveredState()
    records.apply_payloads(state, payloads)
    return state


def test_a_request_is_live_from_enqueued_to_finished_and_the_journal_says_so() -> None:
    t = _tracker()
    a, b = Request("http://a.example/1"), Request("http://a.example/2")
    t.enqueued(a, True)
    t.enqueued(b, True)
    t.enqueued(Request("http://a.example/dupe"), False)  # refused by the scheduler: never seen
    first = t.take_changes()
    assert [p.split(" ")[:3] for p in first] == [["a", "1", "p"], ["a", "2", "p"]]
    t.popped(a)
    t.finished(a)
    second = t.take_changes()
    done, seen = t.take_done()
    assert second == [] and done == [1] and seen == []  # (no "f" for a request already done)
    state = _replay([*first, *second, records.done_record(done, seen)])
    assert list(state.requests) == [2] and state.next_id == 3
    assert t.pending_by_domain() == {"a.example": 1}


def test_a_request_finished_before_it_was_journaled_is_written_only_as_its_fingerprint() -> None:
    t = _tracker()
    a = Request("http://a.example/quick")
    t.enqueued(a, True)
    t.popped(a)
    t.finished(a)
    assert t.take_changes() == []
    done, seen = t.take_done()
    assert done == [] and len(seen) == 1
    state = _replay([records.done_record(done, seen)])
    assert not state.requests and state.fingerprints == {bytes.fromhex(seen[0])}


def test_adopted_requests_come_back_oldest_first_and_their_fingerprints_are_refused() -> None:
    old = _tracker()
    for i in range(3):
        old.enqueued(Request(f"http://a.example/{i}"), True)
    state = _replay(old.take_changes())
    t = _tracker()
    assert t.adopt(state) == [3, 2, 1]  # popped from the end
    assert t.filters_restored
    assert not t.admit(Request("http://a.example/0"))
    assert t.admit(Request("http://a.example/new"))
    assert t.admit(Request("http://a.example/0", dont_filter=True))


def test_without_a_duplicate_filter_nothing_is_fingerprinted() -> None:
    t = _tracker(filtering=False)
    t.enqueued(Request("http://a.example/1"), True)
    assert t.take_changes()[0].split(" ")[3] == "-"
    assert not t.seen
