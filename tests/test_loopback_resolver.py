"""The tests' DNS resolver: mapped ``.test`` names and IP literals resolve, nothing else does,
and no query ever leaves the process."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_twisted
import scrapy.exceptions
from twisted.internet.error import DNSLookupError

from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import UNRESOLVABLE_HOST, fault_free_site
from scrapy_openclaw.testing.resolver import HOSTS_SETTING, RESOLVER_PATH, LoopbackResolver, resolver_settings

# Scrapy 2.19 re-raises Twisted's DNSLookupError as its own CannotResolveHostError
DNS_ERROR = (
    "scrapy.exceptions.CannotResolveHostError"
    if hasattr(scrapy.exceptions, "CannotResolveHostError")
    else "twisted.internet.error.DNSLookupError"
)


@pytest_twisted.inlineCallbacks
def test_resolves_mapped_names_and_literals_only() -> Any:
    from twisted.internet import reactor

    resolver = LoopbackResolver(reactor, {"A.test": "127.0.0.2", UNRESOLVABLE_HOST: None})
    assert (yield resolver.getHostByName("a.test")) == "127.0.0.2"
    assert (yield resolver.getHostByName("a.test.")) == "127.0.0.2"
    assert (yield resolver.getHostByName("127.0.0.9")) == "127.0.0.9"
    for name in (UNRESOLVABLE_HOST, "other.test", "localhost", "example.com"):
        with pytest.raises(DNSLookupError, match=name):
            yield resolver.getHostByName(name)


def test_rejects_real_names_and_bad_addresses() -> None:
    with pytest.raises(ValueError, match="example.com.*must end in '.test'"):
        LoopbackResolver(None, {"example.com": "127.0.0.2"})
    with pytest.raises(ValueError, match="nowhere"):
        resolver_settings({"a.test": "nowhere"})
    settings = resolver_settings({"a.test": "127.0.0.2"})
    assert RESOLVER_PATH in settings.values() and settings[HOSTS_SETTING] == {"a.test": "127.0.0.2"}


def test_real_crawl_fails_an_unresolvable_name_and_reaches_a_mapped_one(chaos_server: Any, tmp_out: Any) -> None:
    server = chaos_server(fault_free_site(n_hosts=1, pages=3, links_per_page=0))
    port = urlsplit(server.urls["127.0.0.2"]).port
    mapped, dead = f"http://site.test:{port}/", f"http://{UNRESOLVABLE_HOST}/page/1"
    settings = {**resolver_settings({"site.test": "127.0.0.2", UNRESOLVABLE_HOST: None}), "RETRY_TIMES": 1}
    result = run_crawl(settings=settings, spider_args={"start_urls": [mapped, dead]}, out_dir=tmp_out, timeout=90)
    assert result.stats.get("finish_reason") == "finished", result.log[-3000:]
    assert [item["url"] for item in result.items] == [mapped]
    # the dead name failed with Scrapy's DNS error, once per attempt
    assert result.stats[f"downloader/exception_type_count/{DNS_ERROR}"] == 2
    assert result.stats[f"retry/reason_count/{DNS_ERROR}"] == 1
    assert server.truth()["hosts"]["127.0.0.2"]["counts"] == {"/": 1}
    assert "ScrapyDeprecationWarning" not in result.log
