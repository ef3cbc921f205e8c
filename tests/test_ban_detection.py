"""Ban detection (issue 21): a ban page is a domain signal, never data for a callback.

Crawl tests run the add-on against a chaos host that, after a few requests,
answers every page with a 200 captcha page (carrying an ``h1#title`` a naive
spider would scrape); they are judged from the site's record of what it
served. Unit tests cover the markers, the policy keys and the registry's
penalty.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.http import Headers, HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.errors import BAN_MARKERS, Classification, ErrorClass, ErrorTaxonomy, OpenClawConfigError
from scrapy_openclaw.health import HealthRegistry
from scrapy_openclaw.health.ban import BanDetectionMiddleware
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.testing.chaos import BAN_MARKER, BAN_TITLE
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import address, ban_site

if TYPE_CHECKING:
    from pathlib import Path

ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "LOG_LEVEL": "INFO"}
TAXONOMY = ErrorTaxonomy(frozenset({503}), (), ())


# --------------------------------------------------------------------------- markers


@pytest.mark.parametrize(
    ("status", "headers", "body", "reason"),
    [
        (
            403,
            {},
            b"<html><title>Just a moment...</title><script src='/cdn-cgi/challenge-platform/cf-chl'>",
            "blocked_cloudflare",
        ),
        (503, {"cf-mitigated": "challenge"}, b"", "blocked_cloudflare"),
        (403, {}, b"<title>Attention Required! | Cloudflare</title>", "blocked_cloudflare"),
        (429, {}, b'<div class="g-recaptcha" data-sitekey="x"></div>', "blocked_captcha"),
        (403, {}, b"<script src='https://geo.captcha-delivery.com/captcha/'></script>", "blocked_datadome"),
        (403, {"X-DataDome": "protected"}, b"", "blocked_datadome"),
        (403, {}, b'<div id="px-captcha"></div>', "blocked_perimeterx"),
        (403, {}, b"Reference #18.1 https://errors.edgesuite.net/18.1", "blocked_akamai"),
    ],
)
def test_builtin_markers_on_ban_statuses(status: int, headers: dict[str, str], body: bytes, reason: str) -> None:
    c = TAXONOMY.classify_ban(status, Headers(headers), body)
    assert c == Classification(ErrorClass.BLOCKED, reason, status)
    assert c.retryable


def test_ordinary_pages_are_not_ban_pages() -> None:
    challenge = b"<title>Just a moment...</title> cf-chl"
    assert TAXONOMY.classify_ban(200, Headers(), challenge) is None  # builtins: 403/429/503 only
    assert TAXONOMY.classify_ban(404, Headers(), challenge) is None
    assert TAXONOMY.classify_ban(503, Headers(), b"<h2>Error 503</h2>") is None
    assert TAXONOMY.classify_ban(403, Headers(), challenge, builtin=False) is None
    assert TAXONOMY.classify_ban(503, Headers({"Server": "cloudflare"}), b"down for maintenance") is None
    # a marker the policy lists: any status, case-insensitive
    found = TAXONOMY.classify_ban(200, Headers(), b"<FORM ID='Login-Wall'>", markers=("login-wall",))
    assert found == Classification(ErrorClass.BLOCKED, "blocked_policy", 200)
    assert len(BAN_MARKERS) <= 6  # the built-in list stays small


def test_policy_keys_validate_with_file_line_and_key(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("domains:\n  shop.example:\n    health:\n      ban_markers: [captcha, 3]\n", encoding="utf-8")
    crawler = get_crawler(Spider, {"OPENCLAW_POLICY_FILE": str(path)})
    with pytest.raises(OpenClawConfigError) as info:
        PolicySet.for_crawler(crawler)
    message = str(info.value)
    assert str(path) in message and "line 4" in message and "ban_markers" in message
    path.write_text("defaults:\n  health:\n    ban_builtin_markers: 1\n", encoding="utf-8")
    with pytest.raises(OpenClawConfigError, match=r"line 3.*ban_builtin_markers.*true or false"):
        PolicySet.from_settings(get_crawler(Spider, {"OPENCLAW_POLICY_FILE": str(path)}).settings)
    ok = PolicySet({"health": {"ban_markers": ["Please log in"], "blocked_hold": 5}}, [])
    assert ok.defaults.health.ban_markers == ("Please log in",)
    assert ok.defaults.retry.blocked.max_attempts == 3


def test_a_ban_is_a_domain_signal_with_its_own_penalty() -> None:
    policies = PolicySet({"health": {"blocked_penalty": 40, "throttle_penalty": 5}}, [])
    registry = HealthRegistry(policies, uniform=lambda a, b: a)
    blocked = Classification(ErrorClass.BLOCKED, "blocked_policy", 200)
    now = 1000.0
    registry.record_success("d", 0.01, now)
    assert registry.judge("d", blocked, failed_before=now - 1, now=now + 1) == "domain"  # never the page's
    registry.record_failure("d", blocked, now + 1, retry_after=30.0)
    state = registry.state("d", now + 1)
    assert state.health == pytest.approx(100 - 40)
    assert state.hold_until == pytest.approx(now + 31)
    assert state.limit is not None  # a congestion signal: the rate was cut


def test_middleware_holds_retries_and_signals() -> None:
    """Unit level, the real middleware chain's first step: a ban page becomes a delayed retry."""
    crawler = get_crawler(
        Spider,
        {
            "OPENCLAW_POLICY": {"defaults": {"health": {"ban_markers": [BAN_MARKER], "blocked_hold": 7}}},
        },
    )
    crawler.spider = crawler._create_spider("s")
    seen: list[dict[str, Any]] = []

    def on_blocked(**kwargs: Any) -> None:
        seen.append(kwargs)

    crawler.signals.connect(on_blocked, signal=openclaw_signals.blocked)  # (held weakly: kept alive here)
    mw = BanDetectionMiddleware.from_crawler(crawler)
    request = Request("http://shop.example/p/1")
    ok = HtmlResponse(request.url, body=b"<h1 id='title'>A page</h1>", request=request)
    assert mw.process_response(request, ok) is ok
    ban = HtmlResponse(request.url, body=f"<form id='{BAN_MARKER}'>".encode(), request=request)
    retry = mw.process_response(request, ban)
    assert isinstance(retry, Request) and retry.dont_filter
    assert retry.meta["openclaw_retry"]["attempts"] == {"blocked": 1}
    assert [s["classification"].reason for s in seen] == ["blocked_policy"]
    assert seen[0]["retry_request"] is retry and seen[0]["domain"] == "shop.example"
    assert crawler.stats.get_value("openclaw/ban/blocked") == 1
    assert crawler.stats.get_value("openclaw/ban/domain/shop.example") == 1
    assert retry.meta["dont_cache"] is True  # (HTTPCACHE stored the ban page: the retry goes to the site)


def test_a_ban_page_from_the_http_cache_is_retried_past_the_cache_and_costs_the_domain_nothing() -> None:
    crawler = get_crawler(Spider, {"OPENCLAW_POLICY": {"defaults": {"health": {"ban_markers": [BAN_MARKER]}}}})
    crawler.spider = crawler._create_spider("s")
    from scrapy_openclaw.health import DomainHealthMiddleware

    health = DomainHealthMiddleware.from_crawler(crawler)  # (found by the ban middleware, as in a crawl)
    mw = BanDetectionMiddleware.from_crawler(crawler)
    request = Request("http://shop.example/p/1")
    ban = HtmlResponse(request.url, body=f"<form id='{BAN_MARKER}'>".encode(), request=request, flags=["cached"])
    before = time.time()
    retry = mw.process_response(request, ban)
    assert isinstance(retry, Request) and retry.meta["dont_cache"] is True
    assert crawler.stats.get_value("openclaw/ban/cached") == 1
    # the retry goes to the site: it waits its backoff and spends the budget, as a live one would
    assert retry.meta["openclaw_not_before"] > before and not crawler.stats.get_value("openclaw/retry/cached")
    state = health.registry.state("shop.example")
    assert (state.health, state.hold_until, state.failures) == (100, 0.0, 0)


# --------------------------------------------------------------------------- crawls


def _crawl(server: Any, tmp_path: Path, **settings: Any) -> Any:
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"), **settings}
    result = run_crawl(settings=settings, spider_args={"start_urls": server.start_urls}, timeout=120)
    result.assert_ok()
    return result


def _dead_letters(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "dead.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _served(truth: dict[str, Any], host: str) -> list[dict[str, Any]]:
    return [r for r in truth["hosts"][host]["requests"] if r["path"] != "/robots.txt"]


def test_ban_page_host_is_held_and_items_stay_clean(chaos_server: Any, tmp_path: Path) -> None:
    """After 8 requests the host answers 200 captcha pages for 2 s: they are recognised by the
    policy's marker, the host is held (no request for blocked_hold), every ban page is
    retried after the hold and the crawl ends with every page scraped, none of them a ban page."""
    server = chaos_server(ban_site(pages=25, ban_after=8, ban_seconds=2.0))
    banned_host = address(1)
    policy = {"domains": {banned_host: {"health": {"ban_markers": [BAN_MARKER], "blocked_hold": 3.0}}}}
    result = _crawl(server, tmp_path, OPENCLAW_POLICY=policy, CONCURRENT_REQUESTS_PER_DOMAIN=4)
    truth = server.truth()
    served = sorted(_served(truth, banned_host), key=lambda r: r["t"])
    bans = [r for r in served if r.get("banned")]
    assert bans, "the chaos host never banned"
    # held: after the first ban page nothing reached the host for blocked_hold (3 s), bar the
    # requests already on the wire (concurrency 4)
    first_ban = bans[0]["t"]
    later = [r["t"] for r in served if r["t"] > first_ban + 0.5]
    assert later and min(later) >= first_ban + 2.9, [round(t - first_ban, 2) for t in later[:5]]
    # never passed to the callback: no item is a ban page, every page is scraped once
    items = result.items
    assert all(item["title"] != BAN_TITLE for item in items)
    assert len(items) == len({i["url"] for i in items}) == 2 * 25 + 1  # (both / and /page/0 on host 0)
    stats = result.stats
    assert stats["openclaw/ban/blocked"] == len(bans)
    assert stats[f"openclaw/ban/domain/{banned_host}"] == len(bans)
    assert stats["openclaw/ban/reason/blocked_policy"] == len(bans)
    assert stats["openclaw/retry/blocked/count"] == len(bans)
    assert stats["openclaw/health/failures/blocked_policy"] == len(bans)  # a domain failure of class blocked
    assert stats[f"openclaw/health/final_health/{address(0)}"] == 100
    assert not [d for d in _dead_letters(tmp_path) if d["error_class"] == "blocked"]


def test_with_the_http_cache_on_a_ban_page_is_fetched_again_not_read_from_the_cache(
    chaos_server: Any, tmp_path: Path
) -> None:
    """HTTPCACHE_ENABLED stores the ban pages (200s); their retries bypass the cache, so once the
    ban lifts every page is scraped, none ends as a dead letter of class blocked."""
    server = chaos_server(ban_site(pages=25, ban_after=8, ban_seconds=2.0))
    banned_host = address(1)
    policy = {"domains": {banned_host: {"health": {"ban_markers": [BAN_MARKER], "blocked_hold": 2.0}}}}
    result = _crawl(
        server,
        tmp_path,
        OPENCLAW_POLICY=policy,
        CONCURRENT_REQUESTS_PER_DOMAIN=4,
        HTTPCACHE_ENABLED=True,
        HTTPCACHE_DIR=str(tmp_path / "httpcache"),
    )
    bans = [r for r in _served(server.truth(), banned_host) if r.get("banned")]
    assert bans, "the chaos host never banned"
    items = result.items
    assert all(item["title"] != BAN_TITLE for item in items)
    assert len(items) == len({i["url"] for i in items}) == 2 * 25 + 1
    assert not [d for d in _dead_letters(tmp_path) if d["error_class"] == "blocked"]
    assert result.stats["openclaw/ban/blocked"] == len(bans)  # each ban page seen once: none came from the cache


def test_a_ban_for_good_ends_as_blocked_dead_letters(chaos_server: Any, tmp_path: Path) -> None:
    """A ban that never lifts: the host's pages end as dead letters of class blocked (or
    domain_down once it is given up), never as items; the healthy host is scraped in full."""
    _ban_for_good(chaos_server, tmp_path, {"give_up_after": 3}, {"blocked", "domain_down"})


def test_a_ban_for_good_without_circuit_ends_as_blocked_dead_letters(chaos_server: Any, tmp_path: Path) -> None:
    """The same with a circuit that never opens: each page is banned twice (retry.blocked
    max_attempts 2, after the hold), then it is one dead letter of class blocked."""
    _ban_for_good(chaos_server, tmp_path, {"circuit_failures": 100000, "circuit_floor": 0}, {"blocked"})


def _ban_for_good(chaos_server: Any, tmp_path: Path, health: dict[str, Any], classes: set[str]) -> None:
    server = chaos_server(ban_site(pages=12, ban_after=4, ban_seconds=None))
    banned_host = address(1)
    policy = {
        "domains": {
            banned_host: {
                "health": {
                    "ban_markers": [BAN_MARKER],
                    "blocked_hold": 0.5,
                    "circuit_cooldown": 0.5,
                    "circuit_cooldown_max": 1.0,
                    **health,
                },
                "retry": {"blocked": {"max_attempts": 2, "base_delay": 0.2, "max_delay": 0.5}},
            }
        }
    }
    result = _crawl(server, tmp_path, OPENCLAW_POLICY=policy)
    truth = server.truth()
    assert truth["hosts"][banned_host]["banned"] >= 1
    assert all(i["title"] != BAN_TITLE for i in result.items)
    scraped = {i["url"] for i in result.items}
    assert len([i for i in result.items if i["host"] == address(0)]) == 13
    letters = _dead_letters(tmp_path)
    assert {d["error_class"] for d in letters} <= classes
    base = server.urls[banned_host].rstrip("/")
    assert {d["url"] for d in letters} == {f"{base}/page/{p}" for p in range(1, 12)} - scraped
    assert len(letters) == len({d["url"] for d in letters})  # one dead letter per URL
    blocked = [d for d in letters if d["error_class"] == "blocked"]
    assert all(d["reason"] == "blocked_policy" and d["status"] == 200 for d in blocked)
    stats = result.stats
    assert stats["openclaw/ban/blocked"] == truth["hosts"][banned_host]["banned"]
    assert stats.get("openclaw/ban/gave_up", 0) == len(blocked)
    assert stats["finish_reason"] == "finished"
    if classes == {"blocked"}:
        assert blocked == letters and stats["openclaw/ban/blocked"] == 2 * len(blocked)  # two ban pages each
