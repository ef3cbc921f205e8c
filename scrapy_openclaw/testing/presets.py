"""Ready-made chaos sites shared by tests, benchmarks and the demo.

Hosts get consecutive loopback addresses starting at 127.0.0.2, so every host is
its own Scrapy domain and download slot.
"""

from __future__ import annotations

import math
from typing import Any

from scrapy_openclaw.testing.chaos import ChaosConfig, FailWindows, HostConfig, RateLimit


def address(index: int, first: int = 2) -> str:
    """The loopback address of host ``index`` (127.0.0.2, 127.0.0.3, ...)."""
    n = first + index
    if not 1 <= n < 254 * 254:
        raise ValueError(f"no loopback address for host index {index}")
    return f"127.0.0.{n}" if n <= 254 else f"127.0.{n // 254}.{n % 254 + 1}"


def _hosts(n: int, first: int = 2, **common: Any) -> list[HostConfig]:
    return [HostConfig(address=address(i, first), **common) for i in range(n)]


def fault_free_site(
    n_hosts: int = 2, pages: int = 50, links_per_page: int | str = 5, cross_links: int = 0, seed: int = 1
) -> ChaosConfig:
    """Well-behaved hosts: the baseline and the exact-count checks."""
    return ChaosConfig(
        hosts=tuple(_hosts(n_hosts, pages=pages, links_per_page=links_per_page, cross_links=cross_links)),
        seed=seed,
    )


def flaky_site(n_hosts: int = 4, pages: int = 50, seed: int = 1, period: float = 10.0) -> ChaosConfig:
    """503 windows ~30% of the time (staggered per host), a few % drops and hangs,
    two 404 pages and two parse-fail pages per host, a little latency."""
    hosts = []
    for i in range(n_hosts):
        hosts.append(
            HostConfig(
                address=address(i),
                pages=pages,
                links_per_page=5,
                cross_links=1 if n_hosts > 1 else 0,
                latency=0.01,
                latency_jitter=0.02,
                fail_windows=FailWindows(
                    period=period,
                    down=0.3 * period,
                    status=503,
                    offset=period * i / max(n_hosts, 1),
                ),
                drop_rate=0.03,
                hang_rate=0.02,
                not_found=tuple(p for p in (pages // 3, 2 * pages // 3) if p > 0),
                parse_fail={p: 1 for p in (pages // 4, pages // 2) if p > 0},
            )
        )
    return ChaosConfig(hosts=tuple(hosts), seed=seed)


def rate_limited_site(
    n_hosts: int = 3,
    rate: float = 10.0,
    burst: int = 5,
    pages: int = 50,
    retry_after: str | None = "1",
    seed: int = 1,
) -> ChaosConfig:
    """Every host answers 429 (``Retry-After: retry_after``) above ``rate`` req/s after a ``burst``."""
    limit = {"rate": rate, "burst": burst, "retry_after": retry_after}
    return ChaosConfig(hosts=tuple(_hosts(n_hosts, pages=pages, rate_limit=limit)), seed=seed)


def hol_site(
    fast_hosts: int = 8, slow_hosts: int = 2, slow_latency: float = 1.5, pages: int = 20, seed: int = 1
) -> ChaosConfig:
    """Head-of-line blocking: a few slow hosts among fast ones (slow hosts come last)."""
    fast = _hosts(fast_hosts, pages=pages)
    slow = _hosts(slow_hosts, first=2 + fast_hosts, pages=pages, latency=slow_latency)
    return ChaosConfig(hosts=tuple(fast + slow), seed=seed)


def fast_site(pages: int = 5000, seed: int = 1) -> ChaosConfig:
    """One fault-free host without latency whose root links every page: bounded by the crawler alone."""
    return fault_free_site(n_hosts=1, pages=pages, links_per_page="all", seed=seed)


def mixed_failures_site(
    pages: int = 200, broken_every: int = 5, not_found: tuple[int, ...] = (7, 33, 77, 141), seed: int = 1
) -> ChaosConfig:
    """Two healthy hosts, except that on the second every ``broken_every``-th page (never page 0)
    always answers 503 and the ``not_found`` pages answer 404: page trouble, not domain trouble."""
    broken: dict[int, tuple[int, ...]] = {p: (503,) for p in range(broken_every, pages, broken_every)}
    missing = tuple(p for p in not_found if 0 < p < pages and p not in broken)
    return ChaosConfig(
        hosts=(
            HostConfig(address=address(0), pages=pages),
            HostConfig(address=address(1), pages=pages, status_script=broken, not_found=missing),
        ),
        seed=seed,
    )


def sweep_burst(limit: float) -> int:
    """The limit sweep's burst for a host limited at ``limit`` req/s: a quarter second's worth, 2 to 15."""
    return min(15, max(2, round(limit / 4)))


def limit_sweep_site(
    limits: tuple[float, ...] = (3, 12, 40, 60),
    seconds: float = 20.0,
    retry_after: str | None = "1",
    seed: int = 1,
    burst: int | None = None,
) -> ChaosConfig:
    """One host per limit (429 + ``Retry-After`` beyond it, burst :func:`sweep_burst` unless
    *burst* is given), each with ``limit * seconds`` pages all linked from its root, so every
    host needs ``seconds`` at its limit."""
    return ChaosConfig(
        hosts=tuple(
            HostConfig(
                address=address(i),
                pages=max(2, round(limit * seconds)),
                links_per_page="all",
                rate_limit=RateLimit(
                    rate=limit, burst=sweep_burst(limit) if burst is None else burst, retry_after=retry_after
                ),
            )
            for i, limit in enumerate(limits)
        ),
        seed=seed,
    )


def queueing_site(capacity: int = 2, latency: float = 0.05, pages: int = 400, seed: int = 1) -> ChaosConfig:
    """One host with ``capacity`` workers and ``latency`` (+20% jitter) per answer, its root
    linking every page: a server that answers slower, not refuses, when pushed past what it
    serves (``capacity / latency`` pages per second); the truth's ``wait`` is its line."""
    return ChaosConfig(
        hosts=(
            HostConfig(
                address=address(0),
                pages=pages,
                links_per_page="all",
                latency=latency,
                latency_jitter=latency * 0.2,
                capacity=capacity,
            ),
        ),
        seed=seed,
    )


def crawl_delay_site(pages: int = 10, crawl_delay: float = 2.0, n_hosts: int = 1, seed: int = 1) -> ChaosConfig:
    """Hosts whose robots.txt asks for ``Crawl-delay: crawl_delay`` (root links every page)."""
    robots = f"User-agent: *\nCrawl-delay: {crawl_delay:g}\n"
    return ChaosConfig(hosts=tuple(_hosts(n_hosts, pages=pages, links_per_page="all", robots_txt=robots)), seed=seed)


def ban_site(
    pages: int = 30, ban_after: int = 8, ban_seconds: float | None = 3.0, ban_status: int = 200, seed: int = 1
) -> ChaosConfig:
    """A healthy host, and one whose root links every page and which, after ``ban_after``
    requests, answers every page with a captcha page (``ban_status``, 200 by default: only
    a policy marker, :data:`~scrapy_openclaw.testing.chaos.BAN_MARKER`, tells it from a page)
    for ``ban_seconds`` (None: for good)."""
    return ChaosConfig(
        hosts=(
            HostConfig(address=address(0), pages=pages),
            HostConfig(
                address=address(1),
                pages=pages,
                links_per_page="all",
                ban_after=ban_after,
                ban_seconds=ban_seconds,
                ban_status=ban_status,
            ),
        ),
        seed=seed,
    )


#: The name :class:`~scrapy_openclaw.testing.resolver.LoopbackResolver` never resolves (map it to None).
UNRESOLVABLE_HOST = "dead.test"


def page_urls(base_url: str, n: int, first: int = 0) -> list[str]:
    """``n`` page URLs on ``base_url`` (``http://host[:port]/``): start URLs for a dead host."""
    return [f"{base_url.rstrip('/')}/page/{p}" for p in range(first, first + n)]


def limit_seconds(limit: RateLimit, pages: int) -> float:
    """Seconds a compliant client needs for *pages* requests under *limit* (a schedule's
    phases in turn; its first burst aside): the bound a moving limit sets."""
    if limit.window:  # (every window's quota taken at its start: the last window's opening)
        return (math.ceil(pages / round(limit.rate * limit.window)) - 1) * limit.window
    rows = [(0.0, limit.rate), *((at, rate) for at, rate, _ in limit.schedule)]
    left, t = float(pages - limit.burst), 0.0
    for i, (start, rate) in enumerate(rows):
        end = rows[i + 1][0] if i + 1 < len(rows) else float("inf")
        if rate > 0 and left <= rate * (end - start):
            return start + left / rate
        left -= rate * (end - start)
        t = end
    return t


def limited_host(index: int, limit: RateLimit, seconds: float, **host: Any) -> HostConfig:
    """A host under *limit* with as many pages (all linked from its root) as a compliant
    client fetches in *seconds* (the limit's phases in turn)."""
    rows = [(0.0, limit.rate), *((at, rate) for at, rate, _ in limit.schedule), (seconds, 0.0)]
    pages = limit.burst + sum(
        rate * (min(rows[i + 1][0], seconds) - start) for i, (start, rate) in enumerate(rows[:-1]) if start < seconds
    )
    return HostConfig(
        address=address(index), pages=max(2, round(pages)), links_per_page="all", rate_limit=limit, **host
    )


def moving_limit_site(
    rate: float = 40.0,
    schedule: tuple[tuple[float, float, int], ...] = ((15.0, 8.0, 5), (30.0, 40.0, 5)),
    burst: int = 5,
    seconds: float = 45.0,
    retry_after: str | None = "1",
    status: int = 429,
    seed: int = 1,
    declare: str = "",
    window: float = 0.0,
) -> ChaosConfig:
    """One host whose limit moves (``schedule`` rows: from second, rate, burst), with enough
    pages that a compliant client needs ``seconds``; ``status`` (+ ``Retry-After``) past it,
    and every answer saying the limit in force in the ``declare`` format ("": silent); a
    ``window`` > 0 counts ``rate x window`` requests per fixed window instead of a bucket.
    The schedule counts from the first request, so a crawler that starts late meets every phase."""
    limit = RateLimit(
        rate=rate,
        burst=burst,
        retry_after=retry_after,
        status=status,
        schedule=schedule,
        declare=declare,
        window=window,
    )
    return ChaosConfig(hosts=(limited_host(0, limit, seconds),), seed=seed, clock="first_request")


def every_nth_site(
    every: int = 3, pages: int = 400, latency: float = 1.0, retry_after: str | None = "1", seed: int = 1
) -> ChaosConfig:
    """One host refusing (429) every ``every``-th request however slowly asked, each answer
    after ``latency`` (+10% jitter), its root linking every page."""
    limit = RateLimit(rate=0.0, every=every, retry_after=retry_after)
    host = HostConfig(
        address=address(0),
        pages=pages,
        links_per_page="all",
        latency=latency,
        latency_jitter=latency * 0.1,
        rate_limit=limit,
    )
    return ChaosConfig(hosts=(host,), seed=seed)


def heterogeneous_site(seconds: float = 40.0, seed: int = 1) -> ChaosConfig:
    """Eighteen different hosts, in this order: six healthy, two slow (0.5 s answers), four
    limited (a limit that drops and comes back, one that rises, a bare 429, a 503 limiter),
    one refusing every third request, two flaky (503 windows, drops), two with pages broken
    for good (every 7th page 503, two 404s) and a blackhole (accepts, never answers). The
    limited hosts have pages for *seconds* at their limits: the bound of a compliant crawl."""
    healthy = [HostConfig(address=address(i), pages=60, latency=0.01) for i in range(6)]
    slow = [HostConfig(address=address(i), pages=40, latency=0.5, latency_jitter=0.1) for i in (6, 7)]
    limits = [
        RateLimit(rate=30.0, burst=5, schedule=((15.0, 8.0, 5), (30.0, 30.0, 5))),
        RateLimit(rate=10.0, burst=5, schedule=((15.0, 30.0, 5),)),
        RateLimit(rate=20.0, burst=3, retry_after=None),
        RateLimit(rate=10.0, burst=3, retry_after="2", status=503),
    ]
    limited = [limited_host(8 + i, limit, seconds) for i, limit in enumerate(limits)]
    every = HostConfig(
        address=address(12), pages=60, links_per_page="all", latency=0.2, rate_limit=RateLimit(rate=0.0, every=3)
    )
    flaky = [
        HostConfig(
            address=address(i),
            pages=60,
            latency=0.01,
            fail_windows=FailWindows(period=10.0, down=3.0, offset=5.0 * (i - 13)),
            drop_rate=0.03,
        )
        for i in (13, 14)
    ]
    broken = [
        HostConfig(
            address=address(i),
            pages=60,
            latency=0.01,
            status_script={p: (503,) for p in range(7, 60, 7)},
            not_found=(10, 30),
        )
        for i in (15, 16)
    ]
    blackhole = HostConfig(address=address(17), pages=20, hang_rate=1.0)
    return ChaosConfig(hosts=(*healthy, *slow, *limited, every, *flaky, *broken, blackhole), seed=seed)


def among_many_site(others: int = 12, seconds: float = 45.0, seed: int = 1) -> ChaosConfig:
    """A host limited at 30 req/s, then 5 from 15 s, then 30 from 30 s (429 + Retry-After: 1,
    bucket 5, pages for *seconds*), first among *others* healthy hosts (100 pages each)."""
    limit = RateLimit(rate=30.0, burst=5, schedule=((15.0, 5.0, 5), (30.0, 30.0, 5)))
    rest = [HostConfig(address=address(i), pages=100, latency=0.02) for i in range(1, others + 1)]
    return ChaosConfig(hosts=(limited_host(0, limit, seconds), *rest), seed=seed)
