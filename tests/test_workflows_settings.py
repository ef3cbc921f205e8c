"""A project's own Scrapy settings and components with the add-on on: ``DOWNLOAD_SLOTS``,
AutoThrottle, a RetryMiddleware subclass, the HTTP cache, FilesPipeline and ImagesPipeline, the metrics port.
Real crawls in a subprocess, judged from the chaos site's record and the crawl's log and stats."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import scrapy
from scrapy.downloadermiddlewares.retry import RetryMiddleware

from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.servers import free_port

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from scrapy.http import Response

pytestmark = pytest.mark.crawl

MODULE = "tests.test_workflows_settings"  # as the crawl subprocess imports it
ADDON = {"ADDONS": {"scrapy_openclaw.Addon": 100}, "LOG_LEVEL": "INFO"}
#: Short retry delays, so a test's give-ups come in a second.
FAST = {"base_delay": 0.05, "max_delay": 0.2, "max_attempts": 3}
FAST_POLICY = {"defaults": {"retry": {"protocol_retryable": FAST, "page": FAST, "budget_min_retries": 1000}}}


class ProjectRetry(RetryMiddleware):
    """A project's own retry middleware, as projects write them."""


class FilesSpider(scrapy.Spider):
    """Asks FilesPipeline for every URL in ``file_urls`` (a comma-separated spider argument)."""

    name = "files"

    def __init__(self, *args: Any, start_urls: str = "", file_urls: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.start_urls = start_urls.split(",")
        self.file_urls = file_urls.split(",")

    def parse(self, response: Response) -> Iterator[dict[str, Any]]:
        yield {self.field: self.file_urls}

    field = "file_urls"


class ImagesSpider(FilesSpider):
    """The same for ImagesPipeline (``image_urls``)."""

    name = "images"
    field = "image_urls"


def _crawl(
    tmp_path: Path, starts: list[str], spider: str | None = None, *, spider_errors: int = 0, **settings: Any
) -> Any:
    """A crawl with the add-on; no traceback but those of *spider_errors* callback errors."""
    settings = {**ADDON, "OPENCLAW_DLQ_URI": str(tmp_path / "dead.jsonl"), **settings}
    kwargs = {"spider": spider} if spider else {}
    result = run_crawl(settings=settings, spider_args={"start_urls": starts}, timeout=120, **kwargs)
    assert result.returncode == 0, result.log[-3000:]
    assert result.log.count("Traceback") == spider_errors, result.log[-3000:]
    assert result.stats.get("spider_exceptions/ValueError", 0) == spider_errors, result.stats
    return result


def _served(server: Any, host: str = "127.0.0.2") -> list[dict[str, Any]]:
    return [r for r in server.truth()["hosts"][host]["requests"] if r["path"] != "/robots.txt"]


def _gaps(requests: list[dict[str, Any]]) -> list[float]:
    times = sorted(r["t"] for r in requests)
    return [b - a for a, b in zip(times, times[1:])]


def _warnings(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if "WARNING" in line and needle in line]


def _table_row(log: str, host: str) -> dict[str, str]:
    """The host's row of the whole-crawl log table, by column name."""
    lines = log.splitlines()
    at = max(i for i, line in enumerate(lines) if "OpenClaw domains" in line and "whole crawl" in line)
    header = lines[at + 1].split()
    row = next(line.split() for line in lines[at + 2 :] if line.split()[:1] == [host])
    return dict(zip(header, row))


def test_a_download_slots_delay_is_a_floor_and_its_concurrency_a_cap(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 10, "links_per_page": "all"}]})
    slot = {
        "delay": 0.25,
        "concurrency": 1,
        "jitter": 0,
        "randomize_delay": False,
    }  # (2.19 reads jitter, 2.14 the other)
    result = _crawl(tmp_path, server.start_urls, DOWNLOAD_SLOTS={"127.0.0.2": slot})
    served = _served(server)
    assert len(result.items) == 10 and len(served) == 10
    assert min(_gaps(served)) >= 0.22, sorted(_gaps(served))[:3]  # the slot's 0.25 s, at the server
    assert server.truth()["hosts"]["127.0.0.2"]["max_in_flight"] == 1


def test_autothrottle_gives_way_to_the_health_middleware_once_said(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 8, "links_per_page": "all"}]})
    throttle: dict[str, Any] = {
        "AUTOTHROTTLE_ENABLED": True,
        "AUTOTHROTTLE_START_DELAY": 0.5,
        "AUTOTHROTTLE_DEBUG": True,
    }
    result = _crawl(tmp_path, server.start_urls, **throttle)
    assert len(result.items) == 8
    assert len(_warnings(result.log, "OPENCLAW_HEALTH_ENABLED")) == 1, result.log[-3000:]
    assert "| conc:" not in result.log  # AutoThrottle's debug line per response: it never ran
    # ... and the way back to AutoThrottle, as the warning says: its delay paces the slot again
    server.reset()
    result = _crawl(tmp_path, server.start_urls, **throttle, OPENCLAW_HEALTH_ENABLED=False)
    assert len(result.items) == 8 and "| conc:" in result.log
    assert not _warnings(result.log, "OPENCLAW_HEALTH_ENABLED")


def test_a_projects_retry_middleware_subclass_gives_way_to_ours_once_said(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(
        {"hosts": [{"address": "127.0.0.2", "pages": 4, "links_per_page": "all", "status_script": {1: [503]}}]}
    )
    middlewares = {f"{MODULE}.ProjectRetry": 550, "scrapy.downloadermiddlewares.retry.RetryMiddleware": None}
    result = _crawl(tmp_path, server.start_urls, DOWNLOADER_MIDDLEWARES=middlewares, OPENCLAW_POLICY=FAST_POLICY)
    assert len(result.items) == 3
    assert server.truth()["hosts"]["127.0.0.2"]["counts"]["/page/1"] == 3  # RETRY_TIMES = 2: one retry chain
    assert result.stats["retry/max_reached"] == 1
    assert result.log.count("Gave up retrying") == 1
    (warning,) = _warnings(result.log, "OPENCLAW_RETRY_ENABLED")
    assert f"{MODULE}.ProjectRetry" in warning
    # the way back, as the warning says: the project's own middleware retries, ours does not
    server.reset()
    result = _crawl(tmp_path, server.start_urls, DOWNLOADER_MIDDLEWARES=middlewares, OPENCLAW_RETRY_ENABLED=False)
    assert server.truth()["hosts"]["127.0.0.2"]["counts"]["/page/1"] == 3
    assert result.stats["retry/max_reached"] == 1 and not _warnings(result.log, "OPENCLAW_RETRY_ENABLED")


def test_the_metrics_port_closes_without_a_deprecation_and_robots_txt_is_no_failure(
    chaos_server: Any, tmp_path: Path
) -> None:
    server = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 4, "links_per_page": "all"}]})
    result = _crawl(
        tmp_path,
        server.start_urls,
        OPENCLAW_METRICS_PORT=free_port(),
        ROBOTSTXT_OBEY=True,  # the chaos site has no robots.txt: a 404
        OPENCLAW_SNAPSHOT_DIR=str(tmp_path / "snapshots"),
    )
    assert server.truth()["hosts"]["127.0.0.2"]["counts"]["/robots.txt"] == 1
    assert "deprecated" not in result.log, result.log[-3000:]
    row = _table_row(result.log, "127.0.0.2")
    assert (row["done"], row["failed"], row["dead"]) == ("4", "0", "0"), row
    assert not (tmp_path / "snapshots").exists()
    assert not (tmp_path / "dead.jsonl").exists()


def test_a_cached_rerun_sends_nothing_waits_for_nothing_and_counts_its_pages(chaos_server: Any, tmp_path: Path) -> None:
    """Cached 429s and 503s are retried as Scrapy's RetryMiddleware would (at once, from the
    cache again, the same number of times): no health signal, no Retry-After wait, no retry
    budget; the log table counts the cached pages as done."""
    throttling: dict[str, Any] = {"address": "127.0.0.2", "pages": 8, "links_per_page": "all"}
    throttling["rate_limit"] = {"rate": 0, "every": 4, "retry_after": "3"}  # every 4th request: 429 + Retry-After
    failing: dict[str, Any] = {"address": "127.0.0.3", "pages": 6, "links_per_page": "all", "status_script": {2: [503]}}
    failing["parse_fail"] = {4: 99}  # a page its callback cannot parse: parse retries, from the cache too
    server = chaos_server({"hosts": [throttling, failing]})
    cache: dict[str, Any] = {
        "HTTPCACHE_ENABLED": True,
        "HTTPCACHE_DIR": str(tmp_path / "cache"),
        "OPENCLAW_POLICY": FAST_POLICY,
    }
    first = _crawl(tmp_path, server.start_urls, spider_errors=1, **cache)
    truth = server.truth()["hosts"]
    assert truth["127.0.0.2"]["statuses"].get("429") and truth["127.0.0.3"]["statuses"].get("503"), truth
    assert first.stats.get("openclaw/health/throttled")  # honoured in this run: they came from the site
    server.reset()
    second = _crawl(tmp_path, server.start_urls, spider_errors=1, **cache)
    assert [server.truth()["hosts"][h]["total"] for h in ("127.0.0.2", "127.0.0.3")] == [0, 0]  # all cached
    assert sorted(i["url"] for i in second.items) == sorted(i["url"] for i in first.items)
    stats = second.stats
    assert stats["httpcache/hit"] >= len(second.items) and not stats.get("httpcache/miss"), stats
    signals = ("failures", "throttled", "held", "deferred", "circuit", "given_up")
    health = {k: v for k, v in stats.items() if k.startswith("openclaw/health/") and any(s in k for s in signals) and v}
    assert not health, health  # no failure, hold, deferral or circuit: the sites said nothing today
    assert stats["openclaw/health/final_health/127.0.0.2"] == stats["openclaw/health/final_health/127.0.0.3"] == 100
    assert not stats.get("openclaw/retry/retry_after_used") and not stats.get("openclaw/retry/budget_exhausted")
    assert stats.get("openclaw/retry/delay_seconds_total", 0) == 0, stats  # retried at once, as Scrapy does
    assert stats["openclaw/retry/cached"] == stats["retry/count"] > 0
    # nor by the domains' pace: the queue never parked a domain to wait for a token (or a hold)
    # (no wakeups asserted: on Scrapy 2.14 the start requests can outrun the domain's bucket
    # before the first cached answers give their tokens back, a pacing wait, not a site's signal)
    assert stats["retry/max_reached"] == first.stats["retry/max_reached"] >= 2  # the same pages given up
    for host in ("127.0.0.2", "127.0.0.3"):
        row = _table_row(second.log, host)
        pages = sum(1 for i in second.items if i["host"] == host)
        assert int(row["done"]) == pages + int(row["dead"]) and int(row["dead"]) >= 1, row
        assert (row["health"], row["circuit"]) == ("100", "closed"), row


@pytest.mark.parametrize("pipeline", ["files", "images"])
def test_media_pipelines_with_redirects_store_and_report_as_plain_scrapy(
    chaos_server: Any, tmp_path: Path, pipeline: str
) -> None:
    """FilesPipeline / ImagesPipeline with ``MEDIA_ALLOW_REDIRECTS``: a file, a 404 and a redirect
    give the same items, stored files, log lines and stats with the add-on as without it."""
    host = {"address": "127.0.0.2", "pages": 4, "links_per_page": 0, "not_found": [2], "redirects": {3: 1}}
    server = chaos_server({"hosts": [host]})
    base = server.urls["127.0.0.2"]
    if pipeline == "files":  # a file, a 404, a redirect to the file
        wanted, stored = [f"{base}page/1", f"{base}page/2", f"{base}page/3"], [f"{base}page/1", f"{base}page/3"]
    else:
        wanted, stored = [f"{base}image/4.png", f"{base}page/2"], [f"{base}image/4.png"]
    store = "FILES_STORE" if pipeline == "files" else "IMAGES_STORE"
    component = f"scrapy.pipelines.{pipeline}.{pipeline.title()}Pipeline"
    runs = {}
    for mode, addon in (("plain", {}), ("addon", ADDON)):
        server.reset()
        settings = {**addon, "LOG_LEVEL": "INFO", "MEDIA_ALLOW_REDIRECTS": True, "ITEM_PIPELINES": {component: 1}}
        settings |= {store: str(tmp_path / mode), "OPENCLAW_DLQ_URI": str(tmp_path / f"{mode}.jsonl")}
        result = run_crawl(
            spider=f"{MODULE}.{pipeline.title()}Spider",
            settings=settings,
            spider_args={"start_urls": base + "page/0", "file_urls": ",".join(wanted)},
            timeout=120,
        )
        assert result.returncode == 0 and "SequenceExclude" not in result.log, result.log[-3000:]
        runs[mode] = result, server.truth()["hosts"]["127.0.0.2"]["counts"]
    (plain, plain_counts), (ours, our_counts) = runs["plain"], runs["addon"]
    assert our_counts == plain_counts and plain_counts[_path(wanted[0])] >= 1
    assert ours.items == plain.items
    (item,) = ours.items
    assert [f["url"] for f in item[pipeline]] == stored
    assert all((tmp_path / "addon" / f["path"]).is_file() for f in item[pipeline])
    assert "File (code: 404): Error downloading" in ours.log  # (ImagesPipeline's words too)
    assert _media_lines(ours.log) == _media_lines(plain.log)
    media_stats = [k for k in plain.stats if k.startswith(("file_", "image_"))]
    assert {k: ours.stats.get(k) for k in media_stats} == {k: plain.stats[k] for k in media_stats}
    assert not (tmp_path / "addon.jsonl").exists()  # the pipeline handled the 404: no dead letter


def _path(url: str) -> str:
    return "/" + url.split("/", 3)[3]


def _media_lines(log: str) -> list[str]:
    """The media pipelines' WARNING and ERROR lines, without their time stamps."""
    return [
        line.split(" ", 2)[2]
        for line in log.splitlines()
        if "[scrapy.pipelines." in line and ("WARNING" in line or "ERROR" in line)
    ]
