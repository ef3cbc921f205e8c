"""Generic fixtures: real servers started and stopped around each test."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from scrapy_openclaw.testing.servers import ChaosServer, RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path

    from scrapy_openclaw.testing.chaos import ChaosConfig


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


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh, empty ``redis-server`` on a free port (``.url``, ``.restart()``)."""
    with RedisServer() as server:
        yield server


@pytest.fixture
def tmp_out(tmp_path: Path) -> Path:
    """An output directory for a crawl (``run_crawl(..., out_dir=tmp_out)``)."""
    out = tmp_path / "out"
    out.mkdir()
    return out
