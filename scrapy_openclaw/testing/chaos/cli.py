"""The chaos site as a subprocess: read a ChaosConfig JSON file, serve it, print the URLs as one JSON line.

Run as ``python -m scrapy_openclaw.testing.chaos CONFIG.json`` (see
:class:`scrapy_openclaw.testing.servers.ChaosServer`), on the asyncio reactor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from scrapy_openclaw.testing.chaos.config import ChaosConfig
from scrapy_openclaw.testing.chaos.site import ChaosSite


def _install_asyncio_reactor() -> None:
    import asyncio

    from twisted.internet import asyncioreactor

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(eventloop=loop)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_openclaw.testing.chaos")
    parser.add_argument("config", help="path of a JSON file holding a ChaosConfig dict")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="exit after this long")
    args = parser.parse_args(argv)
    with open(args.config, encoding="utf-8") as f:
        config = ChaosConfig.from_dict(json.load(f))
    _install_asyncio_reactor()
    from twisted.internet import reactor as installed_reactor

    # (zope interface methods take no self: without a zope plugin mypy misreads IReactorCore)
    reactor: Any = installed_reactor
    site = ChaosSite(config, reactor=reactor)
    urls = site.start()
    sys.stdout.write(json.dumps({"urls": urls, "pid": os.getpid()}) + "\n")
    sys.stdout.flush()
    reactor.addSystemEventTrigger("before", "shutdown", site.stop)
    reactor.callLater(args.max_seconds, reactor.stop)
    reactor.run()  # Twisted's own SIGINT/SIGTERM handlers stop it cleanly
    loop = getattr(reactor, "_asyncioEventloop", None)
    if loop is not None and not loop.is_closed():
        loop.close()
    return 0
