"""Generic fixtures: real servers started and stopped around each test."""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_openclaw.testing.servers import ChaosServer, RedisServer, stop_left_running

# One store key for the session (in-process crawls and the scrapy subprocesses the tests start):
# no test writes a key file into the checkout, and distributed workers share it as they must.
os.environ.setdefault("OPENCLAW_STORE_KEY", f"openclaw-tests-{secrets.token_hex(16)}")

#: Fixtures that start a server process: a test using one is a ``crawl`` test
#: (``pytest -m "not crawl"`` runs the unit tests alone, in seconds).
SERVER_FIXTURES = frozenset({"chaos_server", "redis_server", "redis_cluster", "redis_any", "tmp_out"})


#: The files that take longest (50-115 s each on one worker, slowest first): collected
#: first, so that ``-n N --dist loadfile`` starts them at once beside the short ones instead of
#: leaving one of them to run alone at the end (the walkthrough alone took the last 100 s).
LONGEST_FIRST = (  # (measured with --junitxml on 2 cores, -n 4)
    "test_distributed_pending.py",
    "test_walkthrough.py",
    "test_distributed.py",
    "test_health_middleware.py",
    "test_site_memory.py",
    "test_retry_middleware.py",
    "test_adaptive_crawl.py",
    "test_sentinel_failover.py",
    "test_checkpoint_crawl.py",
    "test_feeds_exactly_once.py",
    "test_request_types.py",
    "test_workflows_builtins.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.crawl)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: file order kept otherwise)


if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy_openclaw.testing.chaos import ChaosConfig


@pytest.fixture(autouse=True)
def _temporary_files_under_pytest(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test process's temporary files (a crawl's default output directory, a server's
    data) go under pytest's base directory, which pytest prunes: a run leaves nothing in /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(autouse=True)
def _no_crawl_left_running() -> Iterator[None]:
    """A test that fails before it stops its crawl subprocesses (a failed assert between start
    and wait) leaves none behind: a live one would fail the next test on this worker with a
    ResourceWarning, and hold the servers it used."""
    yield
    stop_left_running()


@pytest.fixture
def chaos_server() -> Iterator[Callable[..., ChaosServer]]:
    """Factory: ``chaos_server(config, **kw)`` starts a chaos site subprocess, stopped at teardown."""
    started: list[ChaosServer] = []

    def start(config: ChaosConfig | dict[str, Any], **kwargs: Any) -> ChaosServer:
        server = ChaosServer(config, **kwargs)
        started.append(server)
        return server.start()

    yield start
    for server in reversed(started):
        server.stop()


@pytest.fixture(scope="session")
def _shared_redis() -> Iterator[dict[str, RedisServer]]:
    held: dict[str, RedisServer] = {}
    yield held
    if "server" in held:
        held["server"].close()


@pytest.fixture
def redis_server(_shared_redis: dict[str, RedisServer]) -> RedisServer:
    """An empty ``redis-server`` on a free port (``.url``, ``.restart()``, ``.stop()``).

    One server for the session, flushed before each test (a start costs ~0.1 s);
    a test may stop, restart or lock it (``requirepass``): the next test gets
    it running again on the same port, or a new one if it no longer answers.
    """
    server = _shared_redis.get("server")
    if server is not None and not server.running:
        server.start()  # stopped by the last test (an outage test): same port, empty
    if server is None or not server.ping():
        if server is not None:
            server.close()
        server = _shared_redis["server"] = RedisServer().start()
    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
        client.config_set("save", "")  # (a test may have turned persistence on)
    finally:
        client.close()
    return server


@pytest.fixture
def tmp_out(tmp_path: Path) -> Path:
    """An output directory for a crawl (``run_crawl(..., out_dir=tmp_out)``)."""
    out = tmp_path / "out"
    out.mkdir()
    return out


def _bench_distributed() -> Any:
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "openclaw_bench_distributed_fixtures", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def _redis_cluster_module() -> Iterator[Any]:
    with _bench_distributed().RedisClusterServer() as cluster:
        yield cluster


@pytest.fixture
def redis_cluster(_redis_cluster_module: Any) -> Any:
    """A 3-master Redis Cluster on loopback (``.url``: its first node), emptied for each test;
    one cluster per test module (it takes ~3 s to form)."""
    _redis_cluster_module.flushall()
    return _redis_cluster_module


@pytest.fixture(params=["single", "cluster"])
def redis_any(request: pytest.FixtureRequest) -> Any:
    """The test once against one redis-server and once against a 3-master Redis Cluster."""
    return request.getfixturevalue("redis_server" if request.param == "single" else "redis_cluster")
