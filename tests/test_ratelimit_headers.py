"""The limit a site declares in its headers, read in every format in use, and garbage tolerated."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy.http.headers import Headers

from scrapy_openclaw.ratelimit_headers import Declared, read_declared, summarise_warnings

NOW = 1_700_000_000.0


def read(headers: dict[str, Any], *, cap: float = 600.0, domain: str = "") -> Declared | None:
    return read_declared(Headers(headers), cap=cap, now=NOW, domain=domain)


@pytest.mark.parametrize(
    ("headers", "pace"),
    [
        ({"RateLimit-Policy": '"default";q=100;w=60'}, 100 / 60),  # draft 08 on
        ({"RateLimit-Policy": '"burst";q=10;w=1, "day";q=1000;w=86400'}, 10.0),  # a budget is no pace
        ({"RateLimit-Policy": "100;w=60"}, 100 / 60),  # drafts 03-07
        ({"RateLimit-Limit": "10, 10;w=1, 1000;w=3600"}, 10.0),  # drafts 00-02: policies in the limit
        ({"RateLimit-Policy": '"a";q=50;w=10', "RateLimit-Limit": "3, 3;w=1"}, 3.0),  # the tightest wins
        ({"RateLimit-Policy": ['"a";q=50;w=10', '"b";q=2;w=1']}, 2.0),  # several lines: one list
        ({"ratelimit-policy": '"A";Q=8;W=2'}, 4.0),  # names and keys in any case
        ({"RateLimit-Policy": '"a";q=0.5;w=1'}, 0.5),  # below one a second
    ],
)
def test_a_quota_per_window_is_a_pace(headers: dict[str, Any], pace: float) -> None:
    declared = read(headers)
    assert declared is not None and declared.pace == pytest.approx(pace) and declared.exhausted_for is None


@pytest.mark.parametrize(
    "headers",
    [
        {"X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999", "X-RateLimit-Reset": str(NOW + 3600)},
        {"RateLimit-Policy": '"day";q=1000;w=86400', "RateLimit": '"day";r=999;t=86000'},  # a budget
        {"RateLimit-Limit": "100", "RateLimit-Remaining": "50", "RateLimit-Reset": "30"},  # no window
        {"Content-Type": "text/html"},
    ],
)
def test_a_limit_without_its_window_or_a_budget_with_quota_left_declares_nothing(headers: dict[str, Any]) -> None:
    assert read(headers) is None


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"RateLimit": '"default";r=0;t=30'}, 30.0),  # draft 08 on, no policy said
        ({"RateLimit": "limit=100, remaining=0, reset=30"}, 30.0),  # draft 07
        ({"RateLimit-Remaining": "0", "RateLimit-Reset": "12"}, 12.0),  # drafts 00-06
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(NOW + 45)}, 45.0),  # GitHub: a UNIX time
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20"}, 20.0),  # others: seconds
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset-After": "2.5"}, 2.5),  # Discord
        ({"RateLimit": '"burst";r=3;t=1, "day";r=0;t=3600'}, 600.0),  # the used-up one, capped
    ],
)
def test_a_used_up_quota_is_waited_out_until_it_resets(headers: dict[str, Any], wait: float) -> None:
    declared = read(headers)
    assert declared is not None and declared.exhausted_for == pytest.approx(wait)


def test_a_paced_quota_at_its_edge_waits_for_the_next_turn_not_the_rounded_reset() -> None:
    """A bucket of 20/s says ``t=1`` (whole seconds) when it is empty for 50 ms: the next
    request waits one turn at the pace. A budget used up past the pace's window is waited out."""
    declared = read({"RateLimit-Policy": '"b";q=20;w=1', "RateLimit": '"b";r=0;t=1'})
    assert declared == Declared(pace=20.0, exhausted_for=pytest.approx(0.05))
    declared = read({"RateLimit-Policy": '"b";q=20;w=1, "d";q=1000;w=86400', "RateLimit": '"d";r=0;t=500'})
    assert declared == Declared(pace=20.0, exhausted_for=500.0)
    assert read({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(NOW - 10)}) is None  # back already
    # no pace said, back within the whole second the reset rounds to: nothing to wait out
    assert read({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(NOW + 1)}) is None


def test_used_up_without_a_reset_waits_for_the_429_that_follows() -> None:
    assert read({"X-RateLimit-Remaining": "0"}) is None


@pytest.mark.parametrize(
    "headers",
    [
        {"RateLimit-Policy": '"a";q=ten;w=1'},
        {"RateLimit-Policy": '"unclosed;q=1;w=1'},
        {"RateLimit-Policy": '"a";q=-5;w=1'},
        {"RateLimit-Policy": '"a";q=inf;w=1'},
        {"RateLimit": '"a";r=zero;t=1'},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "soon"},
        {"RateLimit-Policy": '"a";q=5;w=0'},  # (a window of 0 s is no window)
    ],
)
def test_garbage_is_ignored_and_named_once_per_domain(headers: dict[str, Any], caplog: Any, request: Any) -> None:
    """The first bad value of a domain is logged, the next ones summed up in one more line."""
    caplog.set_level(logging.WARNING, logger="scrapy_openclaw.ratelimit_headers")
    domain = f"bad-{request.node.callspec.id}.test"
    for _ in range(3):
        assert read(headers, domain=domain) is None
    summarise_warnings()
    named = [r.getMessage() for r in caplog.records if domain in r.getMessage()]
    if headers.get("RateLimit-Policy", "").endswith("w=0"):
        assert named == []  # well-formed, just no pace
    else:
        assert named[0].startswith("Ignoring malformed") and domain in named[0]
        assert named[1:] == [f"2 more warnings like this one were not logged: {named[0]}"]


def test_a_good_policy_beside_a_bad_one_still_counts() -> None:
    declared = read({"RateLimit-Policy": '"a";q=ten;w=1, "b";q=5;w=1'}, domain="half.test")
    assert declared is not None and declared.pace == 5.0
