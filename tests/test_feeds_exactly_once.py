"""Exactly-once items in ordinary feed exports (``-o``, ``-O``, CSV) under ``kill -9`` and resume.

Real crawl subprocesses against the chaos site, killed with SIGKILL at
moments chosen by a seeded random generator (after some items reached the
feed), then resumed from the checkpoint: the feed must hold every reachable
page's item exactly once (judged against the site's own record of what it
served), with no torn line. Two kills are aimed: during a snapshot write and
during a journal fsync (a test extension in this file slows those down in the
crawl process and says when it is inside them).
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from scrapy_openclaw.commands.checkpoint import inspect_dir
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import read_result, start_crawl

TESTS_DIR = str(Path(__file__).resolve().parent)
DURABLE_EXTENSIONS = {
    "scrapy.extensions.feedexport.FeedExporter": None,
    "scrapy_openclaw.checkpoint.feeds.DurableFeedExporter": 0,
    "scrapy_openclaw.checkpoint.CheckpointExtension": 10,
}


@pytest.fixture(autouse=True)
def _tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Crawl subprocesses import this file's test extension (it is on their PYTHONPATH)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS_DIR, os.environ.get("PYTHONPATH")])))


def site(pages: int = 60, latency: float = 0.05, hosts: int = 2) -> ChaosConfig:
    return ChaosConfig(
        hosts=tuple(
            HostConfig(
                address=f"127.0.0.{2 + i}", pages=pages, links_per_page=4, latency=latency, latency_jitter=latency
            )
            for i in range(hosts)
        ),
        seed=5,
    )


def settings(ckpt: Path, feeds: dict[str, Any], **extra: Any) -> dict[str, Any]:
    base = {
        "OPENCLAW_CHECKPOINT_DIR": str(ckpt),
        "OPENCLAW_CHECKPOINT_FLUSH": 0.2,
        "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL": 0.3,
        "EXTENSIONS": dict(DURABLE_EXTENSIONS),
        "FEEDS": feeds,
        "CONCURRENT_REQUESTS": 4,
        "RETRY_ENABLED": False,
        "LOG_LEVEL": "INFO",
    }
    base.update(extra)
    return base


def jsonl_lines(path: Path) -> list[dict[str, Any]]:
    """Every line must be a whole JSON object: a torn line fails the test."""
    if not path.exists():
        return []
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"torn last line in {path}: {data[-80:]!r}"
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"torn last row in {path}: {data[-80:]!r}"
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))


def served_pages(server: Any) -> set[str]:
    """URLs the chaos site answered with 200 (its own record)."""
    urls = set()
    for host in server.truth()["hosts"].values():
        base = host["base_url"].rstrip("/")
        urls.update(base + r["path"] for r in host["requests"] if r["status"] == 200)
    return urls


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def raw_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def crawl_with_kills(
    server: Any, cfg: dict[str, Any], out: Path, feed: Path, kills: list[tuple[float, str | None]]
) -> tuple[int, Any]:
    """For each ``(pause, moment)``: start, wait for progress in *feed* (or, with a *moment*, for
    the crawl to be inside it), pause, kill -9 (moment "sigterm": stop it cleanly instead). Then
    run to the end. Returns (interruptions, final result)."""
    done = 0
    marker = out / "inside"
    for run, (pause, moment) in enumerate(kills):
        before = raw_lines(feed)
        marker.unlink(missing_ok=True)
        run_cfg = dict(cfg)
        if moment not in (None, "sigterm"):
            run_cfg.update(
                SLOW_MOMENT=moment,
                SLOW_MOMENT_MARKER=str(marker),
                EXTENSIONS={**cfg["EXTENSIONS"], "test_feeds_exactly_once.SlowMoment": 20},
            )
        proc = start_crawl(settings=run_cfg, spider_args={"start_urls": server.start_urls}, out_dir=out / f"run{run}")
        try:
            if moment not in (None, "sigterm"):
                assert wait_for(lambda: marker.exists() or proc.poll() is not None, 40)
            else:
                wait_for(lambda b=before: raw_lines(feed) >= b + 8 or proc.poll() is not None, 40)
            time.sleep(pause)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM if moment == "sigterm" else signal.SIGKILL)
                done += 1
        finally:
            proc.wait(30)
        if moment not in (None, "sigterm"):
            assert marker.exists(), f"run {run} was not killed inside a {moment}"
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out / "final")
    try:
        proc.wait(90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return done, read_result(out / "final", proc.returncode)


def assert_exactly_once(urls: list[str], server: Any, final: Any, kills: int, expected_kills: int) -> None:
    assert final.returncode == 0, final.log[-3000:]
    assert kills == expected_kills, "the crawl finished before it could be killed enough times"
    assert "Resuming crawl" in final.log
    reachable = server.reachable().ok
    assert served_pages(server) == reachable
    dupes = sorted({u for u in urls if urls.count(u) > 1})
    assert not dupes, f"{len(dupes)} item(s) written twice: {dupes[:5]}"
    assert set(urls) == reachable, f"lost: {sorted(reachable - set(urls))[:5]}"


def runspider(server: Any, flag: str, feed: Path, ckpt: Path, log: Path) -> subprocess.Popen[bytes]:
    """``scrapy runspider ChaosSpider -o/-O FEED`` with the add-on and a checkpoint: what a user types."""
    from scrapy_openclaw.testing import spiders
    from scrapy_openclaw.testing.servers import subprocess_env

    cmd = [
        sys.executable,
        "-m",
        "scrapy",
        "runspider",
        spiders.__file__,
        flag,
        str(feed),
        "-a",
        f"start_urls={','.join(server.start_urls)}",
        "-s",
        'ADDONS={"scrapy_openclaw.Addon": 100}',
        "-s",
        f"OPENCLAW_CHECKPOINT_DIR={ckpt}",
        "-s",
        "OPENCLAW_CHECKPOINT_FLUSH=0.2",
        "-s",
        "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=0.3",
        "-s",
        "CONCURRENT_REQUESTS=4",
        "-s",
        "TELNETCONSOLE_ENABLED=False",
        "-s",
        f"LOG_FILE={log}",
    ]
    return subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=subprocess_env()
    )


@pytest.mark.parametrize("flag", ["-o", "-O"])
def test_scrapy_runspider_o_and_O_with_the_addon_exactly_once_after_three_kills(
    chaos_server: Any, tmp_path: Path, flag: str
) -> None:
    server = chaos_server(site(pages=60))
    feed, ckpt = tmp_path / "items.jsonl", tmp_path / "ckpt"
    feed.write_text('{"url": "from an earlier crawl"}\n', encoding="utf-8")
    rng = random.Random(18 + (flag == "-O"))
    kills = 0
    for run in range(4):
        before = raw_lines(feed)
        proc = runspider(server, flag, feed, ckpt, tmp_path / f"run{run}.log")
        try:
            if run == 3:
                proc.wait(90)
                break
            wait_for(lambda b=before: raw_lines(feed) >= b + 8 or proc.poll() is not None, 40)
            time.sleep(rng.uniform(0.0, 0.4))
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                kills += 1
        finally:
            if run == 3 and proc.poll() is None:
                proc.kill()
            proc.wait(10)
    log = (tmp_path / "run3.log").read_text(encoding="utf-8")
    assert proc.returncode == 0 and "Resuming crawl" in log and "'finish_reason': 'finished'" in log, log[-3000:]
    assert "are not durable" not in log and "Scrapy's FeedExporter is enabled" not in log
    urls = [it["url"] for it in jsonl_lines(feed)]
    if flag == "-o":  # -o appends: what an earlier crawl left stays
        assert urls[0] == "from an earlier crawl"
        urls = urls[1:]
    # -O overwrote it when the crawl started, and never again on a resume
    assert_exactly_once(urls, server, SimpleNamespace(returncode=0, log=log), kills, 3)


# a test extension the crawl process loads: it slows down the moment we want to kill in
class SlowMoment:
    """``SLOW_MOMENT = "snapshot"`` or ``"fsync"``: that operation takes 0.5 s, and the file
    ``SLOW_MOMENT_MARKER`` exists while the crawl process is inside it (after items were scraped).
    ``"rotated"``: the 0.5 s come after a commit wrote the durable feeds, one of which went on to
    a new batch file, and before the journal records it (the "done" record with their offsets)."""

    def __init__(self, crawler: Any):
        from scrapy_openclaw.checkpoint import extension, journal
        from scrapy_openclaw.checkpoint.extension.journaling import CheckpointWriter

        moment, marker = crawler.settings["SLOW_MOMENT"], Path(crawler.settings["SLOW_MOMENT_MARKER"])
        self.stats = crawler.stats

        def slowly(func: Any) -> Any:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if (self.stats.get_value("item_scraped_count") or 0) >= 10:
                    marker.touch()
                    time.sleep(0.5)
                return func(*args, **kwargs)

            return wrapper

        if moment == "snapshot":
            extension.write_snapshot = slowly(extension.write_snapshot)
        elif moment == "rotated":
            journal_bases, done_record = CheckpointWriter._journal_output_bases, CheckpointWriter._done_record
            rotated: list[bool] = []

            def bases_then_note(ext: Any) -> Any:
                before = {k: v.get("batch") for k, v in ext.outputs.items()}
                ok = journal_bases(ext)
                rotated[:] = [any(v.get("batch", 0) > (before.get(k) or 1) for k, v in ext.outputs.items())]
                return ok

            def written_then_slow(ext: Any, fsync: bool) -> Any:
                record = done_record(ext, fsync)
                if rotated and rotated[0]:  # a new batch's base is journaled and the feeds written
                    slowly(lambda: None)()
                return record

            CheckpointWriter._journal_output_bases = bases_then_note  # type: ignore[method-assign]
            CheckpointWriter._done_record = written_then_slow  # type: ignore[method-assign]
        else:
            journal.os = _OsWithSlowFsync(slowly)  # type: ignore[attr-defined]

    @classmethod
    def from_crawler(cls, crawler: Any) -> SlowMoment:
        return cls(crawler)


class _OsWithSlowFsync:
    def __init__(self, slowly: Any):
        self.fsync = slowly(os.fsync)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)


def test_csv_feed_exactly_once_with_kills_during_snapshot_and_journal_fsync(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=50))
    feed = tmp_path / "items.csv"
    cfg = settings(tmp_path / "ckpt", {str(feed): {"format": "csv", "overwrite": True}})
    kills, final = crawl_with_kills(server, cfg, tmp_path, feed, [(0.2, "snapshot"), (0.2, "fsync"), (0.1, None)])
    rows = csv_rows(feed)
    assert feed.read_text(encoding="utf-8").count("url,title,host") == 1  # one header, resumed twice
    assert_exactly_once([r["url"] for r in rows], server, final, kills, 3)


def test_json_xml_and_batched_feeds_resume_and_other_storages_warn_once(chaos_server: Any, tmp_path: Path) -> None:
    """A JSON array and an XML document are reopened after a clean stop and after kill -9 (their
    header is not written twice, their end is cut off, the array continues after a comma); a batched feed continues its numbering; stdout keeps
    working, with one warning per run; ``inspect`` shows each feed's offset and items."""
    import xml.etree.ElementTree as ET

    server = chaos_server(site(pages=40))
    as_json, as_xml = tmp_path / "items.json", tmp_path / "items.xml"
    batches = tmp_path / "batch-%(batch_id)02d.jsonl"
    feeds = {
        str(as_json): {"format": "json", "overwrite": True},
        str(as_xml): {"format": "xml", "overwrite": True},
        str(batches): {"format": "jsonlines", "batch_item_count": 7},
        "stdout:": {"format": "jsonlines"},
    }
    ckpt = tmp_path / "ckpt"
    cfg = settings(ckpt, feeds)
    # a clean stop first: the JSON "]" and the XML end written at close are cut off on resume
    kills, final = crawl_with_kills(server, cfg, tmp_path, as_json, [(0.3, "sigterm"), (0.1, None)])
    assert "finish_reason': 'shutdown'" in read_result(tmp_path / "run0").log
    for run in ("run0", "run1", "final"):
        log = read_result(tmp_path / run).log
        assert log.count("are not durable") == 1 and "stdout: (StdoutFeedStorage" in log, run
    urls_json = [it["url"] for it in json.loads(as_json.read_text(encoding="utf-8"))]
    assert_exactly_once(urls_json, server, final, kills, 2)
    root = ET.parse(as_xml).getroot()
    assert sorted(el.findtext("url") for el in root.iter("item")) == sorted(urls_json)
    files = sorted(tmp_path.glob("batch-*.jsonl"))
    assert [f.name for f in files] == [f"batch-{i:02d}.jsonl" for i in range(1, len(files) + 1)]
    sizes = [len(jsonl_lines(f)) for f in files]
    assert all(n == 7 for n in sizes[:-1]) and 1 <= sizes[-1] <= 7, sizes
    assert sorted(it["url"] for f in files for it in jsonl_lines(f)) == sorted(urls_json)
    assert final.stats["feedexport/success_count/FileFeedStorage"] >= 3  # Scrapy's stats keys kept


def test_inspect_shows_each_feed(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=40, latency=0.1, hosts=1))
    feed = tmp_path / "items.jsonl"
    cfg = settings(
        tmp_path / "ckpt",
        {str(feed): {"format": "jsonlines"}},
        ITEM_PIPELINES={"scrapy_openclaw.testing.pipelines.FlushedItemsPipeline": 100},
        FLUSHED_ITEMS_FILE=str(tmp_path / "flushed.jsonl"),
        OPENCLAW_CHECKPOINT_FLUSH=0.05,
    )
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "r")
    try:
        assert wait_for(lambda: raw_lines(feed) >= 5 or proc.poll() is not None, 40)
        time.sleep(0.3)
        assert proc.poll() is None
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(10)
    info = inspect_dir(tmp_path / "ckpt")
    outputs = {o["name"]: o for o in info["outputs"]}
    mine = outputs[str(feed)]
    assert mine["items"] >= 5 and mine["offset"] == sum(
        len(ln) + 1 for ln in feed.read_bytes().split(b"\n")[: mine["items"]]
    )
    # the opted-in pipeline: the same pages done, the same items, its own byte offset
    flushed = outputs["FlushedItemsPipeline"]
    assert flushed["items"] == mine["items"]
    lines = (tmp_path / "flushed.jsonl").read_bytes().split(b"\n")
    assert flushed["marker"] == sum(len(ln) + 1 for ln in lines[: flushed["items"]])


def test_recorded_feed_states_are_validated_as_untrusted_data() -> None:
    from scrapy_openclaw.checkpoint.feeds import _template_regex, parse_outputs
    from scrapy_openclaw.checkpoint.state import RecoveredState, apply_payloads

    good = {
        "feed:/d/items-%(batch_id)02d.jsonl": {"uri": "/d/items-03.jsonl", "batch": 3, "offset": 10, "items": 1},
        "writer:P": {"marker": 5, "items": 1},
        # a later batch's start, journaled before its bytes (checked as a feed state is)
        "next:/d/items-%(batch_id)02d.jsonl": {"uri": "/d/items-04.jsonl", "batch": 4, "offset": 0, "items": 0},
    }
    bad = {
        "next:/w": {"uri": "/w", "batch": 0, "offset": 0, "items": 0},
        "feed:/x": {"uri": "/x", "batch": 0, "offset": 1, "items": 1},  # batch ids start at 1
        "feed:/y": {"uri": "/y", "batch": 1, "offset": -1, "items": 1},
        "feed:/z": {"uri": 3, "batch": 1, "offset": 1, "items": True},
        "writer:Q": {"marker": "m" * 5000, "items": 1},
        "other": {"items": 1},
    }
    parsed, problems = parse_outputs({**good, **bad})
    assert parsed == good and sorted(problems) == sorted(bad)
    # a recorded URI can only name a file the FEEDS key could have produced
    regex = _template_regex("/d/items-%(batch_id)02d.jsonl")
    assert regex.match("/d/items-03.jsonl") and not regex.match("/etc/passwd")
    assert not regex.match("/d/items-../../etc.jsonl")
    state = RecoveredState(requests={1: ["f", "{}", None], 2: ["p", "{}", None]})
    apply_payloads(state, ['D {"d":[1],"s":["ab"],"o":' + json.dumps(good) + "}", "D [1]", 'D {"d":"x"}'])
    assert list(state.requests) == [2] and state.fingerprints == {b"\xab"} and state.outputs == good
    assert len(state.warnings) == 2  # the two malformed records, named, not fatal


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_feed_write_keeps_the_unwritten_bytes_and_offsets_only_advance_per_item(tmp_path: Path) -> None:
    from scrapy_openclaw.checkpoint.feeds import DurableFile

    full = DurableFile(Path("/dev/full"), None, overwrite=False)  # every write: ENOSPC
    full.write(b'{"a": 1}\n')
    full.mark_item()
    with pytest.raises(OSError):
        full.sync(fsync=False)
    assert bytes(full._buffer) == b'{"a": 1}\n'  # kept for the next commit, nothing doubled
    full._buffer.clear()
    full.close()
    feed = tmp_path / "f.json"
    feed.write_bytes(b'[{"a": 1},\n{"b": 2}]')  # a trailer from a clean close
    f = DurableFile(feed, 10, overwrite=True)  # resume: cut back to the offset, never overwrite
    f.write(b'\n{"c": 3}')
    assert f.items_end == 10  # the item is not complete until marked
    f.mark_item()
    f.write(b"]")  # a trailer: beyond the resume point
    f.close()
    assert feed.read_bytes() == b'[{"a": 1},\n{"c": 3}]' and f.items_end == 19


@pytest.mark.parametrize(
    "kills",
    [
        [(0.05, None), (0.1, None), (0.15, None)],
        [(0.3, "sigterm"), (0.05, None), (0.1, None)],
        [(0.2, "rotated"), (0.2, "rotated"), (0.1, None)],
    ],
    ids=["kill-9", "stop-then-kill-9", "kill-9-after-a-rotation-before-the-journal"],
)
def test_small_batches_that_rotate_between_commits_stay_exactly_once(
    chaos_server: Any, tmp_path: Path, kills: list[tuple[float, str | None]]
) -> None:
    """Batches of 2 items start and finish several times between two group commits, so the journal
    never records most of them; a resumed crawl starts such a batch's file afresh instead of
    appending to what the interrupted run wrote there (which doubled batches before). The third
    case kills at that moment for certain: after a commit wrote the feeds, the batch feed onto a
    new file, and before the journal's "done" record of those pages."""
    server = chaos_server(site(pages=60))
    plain = tmp_path / "items.jsonl"
    batches = tmp_path / "batch-%(batch_id)03d.jsonl"
    feeds = {str(plain): {"format": "jsonlines"}, str(batches): {"format": "jsonlines", "batch_item_count": 2}}
    done, final = crawl_with_kills(server, settings(tmp_path / "ckpt", feeds), tmp_path, plain, kills)
    files = sorted(tmp_path.glob("batch-*.jsonl"))
    assert_exactly_once([it["url"] for f in files for it in jsonl_lines(f)], server, final, done, 3)
    assert_exactly_once([it["url"] for it in jsonl_lines(plain)], server, final, done, 3)
    assert [f.name for f in files] == [f"batch-{i:03d}.jsonl" for i in range(1, len(files) + 1)]
    assert all(len(jsonl_lines(f)) <= 2 for f in files)
