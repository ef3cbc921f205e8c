"""What the chaos site serves: its paths, the ban page, and the per-host fault configuration.

Plain frozen dataclasses that also accept JSON data (a subprocess reads its
config from a file), validated on construction so a typo fails the test at once.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping

CONTROL_PATHS = ("/__truth__", "/__reset__")
ROBOTS_PATH = "/robots.txt"
DROP = "drop"
HANG = "hang"
_PAGE_RE = re.compile(r"^/page/(\d+)$")
#: ``/image/<n>.png``: a valid PNG, n+1 pixels square, on every host (for ImagesPipeline).
_IMAGE_RE = re.compile(r"^/image/(\d+)\.png$")
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
#: The id of the captcha form on a chaos ban page: the marker a policy lists for it.
BAN_MARKER = "chaos-captcha-form"
BAN_TITLE = "Verify you are human"
BAN_PAGE = (
    f'<html><head><title>{BAN_TITLE}</title></head><body><h1 id="title">{BAN_TITLE}</h1>'
    f'<form id="{BAN_MARKER}" action="/verify"><div class="g-recaptcha"></div></form></body></html>'
).encode()


@dataclass(frozen=True)
class FailWindows:
    """During the first ``down`` seconds of every ``period`` every request gets ``status``."""

    period: float
    down: float
    status: int = 503
    offset: float = 0.0

    def __post_init__(self) -> None:
        if self.period <= 0 or not 0 <= self.down <= self.period:
            raise ValueError(f"fail_windows: need period > 0 and 0 <= down <= period, got {self}")

    def is_down(self, elapsed: float) -> bool:
        """Whether ``elapsed`` seconds after the site started fall in a down window."""
        return (elapsed + self.offset) % self.period < self.down


DECLARE_FORMATS = ("", "ietf", "legacy", "x", "garbage")


@dataclass(frozen=True)
class RateLimit:
    """Token bucket; a request finding no token gets ``status`` (+ ``Retry-After`` unless None;
    ``{n}`` in it is replaced by the refusal's number, so every refusal can say something else).

    ``schedule`` moves the limit while the site runs: ``(from_second, rate, burst)`` rows, each
    in force from that many seconds after the site started (``rate``/``burst`` before the
    first). ``every`` > 0 replaces the bucket: every ``every``-th request is refused however
    slowly it came (a limiter whose refusals say nothing about the pace).
    ``window`` > 0 replaces it with a fixed-window counter: ``rate x window`` requests in each
    ``window`` seconds (counted from the site's start), every later one in it refused (the
    classic per-minute quota); ``{rest}`` in ``retry_after`` is replaced by the window's
    remaining whole seconds. A rate of 0 in a schedule row refuses everything (a block).

    ``declare`` makes every answer of the host say its limit in force, as a site may:
    ``"ietf"`` (``RateLimit-Policy: "chaos";q=..;w=..`` and ``RateLimit: "chaos";r=..;t=..``,
    draft 08 on), ``"legacy"`` (``RateLimit-Limit``/``-Remaining``/``-Reset`` and a
    ``RateLimit-Policy``, drafts 00-06) or ``"x"`` (``X-RateLimit-Limit``/``-Remaining``
    and ``-Reset`` as a UNIX time, GitHub's way: no window, so no pace), ``"garbage"`` (a
    ``RateLimit-Policy`` and a ``RateLimit`` whose numbers are words); ``""``: silent.
    """

    rate: float
    burst: int = 1
    retry_after: str | None = "1"
    status: int = 429
    schedule: tuple[tuple[float, float, int], ...] = ()
    every: int = 0
    declare: str = ""
    window: float = 0.0

    def __post_init__(self) -> None:
        rows = tuple((float(at), float(rate), int(burst)) for at, rate, burst in self.schedule)
        object.__setattr__(self, "schedule", rows)
        if self.rate < 0 or self.burst < 1 or any(rate < 0 or burst < 1 for _, rate, burst in rows):
            raise ValueError(f"rate_limit: need rate >= 0 and burst >= 1, got {self}")
        if [at for at, _, _ in rows] != sorted(at for at, _, _ in rows) or any(at < 0 for at, _, _ in rows):
            raise ValueError(f"rate_limit: schedule rows must start at seconds >= 0, in order, got {self}")
        if not 400 <= self.status <= 599 or self.every < 0 or self.window < 0:
            raise ValueError(f"rate_limit: need a 4xx/5xx status, every >= 0 and window >= 0, got {self}")
        if self.declare not in DECLARE_FORMATS:
            raise ValueError(f"rate_limit: declare must be one of {DECLARE_FORMATS}, got {self.declare!r}")

    def at(self, elapsed: float) -> tuple[float, int]:
        """(rate, burst) in force ``elapsed`` seconds after the site started."""
        rate, burst = self.rate, self.burst
        for start, row_rate, row_burst in self.schedule:
            if elapsed < start:
                break
            rate, burst = row_rate, row_burst
        return rate, burst


@dataclass(frozen=True)
class HostConfig:
    """One host and its faults: latency, 503 windows, 429 with Retry-After (a fixed or
    scheduled bucket, another status, or every Nth request), dropped and hanging
    connections, 404s, parse failures, scripted statuses (a script's last status repeats,
    so ``{5: [503]}`` is a page broken for good)."""

    address: str
    port: int = 0
    pages: int = 50
    links_per_page: int | str = 5
    cross_links: int = 0
    latency: float = 0.0
    latency_jitter: float = 0.0
    fail_windows: FailWindows | None = None
    rate_limit: RateLimit | None = None
    drop_rate: float = 0.0
    hang_rate: float = 0.0
    not_found: tuple[int, ...] = ()
    parse_fail: dict[int, int] = field(default_factory=dict)
    status_script: dict[int, tuple[int, ...]] = field(default_factory=dict)
    robots_txt: str | None = None  # served at /robots.txt with 200; None: 404 like any unknown path
    # a ban: after this many requests (robots.txt aside) every page answers ban_status with a
    # captcha page (BAN_MARKER in it, and an h1#title a careless spider would scrape) ...
    ban_after: int | None = None
    ban_seconds: float | None = None  # ... for this long from the first ban page (None: for good)
    ban_status: int = 200
    # a server with this many workers (None: as many as asked): the rest wait in line, first
    # come first served, so pushing harder makes answers slower, not refused (``latency`` is
    # each answer's service time; the truth's ``wait`` is how long a request stood in line)
    capacity: int | None = None
    # Scrapy's built-in middlewares at work: a page answered with a 302 to another page, or with
    # a 200 whose ``<meta http-equiv="refresh">`` points there (page -> target page) ...
    redirects: dict[int, int] = field(default_factory=dict)
    meta_refresh: dict[int, int] = field(default_factory=dict)
    # ... HTTP basic auth on every path but robots.txt ("user:password"; 401 without it), a
    # cookie set by every answer ("name=value"; the truth records each request's Cookie), and
    # pages padded to at least this many bytes (page -> size)
    basic_auth: str | None = None
    set_cookie: str | None = None
    page_sizes: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Accept plain JSON data (dicts, lists, string keys) and normalise it.
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if isinstance(self.fail_windows, dict):
            put("fail_windows", FailWindows(**self.fail_windows))
        if isinstance(self.rate_limit, dict):
            put("rate_limit", RateLimit(**self.rate_limit))
        put("not_found", tuple(sorted(int(p) for p in self.not_found)))
        put("parse_fail", {int(k): int(v) for k, v in self.parse_fail.items()})
        put("status_script", {int(k): tuple(int(s) for s in v) for k, v in self.status_script.items()})
        for name in ("redirects", "meta_refresh", "page_sizes"):
            put(name, {int(k): int(v) for k, v in getattr(self, name).items()})
        where = f"host {self.address}"
        if self.pages < 1:
            raise ValueError(f"{where}: pages must be >= 1")
        if self.links_per_page != "all" and not (isinstance(self.links_per_page, int) and self.links_per_page >= 0):
            raise ValueError(f"{where}: links_per_page must be an int >= 0 or 'all'")
        for name in ("drop_rate", "hang_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{where}: {name} must be within [0, 1]")
        if self.latency < 0 or self.latency_jitter < 0 or self.cross_links < 0:
            raise ValueError(f"{where}: latency, latency_jitter and cross_links must be >= 0")
        if any(not v for v in self.status_script.values()):
            raise ValueError(f"{where}: status_script lists must not be empty")
        if self.basic_auth is not None and ":" not in self.basic_auth:
            raise ValueError(f"{where}: basic_auth must be 'user:password'")
        if self.set_cookie is not None and "=" not in self.set_cookie:
            raise ValueError(f"{where}: set_cookie must be 'name=value'")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"{where}: capacity must be >= 1 (or None)")
        if self.ban_after is not None and self.ban_after < 0 or (self.ban_seconds or 0) < 0:
            raise ValueError(f"{where}: ban_after and ban_seconds must be >= 0")


CLOCKS = ("start", "first_request")


@dataclass(frozen=True)
class ChaosConfig:
    """The site. ``clock`` says when its clock (fail windows, limit schedules) starts: at
    ``"start"`` or at its ``"first_request"``, so that a crawl which starts late on a busy
    machine still meets every window."""

    hosts: tuple[HostConfig, ...]
    seed: int = 1
    clock: str = "start"

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"ChaosConfig: clock must be one of {CLOCKS}, got {self.clock!r}")
        hosts = tuple(h if isinstance(h, HostConfig) else HostConfig(**h) for h in self.hosts)
        object.__setattr__(self, "hosts", hosts)
        addresses = [h.address for h in hosts]
        if not hosts or len(set(addresses)) != len(addresses):
            raise ValueError(f"ChaosConfig needs at least one host and unique addresses: {addresses}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChaosConfig:
        return cls(hosts=tuple(data["hosts"]), seed=int(data.get("seed", 1)), clock=str(data.get("clock", "start")))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (``json.dumps`` turns the int keys into strings; ``from_dict`` reads them back)."""
        return asdict(self)
