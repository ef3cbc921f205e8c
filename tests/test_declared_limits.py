"""A site that says its limit (RateLimit headers) is paced by what it says, in every format.

Two hosts whose limit moves (20 req/s, 4 from 5 s, 20 again from 10 s), each saying so in
another format: the IETF draft's ``RateLimit-Policy``/``RateLimit`` and the older drafts'
``RateLimit-Limit``/``-Remaining``/``-Reset``; and a host with a budget (10 requests, then one
every 2 s) in GitHub's ``X-RateLimit-*`` (no window: no pace, only "none left until then").
Crawled by a plain spider on the add-on's defaults and judged from the chaos site's record:
every page, and a refusal only where the site changed its limit under requests already sent.
How close each phase's pace comes to its limit is the ``declared`` benchmark's figure.
"""

from __future__ import annotations

from typing import Any

from scrapy_openclaw.testing.crawl import crawl_on_defaults

PHASES = [[5.0, 4.0, 3], [10.0, 20.0, 3]]
HOSTS = {"127.0.0.2": "ietf", "127.0.0.3": "legacy"}
BUDGET = "127.0.0.4"
PAGES, BUDGET_PAGES = 150, 16
SITE = {
    "hosts": [
        *(
            {
                "address": address,
                "pages": PAGES,
                "links_per_page": "all",
                "rate_limit": {"rate": 20.0, "burst": 3, "retry_after": "1", "schedule": PHASES, "declare": form},
            }
            for address, form in HOSTS.items()
        ),
        {
            "address": BUDGET,
            "pages": BUDGET_PAGES,
            "links_per_page": "all",
            "rate_limit": {"rate": 0.5, "burst": 10, "retry_after": "1", "declare": "x"},
        },
    ],
    "seed": 3,
    "clock": "first_request",
}


def test_a_site_that_says_its_limit_is_paced_by_it_in_every_format(chaos_server: Any) -> None:
    server = chaos_server(SITE)
    result = crawl_on_defaults(server.start_urls)
    truth = server.truth(include_requests=True)
    stats = result.stats
    assert len(result.items) == PAGES * len(HOSTS) + BUDGET_PAGES
    for host, form in [*HOSTS.items(), (BUDGET, "x")]:
        served = [r for r in truth["hosts"][host]["requests"] if r["path"] != "/robots.txt"]
        refused = sum(1 for r in served if r["status"] == 429)
        # a refusal only for requests already on their way when the limit dropped (8 at most:
        # the domain's concurrency), never the limit found by crossing it again and again
        assert refused <= 8, (host, form, refused)
    # the paces said (20, 4, 20 on each of two hosts) were applied as they changed
    assert stats["openclaw/health/declared_limits"] >= 6
    assert stats["openclaw/health/final_rate/127.0.0.2"] == stats["openclaw/health/final_rate/127.0.0.3"] == 19.0
    # the budget says no pace: once spent, "none left until then" holds the domain until then
    assert stats["openclaw/health/declared_exhausted"] >= 1
    assert stats[f"openclaw/health/held_seconds/{BUDGET}"] > 0
    assert stats.get("openclaw/health/circuit_opened", 0) == 0


def test_garbage_rate_limit_headers_change_nothing_and_are_named_once(chaos_server: Any) -> None:
    """Every answer carries a RateLimit-Policy and a RateLimit whose numbers are words: the crawl
    is the silent site's (every page, nothing declared), and the log names each bad field once,
    then sums up the rest at close."""
    site = {
        "hosts": [
            {
                "address": "127.0.0.2",
                "pages": 30,
                "links_per_page": "all",
                "rate_limit": {"rate": 1000.0, "burst": 100, "declare": "garbage"},
            }
        ]
    }
    server = chaos_server(site)
    result = crawl_on_defaults(server.start_urls)
    assert len(result.items) == 30
    assert "openclaw/health/declared_limits" not in result.stats
    assert "openclaw/health/declared_exhausted" not in result.stats
    for field, value in (("RateLimit-Policy", "lots"), ("RateLimit", "none")):
        named = f"Ignoring malformed {field} header from 127.0.0.2: {value!r} is not a number"
        lines = [line for line in result.log.splitlines() if named in line]
        assert len(lines) == 2 and "more warnings like this one were not logged" in lines[1], lines
