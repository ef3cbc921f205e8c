"""The site's link graph, computed without serving it: which pages link where, what a crawl reaches.

Seeded like the site itself, so tests know the expected URLs before the crawl runs.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_openclaw.testing.chaos.config import _PAGE_RE, ChaosConfig, HostConfig

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping


def page_path(page: int) -> str:
    return f"/page/{page}"


def page_links(config: ChaosConfig, host_index: int, page: int) -> list[tuple[int, int]]:
    """Outgoing links of a page as ``(host_index, page)``; same seed, same links."""
    host = config.hosts[host_index]
    rng = random.Random(f"links:{config.seed}:{host.address}:{page}")
    links: list[tuple[int, int]] = []
    if host.links_per_page == "all":
        if page == 0:
            links.extend((host_index, k) for k in range(1, host.pages))
    else:
        k = min(int(host.links_per_page), host.pages - 1)
        links.extend((host_index, p + (p >= page)) for p in rng.sample(range(host.pages - 1), k))
    others = [i for i in range(len(config.hosts)) if i != host_index]
    for _ in range(host.cross_links if others else 0):
        other = rng.choice(others)
        links.append((other, rng.randrange(config.hosts[other].pages)))
    return links


def _page_fails_for_good(host: HostConfig, page: int) -> bool:
    script = host.status_script.get(page)
    return (
        page >= host.pages or (script is not None and script[-1] != 200) or (script is None and page in host.not_found)
    )


@dataclass(frozen=True)
class Reachable:
    """URLs a crawler reaches from the start URLs: ``ok`` pages, and ``failing`` ones (404 for good)."""

    ok: frozenset[str]
    failing: frozenset[str]


def reachable_urls(config: ChaosConfig, urls: Mapping[str, str], start: Iterable[str] | None = None) -> Reachable:
    """BFS over URLs (the root ``/`` and ``/page/0`` are distinct URLs, as for Scrapy's dupefilter).

    ``urls`` maps address -> base URL; ``start`` defaults to every host's root.
    Failing pages are not expanded; parse-fail pages count as ok (they recover).
    """
    base = {h.address: urls[h.address].rstrip("/") for h in config.hosts}
    by_netloc = {base[h.address].split("//", 1)[1]: i for i, h in enumerate(config.hosts)}

    def locate(url: str) -> tuple[int, int]:
        netloc, _, path = url.split("//", 1)[1].partition("/")
        match = _PAGE_RE.match("/" + path)
        return by_netloc[netloc], (0 if path == "" else int(match.group(1)) if match else -1)

    queue = deque(start if start is not None else [base[h.address] + "/" for h in config.hosts])
    seen: set[str] = set(queue)
    ok: set[str] = set()
    failing: set[str] = set()
    while queue:
        url = queue.popleft()
        index, page = locate(url)
        host = config.hosts[index]
        if page < 0 or _page_fails_for_good(host, page):
            failing.add(url)
            continue
        ok.add(url)
        for other, target in page_links(config, index, page):
            link = base[config.hosts[other].address] + page_path(target)
            if link not in seen:
                seen.add(link)
                queue.append(link)
    return Reachable(frozenset(ok), frozenset(failing))


def max_in_window(times: Iterable[float], window: float = 1.0) -> int:
    """Most events in any half-open interval of length ``window``."""
    ts = sorted(times)
    best = lo = 0
    for hi, t in enumerate(ts):
        while t - ts[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


#: How far apart a request's send (the crawl's clock) and its arrival (the site's) may be,
#: on a loaded machine: 0.1 s flaked in CI.
SEND_SLACK = 0.5


def busiest_second_bounds(arrivals: Iterable[float], slack: float = SEND_SLACK) -> tuple[int, int]:
    """The range the crawl's busiest second of *send* times must lie in, from the site's arrival
    times: the same requests each up to *slack* earlier, so between the site's busiest
    ``1 - slack`` and ``1 + slack`` seconds."""
    times = list(arrivals)
    return max_in_window(times, 1.0 - slack), max_in_window(times, 1.0 + slack)


# --------------------------------------------------------------------------- server
