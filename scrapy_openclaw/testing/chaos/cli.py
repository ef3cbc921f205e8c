"""The chaos site as a subprocess: read a ChaosConfig JSON file, serve it, print the URLs as one JSON line.

Run as ``python -m scrapy_openclaw.testing.chaos CONFIG.json`` (see
:class:`scrapy_openclaw.testing.servers.ChaosServer`), on the asyncio reactor.
Without a config file it serves the practice site (:mod:`.practice`) and
prints its URLs for a person to read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from scrapy_openclaw.testing.chaos import practice
from scrapy_openclaw.testing.chaos.config import ChaosConfig
from scrapy_openclaw.testing.chaos.site import ChaosSite


def _install_asyncio_reactor() -> None:
    import asyncio

    from twisted.internet import asyncioreactor

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(eventloop=loop)


def _announce(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_openclaw.testing.chaos")
    parser.add_argument(
        "config", nargs="?", help="path of a JSON file holding a ChaosConfig dict; none: the practice site"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=None, help="exit after this long (default 900; practice site 3 h)"
    )
    parser.add_argument(
        "--port", type=int, default=practice.PORT, help=f"the practice site's port (default {practice.PORT}; 0: any)"
    )
    args = parser.parse_args(argv)
    if args.config is None:
        config = practice.practice_config(args.port)
        max_seconds = 3 * 3600.0 if args.max_seconds is None else args.max_seconds
    else:
        with open(args.config, encoding="utf-8") as f:
            config = ChaosConfig.from_dict(json.load(f))
        max_seconds = 900.0 if args.max_seconds is None else args.max_seconds
    _install_asyncio_reactor()
    from twisted.internet import reactor as installed_reactor
    from twisted.internet.error import CannotListenError

    # (zope interface methods take no self: without a zope plugin mypy misreads IReactorCore)
    reactor: Any = installed_reactor
    site = ChaosSite(config, reactor=reactor)
    try:
        urls = site.start()
    except CannotListenError as exc:
        sys.stderr.write(f"error: cannot listen on {exc.interface}:{exc.port} ({exc.socketError}); try --port 0\n")
        return 1
    if args.config is None:
        announcement = practice.banner(urls, os.getpid())
    else:
        announcement = json.dumps({"urls": urls, "pid": os.getpid()}) + "\n"
    # once running: Twisted's SIGINT/SIGTERM handlers are in place when the reader is told to use them
    reactor.callWhenRunning(_announce, announcement)
    reactor.addSystemEventTrigger("before", "shutdown", site.stop)
    reactor.callLater(max_seconds, reactor.stop)
    reactor.run()  # Twisted's own SIGINT/SIGTERM handlers stop it cleanly
    loop = getattr(reactor, "_asyncioEventloop", None)
    if loop is not None and not loop.is_closed():
        loop.close()
    return 0
