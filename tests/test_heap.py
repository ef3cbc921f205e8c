"""HeapFreeze: the start-up heap leaves the GC's full collections while a crawl runs, and comes back after."""

from __future__ import annotations

import gc
import warnings

import pytest
from scrapy import signals
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from scrapy_openclaw.heap import STATS_KEY, HeapFreeze
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import fault_free_site


@pytest.fixture
def unfrozen():
    """No frozen heap before or after; garbage other tests left (an unclosed socket, say) collected
    first, so its ResourceWarning is not raised inside this test's collection."""
    gc.unfreeze()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    yield
    gc.unfreeze()


def started(settings: dict | None = None):
    # (no telnet console: on Scrapy 2.14 get_crawler's crawler has one, listening from engine_started)
    crawler = get_crawler(settings_dict={"TELNETCONSOLE_ENABLED": False, **(settings or {})})
    crawler.stats.open_spider()
    extension = HeapFreeze.from_crawler(crawler)
    crawler.signals.send_catch_log(signals.engine_started)
    return crawler, extension


def test_freezes_at_engine_start_and_unfreezes_when_the_last_crawl_stops(unfrozen):
    first, first_extension = started()  # (signals hold receivers weakly: keep the extensions)
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # this process's modules, at least
    assert first.stats.get_value(STATS_KEY) >= frozen  # (refcounting frees some frozen objects meanwhile)
    garbage = [[]]
    garbage[0].append(garbage)  # a cycle made after the freeze is still collected
    del garbage
    assert gc.collect() >= 1
    second, second_extension = started()  # a second crawl in the same process
    first.signals.send_catch_log(signals.engine_stopped)
    assert gc.get_freeze_count() >= frozen  # the other crawl still runs
    second.signals.send_catch_log(signals.engine_stopped)
    assert gc.get_freeze_count() == 0
    second.signals.send_catch_log(signals.engine_stopped)  # a repeated stop changes nothing
    assert gc.get_freeze_count() == 0
    assert not first_extension.frozen and not second_extension.frozen


def test_a_heap_the_process_froze_itself_stays_frozen(unfrozen):
    gc.freeze()  # e.g. a pre-forking server, before any crawl
    before = gc.get_freeze_count()
    crawler, extension = started()
    crawler.signals.send_catch_log(signals.engine_stopped)
    assert not extension.frozen
    assert gc.get_freeze_count() >= before > 0


def test_switched_off_by_its_setting(unfrozen):
    crawler = get_crawler(settings_dict={"OPENCLAW_GC_FREEZE": False})
    with pytest.raises(NotConfigured):
        HeapFreeze.from_crawler(crawler)


def test_a_bad_value_is_a_config_error():
    from scrapy_openclaw import OpenClawConfigError

    with pytest.raises(OpenClawConfigError, match="OPENCLAW_GC_FREEZE"):
        HeapFreeze.from_crawler(get_crawler(settings_dict={"OPENCLAW_GC_FREEZE": "sometimes"}))


@pytest.mark.parametrize("freeze", [True, False])
def test_a_real_crawl_with_the_addon(chaos_server, tmp_path, freeze):
    server = chaos_server(fault_free_site(n_hosts=1, pages=30))
    result = run_crawl(
        settings={"ADDONS": {"scrapy_openclaw.Addon": 100}, "OPENCLAW_GC_FREEZE": freeze},
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "out",
        timeout=60,
    )
    assert result.returncode == 0
    assert len({item["url"] for item in result.items}) == len(server.reachable().ok)
    if freeze:
        assert result.stats[STATS_KEY] > 10000  # Scrapy, Twisted and the add-on, loaded before the engine starts
    else:
        assert STATS_KEY not in result.stats
