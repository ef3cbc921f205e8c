"""MetricsExtension: /metrics during a real crawl, push at close, label cap, log table.

Crawls run in a subprocess against the chaos site. The final snapshot is the
one the extension pushes at close to a Pushgateway stand-in (a small HTTP
server in this process that records PUT bodies), so counters are compared
with the crawl's final stats without racing the close.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from scrapy import Request, Spider, signals
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.misc import build_from_crawler
from scrapy.utils.test import get_crawler

from scrapy_openclaw import addon
from scrapy_openclaw.metrics import OTHER, DomainLabels, MetricsExtension
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import read_result, run_crawl, start_crawl
from scrapy_openclaw.testing.presets import address
from scrapy_openclaw.testing.servers import free_port, stop_process

if TYPE_CHECKING:
    from collections.abc import Iterator

METRICS = addon.METRICS_EXTENSION
HEALTH = addon.HEALTH_MIDDLEWARE
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def components() -> dict[str, Any]:
    """The add-on: every component on (one that fails to load fails the crawl, and the test)."""
    return {"ADDONS": {"scrapy_openclaw.Addon": 100}}


class Pushgateway:
    """Records what a Pushgateway would receive (PUT /metrics/job/<job>)."""

    def __init__(self) -> None:
        received = self.received = []  # type: list[tuple[str, str]]

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                received.append((self.path, body.decode("utf-8")))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def pushgateway() -> Iterator[Pushgateway]:
    gateway = Pushgateway()
    yield gateway
    gateway.stop()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called *name* in Prometheus text."""
    return [
        (s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples if s.name == name
    ]


def total(text: str, name: str, **match: str) -> float:
    return sum(v for labels, v in samples(text, name) if all(labels.get(k) == m for k, m in match.items()))


def scrape(port: int) -> str | None:
    try:
        with _OPENER.open(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            return response.read().decode("utf-8")
    except (OSError, http.client.HTTPException):  # (not up yet, or the crawl exited mid-answer)
        return None


# --------------------------------------------------------------------------- crawls


def test_metrics_live_and_final_match_stats(chaos_server, pushgateway, tmp_out):
    healthy, faulty = address(0), address(1)
    # The faulty host's / links to all its pages, and each of them answers its
    # first fetch with 503 and its retry with 200: eleven fresh fetches fail
    # together, which the health registry reads as the domain's trouble in
    # every run. Time-based 503 windows ran on the server's clock while the
    # crawl starts after a Python start-up of varying length, so a quick crawl
    # sometimes fell between two windows (no 503 at all): red one run in five.
    site = chaos_server(
        ChaosConfig(
            hosts=(
                HostConfig(address=healthy, pages=30, links_per_page=4, latency=0.05),
                HostConfig(
                    address=faulty,
                    pages=12,
                    links_per_page="all",
                    latency=0.05,
                    drop_rate=0.05,
                    status_script={page: (503, 200) for page in range(1, 12)},
                ),
            ),
            seed=3,
        )
    )
    port = free_port()
    settings = {
        **components(),
        "OPENCLAW_METRICS_PORT": port,
        "OPENCLAW_METRICS_PUSHGATEWAY": pushgateway.address,
        "LOGSTATS_INTERVAL": 1.0,
        "OPENCLAW_LOG_DOMAINS": 5,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "DOWNLOAD_TIMEOUT": 5,
        # Quick recovery keeps the crawl short (it must finish by itself: the figures compared
        # below are those of a whole crawl).
        "OPENCLAW_POLICY": {
            "defaults": {"health": {"circuit_cooldown": 1.0, "circuit_cooldown_max": 1.5, "min_rate": 2.0}}
        },
    }
    proc = start_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_out)
    live: list[str] = []
    min_health: dict[str, float] = {}
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                text = scrape(port)
            except http.client.HTTPException:
                # A response cut short is the exiting process dropping its
                # connections; during the crawl it would be a broken endpoint.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(15)
                assert proc.poll() is not None, "a /metrics response was cut short during the crawl"
                break
            if text is not None and total(text, "scrapy_openclaw_downloader_requests_total") > 0:
                live.append(text)
                for labels, value in samples(text, "scrapy_openclaw_health_score"):
                    domain = labels["domain"]
                    min_health[domain] = min(value, min_health.get(domain, 100.0))
            time.sleep(0.25)
        stuck = (tmp_out / "stderr.log").read_text(errors="replace")[-6000:]  # (runcrawl's stack dumps)
        assert proc.poll() is not None, f"crawl did not finish in time; its stderr:\n{stuck}"
    finally:
        stop_process(proc)
    result = read_result(tmp_out, proc.returncode)
    stats = result.stats
    assert result.returncode == 0, result.log[-3000:]
    assert stats["finish_reason"] == "finished", result.log[-3000:]

    # Scraped while the crawl ran: valid text, this spider, growing counters.
    assert live, "no /metrics scrape succeeded during the crawl"
    assert {labels["spider"] for labels, _ in samples(live[-1], "scrapy_openclaw_downloader_requests_total")} == {
        "chaos"
    }
    assert total(live[-1], "scrapy_openclaw_downloader_requests_total") <= stats["downloader/request_count"]
    assert samples(live[-1], "scrapy_openclaw_downloader_active_requests")

    # The final snapshot pushed at close equals the crawl's final stats.
    assert len(pushgateway.received) == 1
    path, final = pushgateway.received[0]
    assert path == "/metrics/job/chaos"
    assert stats["openclaw/metrics/pushed"] == 1
    assert total(final, "scrapy_openclaw_downloader_requests_total") == stats["downloader/request_count"]
    assert total(final, "scrapy_openclaw_downloader_responses_total") == stats["downloader/response_count"]
    for klass in ("2xx", "3xx", "4xx", "5xx"):
        expected = sum(
            v
            for k, v in stats.items()
            if k.startswith("downloader/response_status_count/") and k.rsplit("/", 1)[1][0] == klass[0]
        )
        assert total(final, "scrapy_openclaw_downloader_responses_total", status_class=klass) == expected, klass
    assert total(final, "scrapy_openclaw_downloader_responses_total", domain=faulty, status_class="5xx") > 0
    assert total(final, "scrapy_openclaw_downloader_errors_total") == stats.get("downloader/exception_count", 0)
    assert (
        total(final, "scrapy_openclaw_downloader_response_latency_seconds_count") == stats["downloader/response_count"]
    )
    assert total(final, "scrapy_openclaw_items_scraped_total") == stats["item_scraped_count"] == len(result.items)
    by_class = {
        key.split("/")[2]: value
        for key, value in stats.items()
        if key.startswith("openclaw/retry/") and key.count("/") == 3 and key.endswith("/count")
    }
    assert by_class, "no retry by class: the 503s of the faulty host were never retried"
    for error_class, value in by_class.items():
        assert total(final, "scrapy_openclaw_retry_retries_total", error_class=error_class) == value, error_class
    # the DeadLetterPipeline counted the same signals as the metric (none, or some: the same)
    letters = total(final, "scrapy_openclaw_dlq_dead_letters_total")
    assert letters == stats.get("openclaw/retry/dead_letters", 0) == stats.get("openclaw/dlq/count", 0)
    # retry/count counts every retry, whether Scrapy's RetryMiddleware or ours
    # scheduled it (ours also counts it again under openclaw/retry/<class>/count)
    assert total(final, "scrapy_openclaw_retry_requests_total") == stats.get("retry/count", 0)

    # The host that answered 503s lost health; the healthy one kept more.
    assert {healthy, faulty} <= set(min_health), min_health
    assert min_health[faulty] < 100
    assert min_health[faulty] < min_health[healthy]
    circuit = samples(final, "scrapy_openclaw_health_circuit_state")
    assert {labels["state"] for labels, _ in circuit} == {"closed", "half_open", "open"}

    # The live per-domain table is in the log, next to Scrapy's own line.
    assert "OpenClaw domains (top" in result.log
    assert "pages/min" in result.log and healthy in result.log
    assert f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in result.log


def test_domain_label_cap(chaos_server, pushgateway, tmp_out):
    hosts = tuple(
        HostConfig(address=address(i), pages=3, links_per_page=2, cross_links=1) for i in range(12)
    )  # 127.0.0.2 .. 127.0.0.13
    site = chaos_server(ChaosConfig(hosts=hosts, seed=5))
    settings = {
        **components(),
        "OPENCLAW_METRICS_MAX_DOMAINS": 5,
        "OPENCLAW_METRICS_PUSHGATEWAY": pushgateway.address,
        "OPENCLAW_LOG_DOMAINS": 0,
    }
    result = run_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_out, timeout=120)
    assert result.returncode == 0, result.log[-3000:]
    assert len({item["host"] for item in result.items}) == 12
    ((_, final),) = pushgateway.received
    domains = {
        s.labels["domain"]
        for family in text_string_to_metric_families(final)
        for s in family.samples
        if "domain" in s.labels
    }
    assert OTHER in domains
    assert len(domains - {OTHER}) == 5, domains
    assert total(final, "scrapy_openclaw_downloader_requests_total") == result.stats["downloader/request_count"]
    assert total(final, "scrapy_openclaw_downloader_requests_total", domain=OTHER) > 0


def test_port_in_use_and_push_failure_do_not_stop_the_crawl(chaos_server, tmp_out):
    site = chaos_server(ChaosConfig(hosts=(HostConfig(address=address(0), pages=12, latency=0.15),), seed=2))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        settings = {
            **components(),
            "OPENCLAW_METRICS_PORT": port,
            "OPENCLAW_METRICS_PUSHGATEWAY": f"127.0.0.1:{free_port()}",  # nobody listens there
            "LOGSTATS_INTERVAL": 0.5,
            "OPENCLAW_LOG_DOMAINS": 3,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        }
        result = run_crawl(settings=settings, spider_args={"start_urls": site.start_urls}, out_dir=tmp_out, timeout=120)
    assert result.returncode == 0, result.log[-3000:]
    assert result.stats["finish_reason"] == "finished"
    assert len(result.items) == len(site.reachable().ok)
    assert f"Cannot serve Prometheus metrics on 127.0.0.1:{port}" in result.log
    assert "The crawl continues without the metrics endpoint" in result.log
    assert str(port) in result.stats["openclaw/metrics/listen_error"]
    assert "Could not push metrics to the Pushgateway" in result.log
    assert "openclaw/metrics/push_error" in result.stats
    assert "OpenClaw domains (top 1 of 1" in result.log
    assert "Traceback" not in result.log


class PoolHog:
    """Extension: every thread of the reactor's pool kept busy from the spider's start to its
    end, as a project's blocking pipeline does while its store is away (scrapy-redis's
    ``RedisPipeline`` pushes each item on that pool); meanwhile a thread of its own reads the
    crawl's ``/metrics`` (``OPENCLAW_METRICS_PORT``) and writes what it got to ``HOG_FILE``.
    The spider stays open until then."""

    def __init__(self, crawler: Any) -> None:
        self.release = threading.Event()
        self.port = crawler.settings.getint("OPENCLAW_METRICS_PORT")
        self.path = Path(crawler.settings.get("HOG_FILE"))
        self.reader = threading.Thread(target=self._read, daemon=True)
        crawler.signals.connect(self._opened, signal=signals.spider_opened)
        crawler.signals.connect(self._idle, signal=signals.spider_idle)
        crawler.signals.connect(self._closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> PoolHog:
        return cls(crawler)

    def _opened(self, spider: Any) -> None:
        from twisted.internet import reactor

        pool = reactor.getThreadPool()  # type: ignore[attr-defined]
        for _ in range(pool.max):
            pool.callInThread(self.release.wait, 120)
        self.reader.start()

    def _read(self) -> None:
        got: dict[str, Any] = {"status": None}
        for _ in range(100):  # (until the port listens)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as response:
                    got = {"status": response.status, "ours": b"scrapy_openclaw_" in response.read()}
                break
            except urllib.error.URLError as exc:
                if not isinstance(exc.reason, ConnectionRefusedError):
                    got = {"status": None, "error": repr(exc)}
                    break
                time.sleep(0.1)
            except OSError as exc:  # (a timeout: no thread answered)
                got = {"status": None, "error": repr(exc)}
                break
        self.path.write_text(json.dumps(got))

    def _idle(self, spider: Any) -> None:
        from scrapy.exceptions import DontCloseSpider

        if self.reader.is_alive():
            raise DontCloseSpider

    def _closed(self, spider: Any) -> None:
        self.release.set()


def test_metrics_answer_while_the_reactors_thread_pool_is_busy(tmp_out, tmp_path):
    """/metrics has a thread of its own: a pool full of a pipeline's blocked calls (Redis away)
    no longer leaves it unanswered (prometheus_client's MetricsResource renders on that pool)."""
    hog_file = tmp_path / "metrics.json"
    settings = {
        **components(),
        "OPENCLAW_METRICS_PORT": free_port(),
        "EXTENSIONS": {"tests.test_metrics.PoolHog": 0},
        "HOG_FILE": str(hog_file),
    }
    result = run_crawl(settings=settings, spider_args={"start_urls": ""}, out_dir=tmp_out, timeout=120)
    assert result.returncode == 0, result.log[-3000:]
    assert json.loads(hog_file.read_text()) == {"status": 200, "ours": True}, result.log[-3000:]


# --------------------------------------------------------------------------- units


class _Spider(Spider):
    name = "unit"


def test_domain_labels_first_come_then_other():
    labels = DomainLabels(2)
    assert [labels(d) for d in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]
    assert labels.tracked() == ["a", "b"]
    assert DomainLabels(0)("a") == OTHER


def test_each_crawler_has_its_own_registry():
    first = build_from_crawler(MetricsExtension, get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 3}))
    second = build_from_crawler(MetricsExtension, get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 3}))
    request = Request("http://127.0.0.2/page/1")
    first.crawler.signals.send_catch_log(signals.request_reached_downloader, request=request, spider=None)
    assert first.registry is not second.registry
    assert (
        first.registry.get_sample_value(
            "scrapy_openclaw_downloader_requests_total", {"spider": "", "domain": "127.0.0.2"}
        )
        == 1
    )
    assert (
        second.registry.get_sample_value(
            "scrapy_openclaw_downloader_requests_total", {"spider": "", "domain": "127.0.0.2"}
        )
        is None
    )


def test_not_configured_when_nothing_to_do():
    crawler = get_crawler(_Spider, {"OPENCLAW_METRICS_PORT": 0, "OPENCLAW_LOG_DOMAINS": 0})
    with pytest.raises(NotConfigured):
        MetricsExtension.from_crawler(crawler)


def test_stats_owned_elsewhere_are_read_at_scrape_time():
    crawler = get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 3})
    ext = build_from_crawler(MetricsExtension, crawler)
    registry = ext.registry
    assert registry.get_sample_value("scrapy_openclaw_items_scraped_total", {"spider": ""}) == 0
    for key, value in {
        "item_scraped_count": 7,
        "openclaw/retry/network/count": 2,
        "openclaw/retry/protocol_retryable/max_reached": 1,
        "openclaw/retry/reason_count/http_503": 4,
        "openclaw/retry/delay_count": 3,
        "openclaw/retry/delay_seconds_total": 4.5,
        "openclaw/retry/delay_le/2": 2,
        "openclaw/retry/delay_le/5": 3,
        "openclaw/retry/delay_le/inf": 3,
        "openclaw/retry/bogus/count": 9,  # not an error class: ignored
    }.items():
        crawler.stats.set_value(key, value)
    get = registry.get_sample_value
    assert get("scrapy_openclaw_items_scraped_total", {"spider": ""}) == 7
    assert get("scrapy_openclaw_retry_retries_total", {"spider": "", "error_class": "network"}) == 2
    assert get("scrapy_openclaw_retry_retries_total", {"spider": "", "error_class": "bogus"}) is None
    assert get("scrapy_openclaw_retry_gave_up_total", {"spider": "", "error_class": "protocol_retryable"}) == 1
    assert get("scrapy_openclaw_retry_reasons_total", {"spider": "", "reason": "http_503"}) == 4
    assert get("scrapy_openclaw_retry_delay_seconds_bucket", {"spider": "", "le": "2"}) == 2
    assert get("scrapy_openclaw_retry_delay_seconds_count", {"spider": ""}) == 3


def test_log_table_lists_busiest_domains():
    ext = build_from_crawler(
        MetricsExtension, get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 2, "LOGSTATS_INTERVAL": 30})
    )
    send = ext.crawler.signals.send_catch_log
    for host, pages in (("127.0.0.2", 1), ("127.0.0.3", 5), ("127.0.0.4", 3)):
        for n in range(pages):
            request = Request(f"http://{host}/page/{n}", meta={"retry_times": 1} if n == 0 else {})
            response = HtmlResponse(request.url, status=200, request=request)
            send(signals.request_reached_downloader, request=request, spider=None)
            send(signals.response_downloaded, response=response, request=request, spider=None)
            send(signals.request_left_downloader, request=request, spider=None)
            send(signals.response_received, response=response, request=request, spider=None)
    assert ext.logtable is not None
    lines = ext.logtable.render(ext.logtable._interval_done()).splitlines()
    assert lines[0] == "OpenClaw domains (top 2 of 3, last 30 s):"
    assert lines[1].split()[:6] == ["domain", "pages/min", "health", "rate/s", "retries", "circuit"]
    assert lines[2].split()[:2] == ["127.0.0.3", "10.0"] and lines[2].split()[4] == "1"
    assert lines[3].split()[:2] == ["127.0.0.4", "6.0"]


def test_dashboard_uses_only_exported_metrics():
    crawler = get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 3})
    ext = build_from_crawler(MetricsExtension, crawler)
    crawler.stats.set_value("openclaw/retry/delay_count", 1)  # the retry-delay histogram appears with it
    exported: set[str] = set()
    for family in ext.registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(family.type, ("",))
        exported.update(family.name + suffix for suffix in suffixes)
    dashboard = json.loads(
        (Path(__file__).parents[1] / "scrapy_openclaw" / "dashboards" / "grafana-openclaw.json").read_text()
    )
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"scrapy_openclaw_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported


def test_every_counter_is_exported_at_zero_before_it_counts():
    """A dashboard reads 0, not "No data": each counter family has samples from the first scrape,
    and a domain's counters have every status and error class once the domain is known."""
    ext = build_from_crawler(MetricsExtension, get_crawler(_Spider, {"OPENCLAW_LOG_DOMAINS": 3}))
    counters = [f for f in ext.registry.collect() if f.type == "counter"]
    empty = [f.name for f in counters if not f.samples]
    assert empty == ["scrapy_openclaw_retry_reasons"]  # (reasons cannot be listed before they occur)
    get = ext.registry.get_sample_value
    assert get("scrapy_openclaw_downloader_failures_total", {"spider": "", "domain": "other"}) == 0
    assert get("scrapy_openclaw_retry_retries_total", {"spider": "", "error_class": "network"}) == 0
    request = Request("http://127.0.0.2/page/1")
    response = HtmlResponse(request.url, status=200, request=request)
    send = ext.crawler.signals.send_catch_log
    send(signals.request_reached_downloader, request=request, spider=None)
    send(signals.response_downloaded, response=response, request=request, spider=None)
    send(signals.request_left_downloader, request=request, spider=None)
    labels = {"spider": "", "domain": "127.0.0.2"}
    assert get("scrapy_openclaw_downloader_responses_total", {**labels, "status_class": "2xx"}) == 1
    assert get("scrapy_openclaw_downloader_responses_total", {**labels, "status_class": "5xx"}) == 0
    assert get("scrapy_openclaw_dlq_dead_letters_total", {**labels, "error_class": "network"}) == 0
    assert get("scrapy_openclaw_downloader_failures_total", labels) == 0
    assert get("scrapy_openclaw_downloader_failures_total", {"spider": "", "domain": "other"}) is None
