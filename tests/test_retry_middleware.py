"""ClassifiedRetryMiddleware and ParseRetryMiddleware in real crawls against the chaos site.

Every assertion comes from the site's ground truth (what it really served and
when), the crawl's stats, and the dead letters a test extension wrote to a
file; never from exact wall-clock times.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import scrapy
from scrapy.utils.httpobj import urlparse_cached

from scrapy_openclaw import signals as openclaw_signals
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.spiders import ChaosSpider

DEADLINE_QUEUE = "scrapy_openclaw.pqueues.DeadlinePriorityQueue"
_HAS_DEADLINE_QUEUE = importlib.util.find_spec("scrapy_openclaw.pqueues") is not None
QUEUES = [
    pytest.param(None, id="default-queue"),
    pytest.param(
        DEADLINE_QUEUE,
        id="deadline-queue",
        marks=pytest.mark.skipif(not _HAS_DEADLINE_QUEUE, reason="scrapy_openclaw.pqueues not written yet"),
    ),
]
MODULE = "tests.test_retry_middleware"  # as the crawl subprocess imports it (repo root on its path)
SPIDER = f"{MODULE}.RetrySpider"


# --------------------------------------------------------------------------- crawl-side helpers
# (imported by the crawl subprocess as tests.test_retry_middleware)


class DeadLetterRecorder:
    """Extension: appends every ``dead_letter`` signal to ``RETRY_TEST_DEAD_LETTERS`` (JSON lines)."""

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Any) -> DeadLetterRecorder:
        ext = cls(crawler.settings.get("RETRY_TEST_DEAD_LETTERS"))
        crawler.signals.connect(ext.dead_letter, signal=openclaw_signals.dead_letter)
        return ext

    def dead_letter(self, dead_letter: Any, spider: Any) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(dead_letter.to_dict()) + "\n")


class RetrySpider(ChaosSpider):
    """ChaosSpider plus knobs: ``follow=0`` (start URLs only), ``meta_by_path`` (JSON: path -> meta),
    ``partial=1`` (yield a "head" item *before* checking the title, to catch duplicates)."""

    name = "retry_test"

    def __init__(
        self,
        *args: Any,
        follow: str = "1",
        meta_by_path: str = "{}",
        partial: str = "0",
        async_parse: str = "0",
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.follow = follow == "1"
        self.meta_by_path = json.loads(meta_by_path)
        self.partial = partial == "1"
        self.callback = self.parse_async if async_parse == "1" else self.parse

    async def start(self):
        for url in self.start_urls:
            path = "/" + url.split("//", 1)[1].partition("/")[2]
            yield scrapy.Request(
                url, meta=dict(self.meta_by_path.get(path, {})), dont_filter=True, callback=self.callback
            )

    async def parse_async(self, response):
        """The same outputs from an async generator callback (ParseRetryMiddleware's async hook)."""
        for output in self.parse(response, callback=self.parse_async):
            yield output

    def parse(self, response, callback=None):
        if self.partial:
            yield {"url": response.url, "part": "head"}
        title = response.css("h1#title::text").get()
        if title is None:
            raise ValueError("no title")
        yield {"url": response.url, "title": title, "host": urlparse_cached(response).hostname}
        if self.follow:
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href, callback=callback or self.parse)


# --------------------------------------------------------------------------- test-side helpers


def crawl(
    tmp_path: Path,
    server: Any,
    start: list[str] | None = None,
    *,
    policy: dict | None = None,
    settings: dict | None = None,
    queue: str | None = None,
    timeout: float = 90,
    **spider_args: Any,
):
    letters_path = tmp_path / "dead_letters.jsonl"
    letters_path.unlink(missing_ok=True)
    base = {
        "DOWNLOADER_MIDDLEWARES": {
            "scrapy_openclaw.retry.ClassifiedRetryMiddleware": 550,
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
        },
        "SPIDER_MIDDLEWARES": {"scrapy_openclaw.retry.ParseRetryMiddleware": 45},
        "EXTENSIONS": {f"{MODULE}.DeadLetterRecorder": 0},
        "RETRY_TEST_DEAD_LETTERS": str(letters_path),
        "DOWNLOAD_TIMEOUT": 5,
        "LOG_LEVEL": "DEBUG",
        "OPENCLAW_POLICY": policy or {},
    }
    if queue:
        base["SCHEDULER_PRIORITY_QUEUE"] = queue
    base.update(settings or {})
    result = run_crawl(
        SPIDER,
        settings=base,
        spider_args={"start_urls": start or server.start_urls, **spider_args},
        timeout=timeout,
        out_dir=tmp_path / "out",
    )
    assert result.returncode == 0, result.log[-3000:]
    for trouble in ("Unhandled error", "Error caught on signal handler", "Error while", "InvalidOutput"):
        assert trouble not in result.log, result.log[-3000:]
    letters = []
    if letters_path.exists():
        letters = [json.loads(line) for line in letters_path.read_text().splitlines() if line.strip()]
    return result, letters


def one_host(**kw: Any) -> ChaosConfig:
    return ChaosConfig(hosts=(HostConfig(address="127.0.0.2", **kw),))


def requests_to(truth: dict, path: str, address: str = "127.0.0.2") -> list[dict]:
    return [r for r in truth["hosts"][address]["requests"] if r["path"] == path]


def fast_policy(klass: str = "protocol_retryable", **kw: Any) -> dict:
    values = {"base_delay": 0.05, "max_delay": 0.2, "max_attempts": 3, **kw}
    return {"defaults": {"retry": {klass: values, "budget_min_retries": 1000}}}


# --------------------------------------------------------------------------- tests


def test_404_is_not_retried_and_recorded_once(chaos_server, tmp_path):
    server = chaos_server(one_host(pages=4, links_per_page="all", not_found=[2]))
    base = server.urls["127.0.0.2"]
    result, letters = crawl(tmp_path, server, [base + "page/0"], policy=fast_policy())
    truth = server.truth()
    assert truth["hosts"]["127.0.0.2"]["counts"]["/page/2"] == 1
    assert [(x["url"], x["error_class"], x["status"], x["attempts"]) for x in letters] == [
        (base + "page/2", "protocol_permanent", 404, 1)
    ]
    assert not any(k.endswith("/count") and "/retry/" in k for k in result.stats if k.startswith("openclaw"))
    assert len(result.items) == 3

    server.reset()
    _, letters = crawl(tmp_path, server, [base + "page/0"], settings={"OPENCLAW_DLQ_PERMANENT": False})
    assert letters == []
    assert server.truth()["hosts"]["127.0.0.2"]["counts"]["/page/2"] == 1


def test_503_window_is_ridden_out(chaos_server, tmp_path):
    # Down for the first 6 s after the crawl's first request, then up.
    host = HostConfig(address="127.0.0.2", pages=5, links_per_page="all", fail_windows={"period": 1000, "down": 6})
    server = chaos_server(ChaosConfig(hosts=(host,), clock="first_request"))
    policy = {
        "defaults": {
            "retry": {
                "protocol_retryable": {"base_delay": 0.5, "max_delay": 2.0, "max_attempts": 30},
                "budget_min_retries": 1000,
            }
        }
    }
    result, letters = crawl(tmp_path, server, policy=policy, timeout=120)
    truth = server.truth()["hosts"]["127.0.0.2"]
    assert truth["statuses"].get("503", 0) >= 2, truth["statuses"]
    assert letters == []
    assert {i["url"] for i in result.items} == set(server.reachable().ok)
    assert result.stats["openclaw/retry/protocol_retryable/count"] >= 2
    assert "openclaw/retry/protocol_retryable/max_reached" not in result.stats


@pytest.mark.parametrize("queue", QUEUES)
def test_delays_grow_exponentially_with_jitter_within_cap(chaos_server, tmp_path, queue):
    script = [503] * 5 + [200]
    server = chaos_server(one_host(pages=3, links_per_page=0, status_script={1: script, 2: script}))
    base_delay, cap = 0.4, 2.0
    policy = {
        "defaults": {
            "retry": {
                "protocol_retryable": {
                    "base_delay": base_delay,
                    "max_delay": cap,
                    "max_attempts": 10,
                    "jitter": "equal",
                },
                "budget_min_retries": 1000,
            }
        }
    }
    base = server.urls["127.0.0.2"]
    result, letters = crawl(
        tmp_path, server, [base + "page/1", base + "page/2"], policy=policy, queue=queue, follow="0"
    )
    assert letters == [] and len(result.items) == 2
    truth = server.truth()
    all_gaps = []
    for path in ("/page/1", "/page/2"):
        times = [r["t"] for r in requests_to(truth, path)]
        assert [r["status"] for r in requests_to(truth, path)] == script
        gaps = [b - a for a, b in zip(times, times[1:])]
        for n, gap in enumerate(gaps):
            top = min(cap, base_delay * 2**n)  # equal jitter: within [top/2, top]
            assert top / 2 - 0.05 <= gap <= top + 1.0, (path, n, gaps)
        assert gaps[2] > gaps[0] * 1.5 and gaps[3] > gaps[1], gaps  # exponential growth
        assert max(gaps) <= cap + 1.0
        all_gaps.append(gaps)
    # jitter: the two pages did not retry in lockstep
    assert any(abs(a - b) > 0.01 for a, b in zip(*all_gaps)), all_gaps
    assert result.stats["openclaw/retry/delay_count"] == 10
    assert result.stats["openclaw/retry/delay_le/inf"] == 10
    assert 0 < result.stats["openclaw/retry/delay_seconds_total"] <= 10 * cap


@pytest.mark.parametrize("queue", QUEUES)
def test_a_waiting_retry_does_not_stop_other_domains(chaos_server, tmp_path, queue):
    config = ChaosConfig(
        hosts=(
            HostConfig(address="127.0.0.2", pages=2, links_per_page=0, status_script={1: [503, 200]}),
            HostConfig(address="127.0.0.3", pages=60, links_per_page=3, latency=0.15),
        )
    )
    server = chaos_server(config)
    slow = server.urls["127.0.0.2"]
    policy = {
        "domains": {
            "127.0.0.2": {"retry": {"protocol_retryable": {"base_delay": 5.0, "max_delay": 5.0, "jitter": "none"}}}
        }
    }
    # One download slot in all: a middleware that slept would stop everything.
    _, letters = crawl(
        tmp_path,
        server,
        [slow + "page/1", server.urls["127.0.0.3"]],
        policy=policy,
        queue=queue,
        settings={"CONCURRENT_REQUESTS": 1},
    )
    assert letters == []
    truth = server.truth()
    first, retry = (r["t"] for r in requests_to(truth, "/page/1"))
    assert retry - first >= 4.9
    others = [r["t"] for r in truth["hosts"]["127.0.0.3"]["requests"] if first < r["t"] < retry]
    assert len(others) >= 8, others
    # ... and they kept coming through the whole wait, not just at its start
    assert any(t > first + 3.5 for t in others), [t - first for t in others]


@pytest.mark.parametrize("callback", ["sync", "async"])
def test_callback_failing_twice_then_succeeding_yields_items_once(chaos_server, tmp_path, callback):
    """Both hooks of the universal middleware: a plain generator callback and an async one."""
    server = chaos_server(one_host(pages=4, links_per_page="all", parse_fail={1: 2, 2: 10}))
    base = server.urls["127.0.0.2"]
    policy = fast_policy("parse", max_attempts=3)
    result, letters = crawl(
        tmp_path, server, [base + "page/0"], policy=policy, partial="1", async_parse="1" if callback == "async" else "0"
    )
    truth = server.truth()["hosts"]["127.0.0.2"]
    assert truth["counts"]["/page/1"] == 3 and truth["counts"]["/page/2"] == 3
    items = Counter((i["url"], i.get("part", "title")) for i in result.items)
    assert items[(base + "page/1", "head")] == 1 and items[(base + "page/1", "title")] == 1
    # failed for good: what the last attempt yielded before the error is delivered, once
    assert items[(base + "page/2", "head")] == 1 and items[(base + "page/2", "title")] == 0
    assert all(n == 1 for n in items.values()), items
    assert [(x["url"], x["error_class"], x["reason"], x["attempts"]) for x in letters] == [
        (base + "page/2", "parse", "ValueError", 3)
    ]
    assert "ValueError: no title" in letters[0]["traceback"]
    assert result.stats["openclaw/retry/parse/count"] == 4
    assert result.stats["openclaw/retry/parse/discarded_outputs"] == 4
    assert result.stats["openclaw/retry/parse/max_reached"] == 1


def test_exhausted_requests_emit_exactly_one_dead_letter_each(chaos_server, tmp_path):
    config = ChaosConfig(
        hosts=(
            HostConfig(
                address="127.0.0.2",
                pages=6,
                links_per_page="all",
                status_script={1: [500], 2: [503], 3: [502, 502, 200]},
                not_found=[4],
            ),
            HostConfig(address="127.0.0.3", pages=1, drop_rate=1.0),
        )
    )
    server = chaos_server(config)
    policy = {
        "defaults": {
            "retry": {
                "protocol_retryable": {"base_delay": 0.05, "max_delay": 0.2, "max_attempts": 3},
                "network": {"base_delay": 0.05, "max_delay": 0.2, "max_attempts": 4},
                "budget_min_retries": 1000,
            }
        }
    }
    result, letters = crawl(tmp_path, server, policy=policy)
    truth = server.truth()
    served: dict[str, list] = defaultdict(list)
    for address, host in truth["hosts"].items():
        for r in host["requests"]:
            served[host["base_url"].rstrip("/") + r["path"]].append(r["status"])
    never_ok = {url for url, statuses in served.items() if 200 not in statuses}
    by_url = Counter(x["url"] for x in letters)
    assert set(by_url) == never_ok and all(n == 1 for n in by_url.values()), (by_url, never_ok)
    for letter in letters:
        assert letter["attempts"] == len(served[letter["url"]]), letter
        assert letter["request"]["url"] == letter["url"]
        assert letter["first_attempt_at"] <= letter["last_attempt_at"]
    kinds = {x["url"].rsplit(":", 1)[1]: (x["error_class"], x["status"]) for x in letters}
    assert kinds == {
        f"{server.urls['127.0.0.2'].rsplit(':', 1)[1]}page/1": ("protocol_retryable", 500),
        f"{server.urls['127.0.0.2'].rsplit(':', 1)[1]}page/2": ("protocol_retryable", 503),
        f"{server.urls['127.0.0.2'].rsplit(':', 1)[1]}page/4": ("protocol_permanent", 404),
        f"{server.urls['127.0.0.3'].rsplit(':', 1)[1]}": ("network", None),
    }
    assert len(served[server.urls["127.0.0.3"]]) == 4  # network: 4 attempts
    assert result.stats["openclaw/retry/dead_letters"] == 4
    assert result.stats["openclaw/retry/network/max_reached"] == 1


def test_retry_budget_stops_a_retry_storm(chaos_server, tmp_path):
    server = chaos_server(one_host(pages=20, links_per_page="all", status_script={p: [503] for p in range(1, 20)}))
    policy = {
        "defaults": {
            "retry": {
                "protocol_retryable": {"base_delay": 0.05, "max_delay": 0.1, "max_attempts": 6},
                "budget_min_retries": 3,
                "budget_ratio": 0.0,
            }
        }
    }
    result, letters = crawl(tmp_path, server, [server.urls["127.0.0.2"] + "page/0"], policy=policy)
    truth = server.truth()["hosts"]["127.0.0.2"]
    assert truth["total"] == 1 + 19 + 3  # 3 retries in all, not 19 × 5
    assert len(letters) == 19 and Counter(x["url"] for x in letters).most_common(1)[0][1] == 1
    assert Counter(x["error_class"] for x in letters)["retry_budget"] >= 16
    assert result.stats["openclaw/retry/budget_exhausted"] >= 16


def test_dont_retry_max_retry_times_and_retry_enabled(chaos_server, tmp_path):
    server = chaos_server(one_host(pages=4, links_per_page=0, status_script={p: [503] for p in (1, 2, 3)}))
    base = server.urls["127.0.0.2"]
    start = [base + "page/1", base + "page/2", base + "page/3"]
    meta = json.dumps({"/page/1": {"dont_retry": True}, "/page/2": {"max_retry_times": 1}})
    _, letters = crawl(tmp_path, server, start, policy=fast_policy(max_attempts=4), follow="0", meta_by_path=meta)
    counts = server.truth()["hosts"]["127.0.0.2"]["counts"]
    assert (counts["/page/1"], counts["/page/2"], counts["/page/3"]) == (1, 2, 4)
    assert sorted((x["url"], x["attempts"]) for x in letters) == [(base + "page/2", 2), (base + "page/3", 4)]

    for off in ({"RETRY_ENABLED": False}, {"OPENCLAW_RETRY_ENABLED": False}):
        server.reset()
        result, letters = crawl(tmp_path, server, start, policy=fast_policy(max_attempts=4), follow="0", settings=off)
        assert set(server.truth()["hosts"]["127.0.0.2"]["counts"].values()) == {1}
        assert letters == [] and not [k for k in result.stats if k.startswith("openclaw/retry")]


def test_retry_after_wins_over_the_computed_delay(chaos_server, tmp_path):
    server = chaos_server(one_host(pages=3, links_per_page=0, rate_limit={"rate": 1.0, "burst": 1, "retry_after": "2"}))
    base = server.urls["127.0.0.2"]
    policy = fast_policy(max_attempts=5)  # computed delays would be <= 0.2 s
    result, letters = crawl(tmp_path, server, [base + "page/1", base + "page/2"], policy=policy, follow="0")
    assert letters == [] and len(result.items) == 2
    requests = server.truth()["hosts"]["127.0.0.2"]["requests"]
    limited = [r for r in requests if r["status"] == 429]
    assert limited, requests
    for r in limited:
        following = [x["t"] for x in requests if x["path"] == r["path"] and x["t"] > r["t"]]
        assert following and min(following) - r["t"] >= 1.9, requests
    assert result.stats["openclaw/retry/retry_after_used"] == len(limited)
