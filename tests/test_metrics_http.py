"""The one /metrics endpoint helper, as the crawl's and the scheduler's endpoints use it."""

from __future__ import annotations

import urllib.request

import pytest_twisted
from prometheus_client import CollectorRegistry, Counter
from twisted.internet import reactor
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource

from scrapy_openclaw._metrics_http import serve_metrics
from scrapy_openclaw.schedule.metrics import ScheduleMetrics


class _Hello(Resource):
    isLeaf = True

    def render_GET(self, request):
        return b"hello"


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read()


@pytest_twisted.ensureDeferred
async def test_serve_metrics_serves_the_registry_and_the_children_on_a_free_port() -> None:
    registry = CollectorRegistry()
    Counter("openclaw_test_things", "Things.", registry=registry).inc(3)
    port = serve_metrics(reactor, 0, "127.0.0.1", registry, children={b"hello": _Hello()})
    try:
        base = f"http://127.0.0.1:{port.getHost().port}"
        body = await deferToThread(_get, f"{base}/metrics")
        assert b"openclaw_test_things_total 3.0" in body
        assert await deferToThread(_get, f"{base}/hello") == b"hello"
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_the_scheduler_serves_its_metrics_through_it() -> None:
    metrics = ScheduleMetrics()
    metrics.outcome("nightly", "success", end=1000.0)
    metrics.listen(reactor, 0, "127.0.0.1")
    try:
        body = await deferToThread(_get, f"http://127.0.0.1:{metrics._listening.getHost().port}/metrics")
        assert b'openclaw_schedule_runs_total{outcome="success",task="nightly"} 1.0' in body
    finally:
        await metrics.stop_listening()
