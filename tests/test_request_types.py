"""Every value type a request may carry survives our queues (Redis, kill -9, JOBDIR), or is refused loudly."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request

from scrapy_openclaw.serialization import SerializationError, dumps, request_from_data, request_to_data
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import fault_free_site
from tests.request_types_spiders import Point, Product, cases, same

_spec = importlib.util.spec_from_file_location(
    "openclaw_bench_distributed", Path(__file__).resolve().parents[1] / "benchmarks" / "distributed.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

SPIDER = "tests.request_types_spiders.TypedSpider"
CASES = cases()


# --- the serializer alone ---------------------------------------------------------------


@pytest.mark.parametrize("name", list(CASES))
def test_each_type_round_trips_in_meta_and_cb_kwargs(name: str) -> None:
    value = CASES[name]
    request = Request("http://127.0.0.2/p", meta={"value": value}, cb_kwargs={"value": value, "k": {7: value}})
    again = request_from_data(json.loads(dumps(request_to_data(request, compact=True))))
    assert same(again.meta["value"], value)
    assert same(again.cb_kwargs, request.cb_kwargs)


def test_user_dicts_shaped_like_tags_stay_dicts() -> None:
    for value in CASES["tag_like_dicts"]:
        again = request_from_data(request_to_data(Request("http://127.0.0.2/", meta={"v": value})))
        assert same(again.meta["v"], value)


@pytest.mark.parametrize(
    "tagged",
    [
        {"__dataclass__": ["subprocess.Popen", {"args": "true"}]},  # loaded, but not a dataclass
        {"__item__": ["builtins.dict", {}]},
        {"__item__": ["tests.request_types_spiders.Point", {"x": 1}]},  # a dataclass is not an Item
        {"__dataclass__": ["tests.request_types_spiders.Product", {}]},  # nor the reverse
        {"__dataclass__": ["antigravity.Anything", {}]},  # never imported
        {"__dataclass__": ["tests.request_types_spiders.Point", {"nope": 1}]},
        {"__item__": ["tests.request_types_spiders.Product", {"nope": 1}]},
        {"__datetime__": ["2020-01-01T00:00:00", "../../etc/passwd", 0]},
    ],
)
def test_stored_classes_are_only_items_and_dataclasses(tagged: dict[str, Any]) -> None:
    data = request_to_data(Request("http://127.0.0.2/"))
    data["meta"] = {"v": tagged}
    with pytest.raises(SerializationError):
        request_from_data(data)
    assert "antigravity" not in sys.modules


def test_dataclass_rebuilt_without_running_its_init() -> None:
    offer = CASES["nested"]
    assert offer.extras["builds"] == 1
    again = request_from_data(request_to_data(Request("http://127.0.0.2/", meta={"v": offer})))
    assert same(again.meta["v"], offer) and again.meta["v"].extras["builds"] == 1


@pytest.mark.parametrize(
    "value, path, what",
    [
        ({"k": [1, object()]}, r"\['meta'\]\['v'\]\['k'\]\[1\]", "holds a object"),
        ({"k": Product(name=lambda: 1)}, r"\['meta'\]\['v'\]\['k'\]\['name'\]", "holds a function"),
        (
            {"k": Point(1, 2.0, frozenset({Request("http://x/")}))},
            r"\['meta'\]\['v'\]\['k'\]\.tags\{",
            "holds a Request",
        ),
    ],
)
def test_unstorable_value_names_url_and_key_path(value: Any, path: str, what: str) -> None:
    with pytest.raises(SerializationError, match=r"request http://127.0.0.2/u" + path + ".*" + what):
        request_to_data(Request("http://127.0.0.2/u", meta={"v": value}))


def test_local_class_is_refused_when_stored_not_when_loaded() -> None:
    import dataclasses

    @dataclasses.dataclass
    class Local:
        a: int = 1

    with pytest.raises(SerializationError, match="defined inside a function"):
        request_to_data(Request("http://127.0.0.2/", meta={"v": Local()}))


# --- real crawls ----------------------------------------------------------------------


def _pages(chaos_server: Any, n: int, latencies: tuple[float, ...] = (0.05,)) -> tuple[Any, list[list[str]]]:
    cfg = fault_free_site(n_hosts=len(latencies), pages=n, links_per_page=0).to_dict()
    for host, latency in zip(cfg["hosts"], latencies):
        host["latency"] = latency
    server = chaos_server(cfg)
    bases = [server.urls[h["address"]].rstrip("/") for h in cfg["hosts"]]
    return server, [[f"{base}/page/{i}" for i in range(n)] for base in bases]


def _distributed(redis_url: str, urls: list[str], report: Path, mode: str, **extra: Any) -> dict[str, Any]:
    return {
        **bench.ours(redis_url, lease=1.0),
        "ITEM_PIPELINES": {},
        "TYPED_MODE": mode,
        "TYPED_URLS": urls,
        "TYPED_REPORT": str(report),
        **extra,
    }


def _all_equal(report: dict[str, Any]) -> None:
    results = report["results"]
    assert set(CASES) <= set(results), sorted(set(CASES) - set(results))
    assert {name: results[name] for name in CASES} == {name: {"meta": True, "cb_kwargs": True} for name in CASES}


def test_distributed_round_trip_and_loud_refusal(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    _, (urls,) = _pages(chaos_server, len(CASES) + 1)
    report = tmp_path / "report.json"
    workers = bench.Workers(1, _distributed(redis_server.url, urls, report, "all"), [], tmp_path, spider=SPIDER)
    assert workers.wait(120) == [0], workers.log(0)[-3000:]
    seen = json.loads(report.read_text())
    _all_equal(seen)
    refused_url = urls[len(CASES)]
    log, stats = workers.log(0), workers.stats(0)
    assert "ERROR" in log and f"Refused <GET {refused_url}>" in log
    assert f"request {refused_url}['meta']['bad']['k'][1] holds a object" in log
    assert stats["openclaw/unstorable/redis"] == 1
    assert seen["dropped"] == [refused_url]
    (letter,) = [d for d in seen["dead_letters"] if d["url"] == refused_url]
    assert letter["reason"] == "unstorable" and "['bad']['k'][1]" in letter["message"]
    assert seen["results"]["after_refused"]  # the same URL again: not filtered as seen
    assert stats.get("openclaw/distributed/pushed") == len(CASES) + 1
    assert "DeprecationWarning" not in log  # (crawl subprocesses do not turn warnings into errors)


def test_distributed_kill9_resume_round_trip(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    """The first worker queues every case and dies (kill -9) at its first response; a second
    worker, started later with no start requests, gets every case from Redis as it was."""
    _, (urls,) = _pages(chaos_server, len(CASES), latencies=(1.0,))
    first = bench.Workers(
        1,
        _distributed(redis_server.url, urls, tmp_path / "first.json", "die", CONCURRENT_REQUESTS=64),
        [],
        tmp_path / "first",
        spider=SPIDER,
    )
    assert first.wait(120) == [-9], first.log(0)[-3000:]
    assert bench.queue_size(redis_server.url, "data", key="typed:requests", spider="typed") == len(CASES)
    report = tmp_path / "second.json"
    second = bench.Workers(
        1, _distributed(redis_server.url, urls, report, "none"), [], tmp_path / "second", spider=SPIDER
    )
    assert second.wait(120) == [0], second.log(0)[-3000:]
    _all_equal(json.loads(report.read_text()))


def test_jobdir_pause_resume_round_trip(chaos_server: Any, tmp_path: Path) -> None:
    _, (urls, slow) = _pages(chaos_server, len(CASES) + 1, latencies=(0.02, 1.5))
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "JOBDIR": str(tmp_path / "job"),
        "OPENCLAW_DLQ_URI": str(tmp_path / "dlq.jsonl"),
        "CLOSESPIDER_PAGECOUNT": 2,
        "TYPED_URLS": urls[: len(CASES)] + [urls[-1], slow[0]],
        "TYPED_MODE": "pause",
        "TYPED_REPORT": str(tmp_path / "first.json"),
    }
    first = run_crawl(SPIDER, settings, out_dir=tmp_path / "first")
    assert first.stats.get("finish_reason") == "closespider_pagecount", first.log[-3000:]
    assert first.stats.get("openclaw/queue/persisted") == len(CASES), first.log[-3000:]
    settings.update(CLOSESPIDER_PAGECOUNT=0, TYPED_MODE="none", TYPED_REPORT=str(tmp_path / "second.json"))
    second = run_crawl(SPIDER, settings, out_dir=tmp_path / "second")
    assert second.stats.get("openclaw/queue/restored") == len(CASES), second.log[-3000:]
    assert "DeprecationWarning" not in first.log + second.log
    _all_equal(json.loads((tmp_path / "second.json").read_text()))


def test_checkpoint_kill9_resume_round_trip(chaos_server: Any, tmp_path: Path) -> None:
    """Every case scheduled (and journaled), the crawl killed (-9) at its first response; the
    resumed crawl gets each one back from the checkpoint as it was."""
    from scrapy_openclaw.testing.crawl import start_crawl

    _, (urls,) = _pages(chaos_server, len(CASES), latencies=(1.5,))
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "OPENCLAW_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "OPENCLAW_CHECKPOINT_FLUSH": 0.1,
        "OPENCLAW_DLQ_URI": str(tmp_path / "dlq.jsonl"),
        "CONCURRENT_REQUESTS": 64,
        "TYPED_URLS": urls,
        "TYPED_MODE": "die",
    }
    first = start_crawl(SPIDER, settings, out_dir=tmp_path / "first")
    assert first.wait(60) == -9
    settings.update(TYPED_MODE="none", TYPED_REPORT=str(tmp_path / "second.json"))
    second = run_crawl(SPIDER, settings, out_dir=tmp_path / "second")
    assert second.returncode == 0, second.log[-3000:]
    _all_equal(json.loads((tmp_path / "second.json").read_text()))


def test_garbage_under_any_tag_is_a_serialization_error() -> None:
    """Stored data is untrusted: whatever sits under a tag, loading fails with SerializationError only."""
    from scrapy_openclaw.serialization import _DECODERS

    garbage = [
        None,
        1,
        1.5,
        float("nan"),
        "x",
        "",
        "sNaN",
        "1e999999999999",
        [],
        [1],
        [1, 2, 3],
        ["x", None, 5],
        {"a": 1},
        10**400,
        [10**20] * 3,
        ["2020-01-01T00:00:00", "Nope/Zone", 0],
        ["2020-01-01T00:00:00", None, 9],
        ["12:00", 2],
        [[[1], 2]],
        ["builtins.object", {}],
        ["PurePosixPath", 5],
        ["Nope", "x"],
        [[{"__set__": [[1]]}, 1]],
        "9999-99-99",
    ]
    base = request_to_data(Request("http://127.0.0.2/"))
    for tag in _DECODERS:
        for value in garbage:
            try:
                request_from_data({**base, "meta": {"v": {tag: value}}})
            except SerializationError:
                pass
