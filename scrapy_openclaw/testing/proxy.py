"""A tiny forward HTTP proxy on loopback that records what it forwarded, and a spider that uses it.

Tests prove that proxied requests still go through the proxy after a checkpoint
resume, in distributed mode and in a replay, by asserting on
:attr:`ForwardProxy.record`. Plain HTTP only (no CONNECT): the chaos site is plain HTTP.
"""

from __future__ import annotations

import base64
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import scrapy

from scrapy_openclaw.testing.spiders import ChaosSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authorization", "proxy-authenticate", "proxy-connection", "te", "trailers"}
    | {"transfer-encoding", "upgrade"}
)


class ForwardProxy:
    """``start()`` -> ``.url`` (``http://127.0.0.1:PORT``); ``.record``: one dict per request it got.

    With *credentials* it wants ``Proxy-Authorization: Basic ...`` and answers 407 without
    it (or with wrong ones); with *always_407* it refuses everybody. It runs in a thread of
    the test process; :meth:`stop` joins it.
    """

    def __init__(
        self, credentials: tuple[str, str] | None = None, *, always_407: bool = False, host: str = "127.0.0.1"
    ):
        self.credentials = credentials
        self.always_407 = always_407
        self.record: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def url_with_credentials(self) -> str:
        user, password = self.credentials or ("user", "password")
        return f"http://{user}:{password}@{self.address}"

    def start(self) -> ForwardProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="forward-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> ForwardProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def forwarded(self) -> list[str]:
        """URLs it forwarded to their origin (not the ones it answered 407)."""
        with self._lock:
            return [r["url"] for r in self.record if r["status"] != 407]

    def _note(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.record.append(entry)

    def _authorised(self, header: str | None) -> bool:
        if self.always_407:
            return False
        if self.credentials is None:
            return True
        expected = base64.b64encode(":".join(self.credentials).encode()).decode()
        return header == f"Basic {expected}"


def _handler(proxy: ForwardProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: nothing to keep track of

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            self._forward()

        def do_POST(self) -> None:
            self._forward()

        def _forward(self) -> None:
            auth = self.headers.get("Proxy-Authorization")
            entry: dict[str, Any] = {"method": self.command, "url": self.path, "proxy_authorization": auth}
            if not proxy._authorised(auth):
                entry["status"] = 407
                proxy._note(entry)
                self._answer(407, [("Proxy-Authenticate", 'Basic realm="test"')], b"proxy authentication required")
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            parts = urlsplit(self.path)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            entry["headers"] = headers
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=30)
            try:
                path = parts.path + (f"?{parts.query}" if parts.query else "")
                conn.request(self.command, path or "/", body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                entry["status"] = response.status
                out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            except OSError as exc:
                entry["status"], out, data = 502, [], str(exc).encode()
            finally:
                conn.close()
            proxy._note(entry)
            self._answer(entry["status"], out, data)

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers:
                if name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    return Handler


class ProxiedChaosSpider(ChaosSpider):
    """The chaos spider with ``meta["proxy"]`` on every request: ``-a proxy=http://[user:pass@]host:port``."""

    name = "chaos"

    def __init__(self, *args: Any, proxy: str = "", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.proxy = proxy

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield scrapy.Request(url, meta={"proxy": self.proxy})

    def parse(self, response: Response) -> Iterator[Any]:
        for result in super().parse(response):
            if isinstance(result, scrapy.Request):
                result.meta["proxy"] = self.proxy
            yield result
