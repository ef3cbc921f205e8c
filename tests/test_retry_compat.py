"""Scrapy's retry settings mean the same with the add-on as with Scrapy's RetryMiddleware.

Each case crawls the chaos site twice, with plain Scrapy (``RetryMiddleware``)
and with ``ADDONS = {"scrapy_openclaw.Addon": 100}``, and compares what the
site served per URL (its ground truth), the items, Scrapy's ``retry/*`` stats
and ``log_count/ERROR``. The health middleware is switched off in the add-on
runs: these cases are about retry semantics, not pacing. Then the page
schedule (a failure the health middleware judged the page's own), end to end
and unit by unit.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_openclaw import meta as M
from scrapy_openclaw.errors import Classification, ErrorClass, OpenClawConfigError
from scrapy_openclaw.retry import get_classified_retry_request
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import run_crawl
from tests.test_retry_middleware import RetrySpider

pytestmark = pytest.mark.crawl  # crawls in a subprocess

if TYPE_CHECKING:
    from pathlib import Path

MODULE = "tests.test_retry_compat"  # as the crawl subprocess imports it
A, B = "127.0.0.2", "127.0.0.3"
ALWAYS_503 = (1, 2, 3, 4, 5, 6)
ONCE_503 = (7, 8)  # 503 once, then 200
ALWAYS_403, ALWAYS_500, RAISES = 9, 10, 11
SCRIPT = {
    **{p: [503] for p in ALWAYS_503},
    **{p: [503, 200] for p in ONCE_503},
    ALWAYS_403: [403],
    ALWAYS_500: [500],
}
# Scrapy < 2.17 has no RETRY_GIVE_UP_LOG_LEVEL / meta["give_up_log_level"]: it always logs ERROR.
SCRAPY_HAS_GIVE_UP_LEVEL = "RETRY_GIVE_UP_LOG_LEVEL" in scrapy.settings.default_settings.__dict__
# Small delays; no max_attempts: a policy that names it wins over RETRY_TIMES.
FAST = {"base_delay": 0.01, "max_delay": 0.05, "jitter": "none"}
CLASS_ATTEMPTS = 6  # the built-in max_attempts of network and protocol_retryable


# --------------------------------------------------------------------------- crawl-side helpers


class FlakyPageError(Exception):
    """Raised by ``RaiseOnPath``: in no retry list unless a project adds it."""


class RaiseOnPath:
    """Downloader middleware nearest the downloader: raises FlakyPageError for the paths in
    ``RETRY_COMPAT_RAISE``, counting each raise in ``compat/raised/<path>`` (its ground truth)."""

    def __init__(self, crawler: Any):
        self.paths = set(crawler.settings.getlist("RETRY_COMPAT_RAISE"))
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Any) -> RaiseOnPath:
        return cls(crawler)

    def process_request(self, request: Any) -> None:
        path = urlparse(request.url).path
        if path in self.paths:
            self.stats.inc_value(f"compat/raised{path}")
            raise FlakyPageError(path)


class JudgePages:
    """Downloader middleware between health (560) and retry (550): stands in for the health
    middleware's verdict, ``meta["openclaw_failure_scope"] = "page"`` on every failure of the
    paths in ``RETRY_COMPAT_PAGE_PATHS``, "domain" on the others."""

    def __init__(self, crawler: Any):
        self.paths = set(crawler.settings.getlist("RETRY_COMPAT_PAGE_PATHS"))

    @classmethod
    def from_crawler(cls, crawler: Any) -> JudgePages:
        return cls(crawler)

    def _judge(self, request: Any) -> None:
        request.meta[M.FAILURE_SCOPE] = "page" if urlparse(request.url).path in self.paths else "domain"

    def process_response(self, request: Any, response: Any) -> Any:
        if response.status >= 400:
            self._judge(request)
        return response

    def process_exception(self, request: Any, exception: Exception) -> None:
        self._judge(request)


class CompatSpider(RetrySpider):
    """RetrySpider (start URLs only) whose items carry the request's priority and retry_times."""

    name = "retry_compat"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, follow="0", **kwargs)

    def parse(self, response):
        for item in super().parse(response):
            yield {**item, "priority": response.request.priority, "retry_times": response.meta.get("retry_times", 0)}


# --------------------------------------------------------------------------- test-side helpers


@pytest.fixture(scope="module")
def site():
    from scrapy_openclaw.testing.servers import ChaosServer

    config = ChaosConfig(
        hosts=(
            HostConfig(A, pages=12, links_per_page=0, status_script=SCRIPT),
            HostConfig(B, pages=1, links_per_page=0, drop_rate=1.0),
        )
    )
    with ChaosServer(config) as server:
        yield server


def url(server: Any, page: int | None = None, host: str = A) -> str:
    return server.urls[host] + ("" if page is None else f"page/{page}")


def run(
    server: Any,
    tmp_path: Path,
    name: str,
    *,
    addon: bool,
    starts: list[str],
    settings: dict[str, Any] | None = None,
    meta: dict[str, dict] | None = None,
    policy: dict[str, Any] | None = None,
) -> tuple[Any, dict[str, int]]:
    """One crawl from a fresh site state; (result, requests the site got per URL)."""
    server.reset()
    base: dict[str, Any] = {
        "DOWNLOADER_MIDDLEWARES": {f"{MODULE}.RaiseOnPath": 950},
        "RETRY_COMPAT_RAISE": [f"/page/{RAISES}"],
        "DOWNLOAD_TIMEOUT": 5,
        "LOG_LEVEL": "DEBUG",
    }
    if addon:
        retry = {"network": FAST, "protocol_retryable": FAST, "page": FAST, "budget_min_retries": 100000}
        base.update(
            {
                "ADDONS": {"scrapy_openclaw.Addon": 100},
                "OPENCLAW_HEALTH_ENABLED": False,
                "OPENCLAW_DLQ_URI": str(tmp_path / f"{name}-dlq.jsonl"),
                "OPENCLAW_POLICY": {"defaults": {"retry": retry}, **(policy or {})},
            }
        )
    base.update(settings or {})
    out = tmp_path / f"{name}-{'addon' if addon else 'scrapy'}"
    result = run_crawl(
        f"{MODULE}.CompatSpider",
        settings=base,
        timeout=60,
        out_dir=out,
        spider_args={"start_urls": starts, "meta_by_path": json.dumps(meta or {})},
    )
    assert result.returncode == 0, result.log[-3000:]
    for trouble in ("Unhandled error", "Error caught on signal handler", "Error while", "InvalidOutput"):
        assert trouble not in result.log, result.log[-3000:]
    enabled = result.log.split("Enabled downloader middlewares:", 1)[1].split("]", 1)[0]
    assert ("ClassifiedRetryMiddleware" in enabled) is addon
    assert ("downloadermiddlewares.retry.RetryMiddleware" in enabled) is not addon
    served: dict[str, int] = {}
    for host in server.truth()["hosts"].values():
        for r in host["requests"]:
            key = host["base_url"] + r["path"].lstrip("/")
            served[key] = served.get(key, 0) + 1
    for key, n in result.stats.items():
        if key.startswith("compat/raised/"):
            served[server.urls[A] + key[len("compat/raised/") :]] = n
    return result, served


def outcome(result: Any, served: dict[str, int]) -> dict[str, Any]:
    """What must be identical with and without the add-on."""
    stats = result.stats
    return {
        "served": served,
        "items": sorted((i["url"], i["priority"], i["retry_times"]) for i in result.items),
        "retry_stats": {k: v for k, v in stats.items() if k.startswith("retry/")},
        "errors": stats.get("log_count/ERROR", 0),
    }


def both(server: Any, tmp_path: Path, name: str, **kw: Any) -> dict[str, Any]:
    plain = outcome(*run(server, tmp_path, name, addon=False, **kw))
    ours = outcome(*run(server, tmp_path, name, addon=True, **kw))
    assert ours == plain
    return ours


# --------------------------------------------------------------------------- differential cases


@pytest.mark.parametrize("retry_times", [0, 1, 10])
def test_retry_times(site, tmp_path, retry_times):
    starts = [url(site, 1), url(site, 7), url(site, host=B), url(site, RAISES)]
    got = both(site, tmp_path, f"times{retry_times}", starts=starts, settings={"RETRY_TIMES": retry_times})
    failing = 1 + retry_times
    assert got["served"] == {
        url(site, 1): failing,
        url(site, 7): 1 if retry_times == 0 else 2,
        url(site, host=B): failing,
        url(site, RAISES): 1,  # not in RETRY_EXCEPTIONS: never retried
    }
    assert got["retry_stats"].get("retry/max_reached", 0) == (3 if retry_times == 0 else 2)
    assert got["errors"] == got["retry_stats"]["retry/max_reached"] + 2  # + errback logs: drop, raise
    # page 7 fails once: retried and scraped unless RETRY_TIMES is 0 (then a failure, no item)
    reasons = got["retry_stats"].get("retry/reason_count/503 Service Unavailable", 0)
    assert reasons == (retry_times + 1 if retry_times else 0)
    assert got["items"] == ([(url(site, 7), -1, 1)] if retry_times else [])


def test_max_retry_times_meta_and_dont_retry(site, tmp_path):
    starts = [url(site, p) for p in (1, 2, 3, 4)] + [url(site, host=B)]
    meta = {
        "/page/1": {"dont_retry": True},
        "/page/2": {"max_retry_times": 0},
        "/page/3": {"max_retry_times": 4},
        "/": {"max_retry_times": 3},
    }
    got = both(site, tmp_path, "meta", starts=starts, meta=meta, settings={"RETRY_TIMES": 1})
    assert got["served"] == {url(site, 1): 1, url(site, 2): 1, url(site, 3): 5, url(site, 4): 2, url(site, host=B): 4}
    assert got["retry_stats"]["retry/count"] == 4 + 1 + 3
    assert got["retry_stats"]["retry/max_reached"] == 4  # dont_retry gives up without a word


@pytest.mark.parametrize(
    ("codes", "retried", "not_retried"),
    [
        ([403], ALWAYS_403, ALWAYS_503[0]),
        ([500], ALWAYS_500, ALWAYS_503[0]),
    ],
)
def test_retry_http_codes(site, tmp_path, codes, retried, not_retried):
    starts = [url(site, retried), url(site, not_retried)]
    got = both(
        site, tmp_path, f"codes{codes[0]}", starts=starts, settings={"RETRY_HTTP_CODES": codes, "RETRY_TIMES": 2}
    )
    assert got["served"] == {url(site, retried): 3, url(site, not_retried): 1}


def test_retry_exceptions_add_one(site, tmp_path):
    # Scrapy's list is replaced by the project's; ours is extended: compare the listed one only.
    settings = {"RETRY_EXCEPTIONS": [f"{MODULE}.FlakyPageError"], "RETRY_TIMES": 2}
    got = both(site, tmp_path, "exceptions", starts=[url(site, RAISES)], settings=settings)
    assert got["served"] == {url(site, RAISES): 3}
    assert got["retry_stats"][f"retry/reason_count/{MODULE}.FlakyPageError"] == 2


def test_priority_adjust(site, tmp_path):
    starts = [url(site, 7), url(site, 8)]
    got = both(
        site,
        tmp_path,
        "priority",
        starts=starts,
        meta={"/page/8": {"priority_adjust": 7}},
        settings={"RETRY_PRIORITY_ADJUST": -4},
    )
    assert got["items"] == [(url(site, 7), -4, 1), (url(site, 8), 7, 1)]


@pytest.mark.skipif(not SCRAPY_HAS_GIVE_UP_LEVEL, reason="Scrapy < 2.17 always gives up at ERROR")
def test_give_up_log_level(site, tmp_path):
    starts = [url(site, p) for p in (1, 2, 3)]
    meta = {"/page/2": {"give_up_log_level": "ERROR"}, "/page/3": {"give_up_log_level": "CRITICAL"}}
    got = both(
        site,
        tmp_path,
        "level",
        starts=starts,
        meta=meta,
        settings={"RETRY_GIVE_UP_LOG_LEVEL": "WARNING", "RETRY_TIMES": 1},
    )
    assert got["errors"] == 1 and got["retry_stats"]["retry/max_reached"] == 3


def test_unset_retry_times_leaves_our_policy_in_charge(site, tmp_path):
    """Scrapy's default RETRY_TIMES (2) is not "set": the per-class policy counts attempts."""
    result, served = run(site, tmp_path, "unset", addon=True, starts=[url(site, 1), url(site, host=B)])
    assert served == {url(site, 1): CLASS_ATTEMPTS, url(site, host=B): CLASS_ATTEMPTS}
    assert result.stats["retry/max_reached"] == 2 == result.stats["log_count/ERROR"] - 1
    # ... unless the policy names max_attempts for that class, which wins over RETRY_TIMES
    policy = {"domains": {A: {"retry": {"protocol_retryable": {"max_attempts": 4}}}}}
    result, served = run(
        site,
        tmp_path,
        "named",
        addon=True,
        starts=[url(site, 1), url(site, host=B)],
        settings={"RETRY_TIMES": 1},
        policy=policy,
    )
    assert served == {url(site, 1): 4, url(site, host=B): 2}


# --------------------------------------------------------------------------- page schedule


def test_page_verdict_gets_the_short_schedule_in_a_crawl(site, tmp_path):
    page = {"max_attempts": 3, "base_delay": 0.3, "max_delay": 0.3, "jitter": "none"}
    klass = {"base_delay": 0.01, "max_delay": 0.01, "jitter": "none"}  # 6 attempts
    retry = {"protocol_retryable": klass, "page": page, "budget_min_retries": 100000}
    settings = {
        "DOWNLOADER_MIDDLEWARES": {f"{MODULE}.RaiseOnPath": 950, f"{MODULE}.JudgePages": 555},
        "RETRY_COMPAT_PAGE_PATHS": ["/page/1"],
    }
    result, served = run(
        site,
        tmp_path,
        "page",
        addon=True,
        starts=[url(site, 1), url(site, 2)],
        settings=settings,
        policy={"defaults": {"retry": retry}},
    )
    assert served == {url(site, 1): 3, url(site, 2): CLASS_ATTEMPTS}
    times = [r["t"] for r in site.truth()["hosts"][A]["requests"] if r["path"] == "/page/1"]
    assert all(b - a >= 0.29 for a, b in zip(times, times[1:])), times
    assert result.stats["openclaw/retry/page_scheduled"] == 2
    assert result.stats["openclaw/retry/protocol_retryable/count"] == 2 + CLASS_ATTEMPTS - 1

    # RETRY_TIMES still caps a page's retries (unless the policy names the page's max_attempts)
    retry["page"] = {"base_delay": 0.01, "max_delay": 0.01}
    result, served = run(
        site,
        tmp_path,
        "pagecap",
        addon=True,
        starts=[url(site, 1)],
        settings={**settings, "RETRY_TIMES": 1},
        policy={"defaults": {"retry": retry}},
    )
    assert served == {url(site, 1): 2}


def _crawler(policy: dict[str, Any] | None = None, **settings: Any) -> Any:
    crawler = get_crawler(scrapy.Spider, settings_dict={"OPENCLAW_POLICY": policy or {}, **settings})
    crawler.spider = crawler._create_spider("unit")
    return crawler


def _fail(
    crawler: Any, request: Any, scope: str | None, klass: ErrorClass = ErrorClass.PROTOCOL_RETRYABLE, now: float = 100.0
) -> Any:
    if scope is not None:
        request.meta[M.FAILURE_SCOPE] = scope
    status = 503 if klass is ErrorClass.PROTOCOL_RETRYABLE else None
    c = Classification(klass, "http_503" if status else "timeout", status)
    return get_classified_retry_request(
        request, classification=c, spider=crawler.spider, now=now, uniform=lambda a, b: b
    )


PAGE = {
    "page": {"max_attempts": 3, "base_delay": 2.0, "max_delay": 3.0, "jitter": "none"},
    "protocol_retryable": {"max_attempts": 5, "base_delay": 10.0, "max_delay": 100.0, "jitter": "none"},
    "network": {"max_attempts": 4, "base_delay": 20.0, "max_delay": 100.0, "jitter": "none"},
}


@pytest.mark.parametrize("klass", [ErrorClass.PROTOCOL_RETRYABLE, ErrorClass.NETWORK])
def test_page_schedule_backoff_and_limit(klass):
    crawler = _crawler({"defaults": {"retry": PAGE}})
    first = _fail(crawler, scrapy.Request("http://a.test/x"), "page", klass)
    assert first.meta[M.NOT_BEFORE] == 102.0 and M.FAILURE_SCOPE not in first.meta
    second = _fail(crawler, first, "page", klass)
    assert second.meta[M.NOT_BEFORE] == 103.0  # 2·2, capped at 3
    assert second.meta[M.RETRY_STATE]["attempts"] == {klass.value: 2}
    assert _fail(crawler, second, "page", klass) is None  # the page's 3 attempts are spent
    assert crawler.stats.get_value("openclaw/retry/page_scheduled") == 2
    assert crawler.stats.get_value(f"openclaw/retry/{klass.value}/max_reached") == 1


def test_page_then_domain_continues_on_the_class_limit():
    crawler = _crawler({"defaults": {"retry": PAGE}})
    request = scrapy.Request("http://a.test/x")
    for _ in range(2):
        request = _fail(crawler, request, "page")
    third = _fail(crawler, request, "domain")
    assert third is not None and third.meta[M.NOT_BEFORE] == 100.0 + 40.0  # class backoff, attempt 2
    fourth = _fail(crawler, third, "domain")
    assert fourth is not None and fourth.meta[M.RETRY_STATE]["attempts"] == {"protocol_retryable": 4}
    assert _fail(crawler, fourth, "domain") is None  # 5 attempts: the class's limit
    # ... and a page verdict on the third failure gives up at once
    request = scrapy.Request("http://a.test/y")
    for _ in range(2):
        request = _fail(crawler, request, None)
    assert _fail(crawler, request, "page") is None


def test_no_verdict_or_parse_class_keep_their_schedule():
    crawler = _crawler({"defaults": {"retry": PAGE}})
    assert _fail(crawler, scrapy.Request("http://a.test/x"), None).meta[M.NOT_BEFORE] == 110.0
    parse = Classification(ErrorClass.PARSE, "ValueError")
    request = scrapy.Request("http://a.test/p", meta={M.FAILURE_SCOPE: "page"})
    retry = get_classified_retry_request(
        request, classification=parse, spider=crawler.spider, now=100.0, uniform=lambda a, b: b
    )
    assert retry.meta[M.NOT_BEFORE] == 100.5  # the parse policy's base delay
    assert not crawler.stats.get_value("openclaw/retry/page_scheduled")


def test_caps_apply_to_the_page_schedule():
    unnamed = {**PAGE, "page": {"base_delay": 2.0, "max_delay": 3.0}}
    crawler = _crawler({"defaults": {"retry": unnamed}}, RETRY_TIMES=1)
    retry = _fail(crawler, scrapy.Request("http://a.test/x"), "page")
    assert retry is not None and _fail(crawler, retry, "page") is None
    # ... a policy that names the page's max_attempts wins over RETRY_TIMES
    crawler = _crawler({"defaults": {"retry": PAGE}}, RETRY_TIMES=1)
    retry = _fail(crawler, _fail(crawler, scrapy.Request("http://a.test/x"), "page"), "page")
    assert retry is not None and _fail(crawler, retry, "page") is None
    crawler = _crawler({"defaults": {"retry": unnamed}}, RETRY_TIMES=10)  # replaces max_attempts ...
    request = scrapy.Request("http://a.test/x")
    for _ in range(10):
        request = _fail(crawler, request, "page")
    assert request.meta["retry_times"] == 10 and _fail(crawler, request, "page") is None
    crawler = _crawler({"defaults": {"retry": PAGE}})
    capped = scrapy.Request("http://a.test/x", meta={"max_retry_times": 0})
    assert _fail(crawler, capped, "page") is None


# --------------------------------------------------------------------------- settings, unit


def test_scrapy_stats_and_give_up_level_unit(caplog):
    crawler = _crawler(RETRY_GIVE_UP_LOG_LEVEL="WARNING", RETRY_TIMES=0)
    c = Classification(ErrorClass.PROTOCOL_RETRYABLE, "http_503", 503)
    with caplog.at_level("DEBUG"):
        assert (
            get_classified_retry_request(scrapy.Request("http://a.test/x"), classification=c, spider=crawler.spider)
            is None
        )
    [record] = [r for r in caplog.records if "Gave up retrying" in r.getMessage()]
    assert record.levelname == "WARNING" and "503 Service Unavailable" in record.getMessage()
    assert crawler.stats.get_value("retry/max_reached") == 1
    with pytest.raises(OpenClawConfigError, match="RETRY_GIVE_UP_LOG_LEVEL"):
        from scrapy_openclaw.retry.compat import ScrapyRetrySettings

        ScrapyRetrySettings.from_settings(_crawler(RETRY_GIVE_UP_LOG_LEVEL="LOUD").settings)


def test_default_priority_is_not_set():
    from scrapy.settings import Settings

    from scrapy_openclaw.retry.compat import ScrapyRetrySettings, is_set

    settings = Settings()
    assert not is_set(settings, "RETRY_TIMES")
    assert ScrapyRetrySettings.from_settings(settings).retry_times is None
    settings.set("RETRY_TIMES", 2, "addon")
    assert is_set(settings, "RETRY_TIMES") and ScrapyRetrySettings.from_settings(settings).retry_times == 2
