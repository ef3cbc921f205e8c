"""The practice site: ``python -m scrapy_openclaw.testing.chaos`` with no config file.

Three hosts a newcomer can point a first crawl at, each showing one thing the
add-on handles: a healthy host, a rate-limited one (429 with Retry-After above
its pace) and a flaky one (503 windows, dropped connections, a missing page).
One port on three loopback addresses, so the URLs stay the same from run to run.
"""

from __future__ import annotations

from typing import Any

from scrapy_openclaw.testing.chaos.config import ChaosConfig

PORT = 8641  #: the practice site's default port (``--port`` changes it)

#: (address, what it shows, the host's faults)
HOSTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("127.0.0.2", "healthy", {}),
    (
        "127.0.0.3",
        "rate-limited: 429 + Retry-After above 5 requests/s",
        {"rate_limit": {"rate": 5.0, "burst": 3, "retry_after": "1"}},
    ),
    (
        "127.0.0.4",
        "flaky: 503 for 1 s in every 5, some dropped connections, /page/7 is a 404, "
        "/page/11 fails its first 6 requests",
        {
            "fail_windows": {"period": 5.0, "down": 1.0, "status": 503},
            "drop_rate": 0.03,
            "not_found": [7],
            "status_script": {11: [503] * 6 + [200]},  # a dead letter that a replay recovers
        },
    ),
)


def practice_config(port: int = PORT) -> ChaosConfig:
    """Three hosts of 30 pages each on *port* (0: any free port per host)."""
    hosts = [{"address": a, "port": port, "pages": 30, "links_per_page": 3, **faults} for a, _, faults in HOSTS]
    return ChaosConfig.from_dict({"hosts": hosts, "seed": 1})


def banner(urls: dict[str, str], pid: int) -> str:
    """What the practice site prints at start: its URLs, how to crawl them and how to stop it."""
    what = {address: words for address, words, _ in HOSTS}
    lines = ["Practice site running (scrapy-openclaw chaos site, default hosts):"]
    lines += [f"  {url}  {what.get(address, '')}" for address, url in urls.items()]
    lines += [
        "Crawl them with a spider that reads -a start_urls, e.g.:",
        f"  scrapy crawl NAME -a start_urls={','.join(urls.values())}",
        f"START_URLS={','.join(urls.values())}",
        f"Stop it with Ctrl+C (or: kill {pid}).",
    ]
    return "\n".join(lines) + "\n"
