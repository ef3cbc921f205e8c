"""What the crawl log says about a domain's slow-downs: each circuit opening names its real
trigger, repeats are summed up instead of logged one by one, and a domain kept slow gets one
hint naming the policy key to change.

Asserted on the log records and stats of one crawl of the chaos site, never on how long
anything took: the counts of lines must add up to the counts of events, whatever the pace.
"""

from __future__ import annotations

import re
from typing import Any

from scrapy_openclaw.testing.crawl import run_crawl

#: .5 and .6 flap (500 windows: domain failures in a row); .6's policy opens its circuit on
#: health alone (circuit floor 99); .7 lets one request in two through whatever the pace, and
#: its policy keeps the pace at or above a min_rate the site cannot take; .8 sends Retry-After.
#: .5's root links to all its pages: enough requests are waiting to meet a down window with
#: failures in a row however fast the crawl discovers them (a busy crawler met none with 3 links).
#: The site's clock starts at the crawl's first request, and each period starts with 0.8 s up: the
#: roots are fetched at once (a root whose every try met a down window hid its host from CI's run);
#: .5's pages are start URLs too, so a slow root cannot hide them either.
SITE = {
    "hosts": [
        {
            "address": "127.0.0.5",
            "pages": 80,
            "links_per_page": "all",
            "latency": 0.2,
            "fail_windows": {"period": 2.0, "down": 1.2, "status": 500, "offset": 1.2},
        },
        {
            "address": "127.0.0.6",
            "pages": 40,
            "links_per_page": 3,
            "latency": 0.2,
            "fail_windows": {"period": 2.0, "down": 1.2, "status": 500, "offset": 1.2},
        },
        {
            "address": "127.0.0.7",
            "pages": 10,
            "links_per_page": 3,
            "rate_limit": {"rate": 0.5, "burst": 1, "retry_after": None},
        },
        {
            "address": "127.0.0.8",
            "pages": 10,
            "links_per_page": 3,
            "rate_limit": {"rate": 2.0, "burst": 1, "retry_after": "1"},
        },
    ],
    "seed": 5,
    "clock": "first_request",
}
POLICY = {
    "domains": {
        # (cool-downs capped at 4 s: the crawl's length stays bounded however often they open)
        "127.0.0.5": {"health": {"circuit_cooldown_max": 4}},
        "127.0.0.6": {"health": {"circuit_floor": 99, "circuit_failures": 1000, "circuit_cooldown_max": 4}},
        "127.0.0.7": {"health": {"min_rate": 1.0, "initial_rate": 1.0}},
    }
}
OPENED = re.compile(r"Circuit for (\S+) opened: (.*); pausing the domain")
CLOSED = re.compile(r"Circuit for (\S+) closed: a probe succeeded")
MORE = re.compile(r"Circuit for (\S+) opened (\d+) more times? \(closed (\d+)\) in the last")
HOLDING = re.compile(r"Holding (\S+) for [\d.]+s: the site asked to wait \(Retry-After\)")
HELD = re.compile(r"Held (\S+) (\d+) more times? in the last")
HINT = re.compile(r"(\S+) has been slow for \d+s without getting faster: .*The knob: health\.(\w+)")


def test_circuit_lines_are_condensed_name_their_trigger_and_a_slow_domain_gets_one_hint(chaos_server: Any) -> None:
    server = chaos_server(SITE)
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_POLICY": POLICY,
        "OPENCLAW_REPORT_ENABLED": False,
        "OPENCLAW_DLQ_ENABLED": False,
        "OPENCLAW_SLOW_HINT_AFTER": 2.0,
        "LOGSTATS_INTERVAL": 60.0,
        "DOWNLOAD_TIMEOUT": 10,
    }
    pages = [f"{server.urls['127.0.0.5']}page/{n}" for n in range(1, 80)]
    result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls + pages}, timeout=400)
    log, stats = result.log, result.stats
    assert result.stats.get("finish_reason") == "finished", log[-3000:]
    opened: dict[str, list[str]] = {}
    for domain, why in OPENED.findall(log):
        opened.setdefault(domain, []).append(why)
    closed = {domain: CLOSED.findall(log).count(domain) for domain in opened}
    more: dict[str, list[int]] = {}
    for domain, n_opened, n_closed in MORE.findall(log):
        more.setdefault(domain, [0, 0])
        more[domain][0] += int(n_opened)
        more[domain][1] += int(n_closed)

    # the first opening of a domain is logged in full, the others summed up: lines add up to events
    assert stats["openclaw/health/circuit_opened"] > len(opened) >= 2, log[-3000:]  # some repeated
    total = sum(len(v) for v in opened.values()) + sum(m[0] for m in more.values())
    assert total == stats["openclaw/health/circuit_opened"]
    assert sum(closed.values()) + sum(m[1] for m in more.values()) == stats.get("openclaw/health/circuit_closed", 0)
    for domain, lines in opened.items():
        assert len(lines) == 1, (domain, lines)
        assert closed[domain] <= 1
    assert more and all(n_opened > 0 or n_closed > 0 for n_opened, n_closed in more.values())

    # each opening names what opened it
    assert "domain failures in a row (circuit_failures: 3)" in opened["127.0.0.5"][0]
    assert "under the circuit floor 99 (circuit_floor)" in opened["127.0.0.6"][0]
    assert "failures in a row" not in opened["127.0.0.6"][0]

    # each Retry-After hold: the first logged, the others summed up (only .8 sends Retry-After)
    assert HOLDING.findall(log) == ["127.0.0.8"], log[-3000:]
    assert 1 + sum(int(n) for _, n in HELD.findall(log)) == stats["openclaw/health/held"]
    assert {domain for domain, _ in HELD.findall(log)} <= {"127.0.0.8"}

    # the domain held at its min_rate gets one hint naming the knob; nobody gets two
    hints = HINT.findall(log)
    assert ("127.0.0.7", "min_rate") in hints, log[-3000:]
    assert len(hints) == len({domain for domain, _ in hints}) == stats["openclaw/health/slow_hints"]
    assert "OPENCLAW_POLICY_FILE" in log[log.index("127.0.0.7 has been slow") :].splitlines()[0]


# --------------------------------------------------------------------------- units


def _state(domain: str, **kw: Any) -> Any:
    from scrapy_openclaw.health.registry import DomainState

    fields = {"health": 100.0, "rate": 10.0, "tokens": 1.0, "burst": 1, "concurrency": 8, "circuit": "closed"}
    fields |= {"latency": None, "hold_until": 0.0, "consecutive_failures": 0, "requests": 0, "successes": 0}
    fields |= {"failures": 0}
    return DomainState(domain=domain, **{**fields, **kw})


def _notices(states: dict[str, Any], now: list[float]) -> Any:
    """Notices over *states* on a clock the test moves (``now[0]``): repeats summed up each
    minute, a slow hint after 300 s; the crawler's stats open."""
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.health.notices import HealthNotices
    from scrapy_openclaw.policy import HealthPolicy

    crawler = get_crawler()
    crawler.stats.open_spider()
    return HealthNotices(
        state=states.__getitem__,
        policy=lambda domain: HealthPolicy(),
        stats=crawler.stats,
        repeat_interval=60.0,
        slow_after=300.0,
        clock=lambda: now[0],
    )


def test_repeats_are_summed_up_once_per_interval_and_the_hint_comes_once(caplog: Any) -> None:
    """On a clock the test moves: openings within an interval become one line at the first check
    after it; a domain kept at its min_rate gets its hint once, however long it stays there."""
    import logging

    now = [1000.0]
    states = {"a.test": _state("a.test", health=10.0), "b.test": _state("b.test", rate=0.2)}
    notices = _notices(states, now)
    crawler_stats = notices.stats
    caplog.set_level(logging.INFO, logger="scrapy_openclaw.health.notices")
    for _ in range(5):  # five openings and closings of a.test within a minute
        notices.opened(states["a.test"], 1.0)
        notices.closed(states["a.test"])
        now[0] += 5
    notices.check()  # 20 s after the first repeat: nothing yet
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("Circuit for a.test opened: health 10 under the circuit floor 20 (circuit_floor)")
    assert lines[1] == "Circuit for a.test closed: a probe succeeded (health 10)"
    assert len(lines) == 2
    now[0] += 41
    notices.check()
    assert (
        caplog.records[-1]
        .getMessage()
        .startswith(
            "Circuit for a.test opened 4 more times (closed 4) in the last 61 s; most often because of health under"
        )
    )
    notices.troubled("b.test")  # at min_rate (0.2) from here on
    for _ in range(10):
        now[0] += 100
        notices.troubled("b.test")
        notices.check()
    hints = [r.getMessage() for r in caplog.records if "has been slow for" in r.getMessage()]
    assert len(hints) == 1 and "b.test has been slow for 300s" in hints[0] and "health.min_rate" in hints[0]
    assert crawler_stats.get_value("openclaw/health/slow_hints") == 1
    notices.stop()  # nothing left to sum up
    assert sum(1 for r in caplog.records if "more time" in r.getMessage()) == 1


def test_a_domain_slow_because_the_site_says_so_gets_the_hint_that_names_it(caplog: Any) -> None:
    """Held near min_rate by the limit the site declares: min_rate would not lift a declared
    ceiling, so the hint names the RateLimit headers and their knob instead."""
    import logging

    now = [1000.0]
    notices = _notices({"said.test": _state("said.test", rate=0.19, declared=0.2)}, now)
    caplog.set_level(logging.INFO, logger="scrapy_openclaw.health.notices")
    notices.troubled("said.test")
    for _ in range(4):
        now[0] += 100
        notices.check()
    (hint,) = [r.getMessage() for r in caplog.records if "has been slow for" in r.getMessage()]
    assert "the site says its limit is 0.2 req/s" in hint and "health.ratelimit_headers" in hint
    notices.stop()


def test_refusals_judged_pace_independent_are_said_once_and_again_when_they_turn_back(caplog: Any) -> None:
    """A person watching 429s should hear why the crawl goes on at full pace: one INFO line and
    one count when a refusing domain's refusals are judged pace-independent, one line when they
    are a rate signal again; nothing for a domain that refused nothing since the last check."""
    import logging

    now = [1000.0]
    states = {"n.test": _state("n.test"), "quiet.test": _state("quiet.test", refusals_flat=0.3)}
    notices = _notices(states, now)
    caplog.set_level(logging.INFO, logger="scrapy_openclaw.health.notices")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if "Refusals from" in r.getMessage()]

    notices.refused("n.test")
    notices.check()
    assert lines() == []  # refused, still a rate signal
    states["n.test"] = _state("n.test", refusals_flat=1 / 3)
    for _ in range(3):  # judged flat; refusals go on
        notices.refused("n.test")
        notices.check()
    assert lines() == [
        "Refusals from n.test do not fall when the pace falls (33% refused at a slower pace too): "
        "they are retried as the pages' own failures, at the domain's pace"
    ]
    states["n.test"] = _state("n.test")
    notices.refused("n.test")
    notices.check()
    assert lines()[-1] == "Refusals from n.test rose with the pace: a rate signal again (the domain slows down)"
    states["n.test"] = _state("n.test", refusals_flat=0.3)
    notices.refused("n.test")
    notices.check()
    assert len(lines()) == 3 and notices.stats.get_value("openclaw/health/refusals_pace_independent") == 2
    assert not any("quiet.test" in line for line in lines())
    states["n.test"] = _state("n.test")
    notices.refused("n.test")
    notices.stop()  # (a verdict of the crawl's last seconds is said at its close)
    assert lines()[-1].endswith("a rate signal again (the domain slows down)") and len(lines()) == 4
