"""Kill -9 and resume: scrapy-openclaw's checkpoint vs plain Scrapy + JOBDIR, in the same run.

    python -m benchmarks.killresume [--quick]

``run(quick) -> dict`` measures

* **kills**: a crawl killed with SIGKILL up to three times (each time once the
  server has served 1/8 of the site's pages since that start, and only while
  the crawl still runs), then run to the end, with the same directory each
  time (``OPENCLAW_CHECKPOINT_DIR`` vs ``JOBDIR``). A side that finishes
  before its next kill gets fewer kills; ``kills`` is reported next to the losses.
  Pages lost = reachable pages (ground truth) never scraped; duplicate
  fetches = server-side 200 responses beyond the first per URL. Items are
  written by a pipeline that flushes each one, so a killed process's output
  is what it really produced. Both sides also write an ordinary jsonlines
  feed (``-o``, appending): feed items lost (reachable pages with no line in
  it) and duplicated (lines beyond one per URL), durable feeds on our side,
  Scrapy's feed exporter on JOBDIR's.
* **throughput**: the same fault-free crawl with checkpointing off and on,
  four pairs in ABBA order (pages/s from Scrapy's own elapsed time): medians,
  and the median of the per-pair ratios.
* **feeds**: the same, both with the checkpoint on and a jsonlines feed:
  Scrapy's feed exporter (durable feeds off) vs ours (on).
* **scale**: a checkpoint holding 500,000 pending requests (quick: 50,000):
  its size, how long a snapshot stops the reactor thread (inline vs the
  background writer), and resume time (read + verify + rebuild every Request).
"""

from __future__ import annotations

import json
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.suite import run_module
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import read_result, start_crawl
from scrapy_openclaw.testing.servers import ChaosServer


def _site(pages: int, latency: float) -> ChaosConfig:
    return ChaosConfig(
        hosts=tuple(
            HostConfig(
                address=f"127.0.0.{2 + i}", pages=pages, links_per_page=4, latency=latency, latency_jitter=latency
            )
            for i in range(2)
        ),
        seed=7,
    )


def _items(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _fetches(truth: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for host in truth["hosts"].values():
        base = host["base_url"].rstrip("/")
        for r in host["requests"]:
            if r["status"] == 200:
                counts[base + r["path"]] = counts.get(base + r["path"], 0) + 1
    return counts


def _served(server: ChaosServer) -> int:
    """Pages the server has answered with 200 so far (all hosts)."""
    hosts = server.truth(include_requests=False)["hosts"].values()
    return sum(h["statuses"].get("200", 0) for h in hosts)


def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.1)


KILLS = 3
#: Scrapy's feed exporter replaced by ours (what the add-on does)
DURABLE_FEEDS = {
    "scrapy.extensions.feedexport.FeedExporter": None,
    "scrapy_openclaw.checkpoint.feeds.DurableFeedExporter": 0,
}


def _torn(path: Path) -> int:
    """Lines of *path* that are not whole JSON objects."""
    if not path.exists():
        return 0
    bad = 0
    for line in path.read_bytes().split(b"\n"):
        if line:
            try:
                json.loads(line)
            except ValueError:
                bad += 1
    return bad


def kill_scenario(mode: str, quick: bool, work: Path) -> dict[str, Any]:
    """Start, and kill -9 once the server has served ``pages // 8`` new pages since this start
    (only while the crawl still runs), ``KILLS`` times; then let it finish. Same rule for both
    sides: a side whose crawl ends before its next kill gets fewer kills (reported)."""
    pages = 150 if quick else 400
    with ChaosServer(_site(pages, 0.05)) as server:
        reachable = server.reachable().ok
        items = work / f"{mode}-items.jsonl"
        feed = work / f"{mode}-feed.jsonl"
        state_dir = work / f"{mode}-state"
        cfg: dict[str, Any] = {
            "ITEM_PIPELINES": {"scrapy_openclaw.testing.pipelines.FlushedItemsPipeline": 100},
            "FLUSHED_ITEMS_FILE": str(items),
            "FEEDS": {str(feed): {"format": "jsonlines"}},  # what -o does
            "CONCURRENT_REQUESTS": 8,
            "RETRY_ENABLED": False,
            "LOG_LEVEL": "INFO",
        }
        if mode == "openclaw":
            cfg.update(
                {
                    "OPENCLAW_CHECKPOINT_DIR": str(state_dir),
                    "OPENCLAW_CHECKPOINT_FLUSH": 0.5,
                    "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL": 5.0,
                    "EXTENSIONS": {**DURABLE_FEEDS, "scrapy_openclaw.checkpoint.CheckpointExtension": 10},
                }
            )
        else:
            cfg["JOBDIR"] = str(state_dir)
        kills, starts, finished = 0, 0, False
        started = time.monotonic()
        for run in range(KILLS + 3):  # bounded: KILLS killed starts, then at most a few to finish
            before = _served(server)
            out = work / f"{mode}-run{run}"
            proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out)
            starts += 1
            if kills < KILLS:
                _wait(lambda b=before: proc.poll() is not None or _served(server) >= b + pages // 8, 60)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                    kills += 1
                    continue
            try:
                proc.wait(180)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            if read_result(out, proc.returncode).stats.get("finish_reason") == "finished":
                finished = True
                break
        fetched = _fetches(server.truth())
        scraped = {it["url"] for it in _items(items)}
        in_feed = [it.get("url") for it in _items(feed)]
        return {
            "feed_items_lost": len(reachable - set(in_feed)),
            "feed_items_duplicated": len(in_feed) - len(set(in_feed)),
            "feed_torn_lines": _torn(feed),
            "kills": kills,
            "starts": starts,
            "finished": finished,
            "reachable_pages": len(reachable),
            "pages_lost": len(reachable - scraped),
            "duplicate_fetches": sum(n - 1 for n in fetched.values()),
            "seconds": round(time.monotonic() - started, 1),
        }


def throughput(quick: bool, work: Path, pairs: int | None = None, feeds: bool = False) -> dict[str, Any]:
    """Off/on runs in ABBA order (off, on, on, off, off, on, ...): medians, and the median of
    the per-pair ratios. A pair shares the machine's weather, and alternating which side
    goes first cancels a steady drift in the machine's speed (seen here: the same crawl
    taking 9 s, then 11 s twenty minutes later), which would otherwise always favour the
    side that runs first. Pages/s is from Scrapy's own elapsed time, which leaves out
    process start-up and the final snapshot at close.

    With *feeds*, both sides run the checkpoint and write a jsonlines feed: "off" with
    Scrapy's feed exporter, "on" with durable feeds."""
    pages = 800 if quick else 2500
    pairs = pairs or (2 if quick else 4)
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for i in range(pairs):
        for mode in ("off", "on") if i % 2 == 0 else ("on", "off"):
            with ChaosServer(_site(pages, 0.0)) as server:
                cfg: dict[str, Any] = {"CONCURRENT_REQUESTS": 16, "LOG_LEVEL": "INFO", "RETRY_ENABLED": False}
                tag = "fd" if feeds else "tp"
                if mode == "on" or feeds:  # runcrawl always writes its items.jsonl feed too
                    cfg.update(
                        {
                            "OPENCLAW_CHECKPOINT_DIR": str(work / f"{tag}-{mode}-{i}"),
                            "EXTENSIONS": {"scrapy_openclaw.checkpoint.CheckpointExtension": 10},
                        }
                    )
                if feeds:
                    cfg["FEEDS"] = {str(work / f"{tag}-{mode}-{i}.jsonl"): {"format": "jsonlines"}}
                    if mode == "on":
                        cfg["EXTENSIONS"].update(DURABLE_FEEDS)
                out = work / f"{tag}-{mode}-{i}-out"
                proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out)
                proc.wait(900)
                stats = read_result(out, proc.returncode).stats
                elapsed = max(stats.get("elapsed_time_seconds", 1.0), 1e-6)
                rates[mode].append(stats.get("response_received_count", 0) / elapsed)
    ratios = [on / off for off, on in zip(rates["off"], rates["on"]) if off]
    return {
        "pages_per_s_off": round(statistics.median(rates["off"]), 1),
        "pages_per_s_on": round(statistics.median(rates["on"]), 1),
        "ratio_on_off": round(statistics.median(ratios), 3) if ratios else None,
        "runs_off": [round(r, 1) for r in rates["off"]],
        "runs_on": [round(r, 1) for r in rates["on"]],
        "pair_ratios": [round(r, 3) for r in ratios],
    }


def scale(quick: bool, work: Path) -> dict[str, Any]:
    """A checkpoint of many pending requests, made by the extension itself: its size, what a
    snapshot costs the reactor thread (written inline, as at close, vs by the background
    writer, as every periodic snapshot is), and the resume (read + verify + rebuild)."""
    from scrapy import Request, Spider
    from scrapy.utils.misc import build_from_crawler
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.checkpoint import CheckpointExtension, load
    from scrapy_openclaw.serialization import request_from_data

    class _S(Spider):
        name = "s"

    n = 50_000 if quick else 500_000
    directory = work / "scale"
    crawler = get_crawler(_S, {"OPENCLAW_CHECKPOINT_DIR": str(directory)})
    ext = build_from_crawler(CheckpointExtension, crawler)
    t0 = time.monotonic()
    for i in range(n):  # what request scheduling does, without the crawl around it
        ext._new_request(
            Request(
                f"http://host{i % 50}.example/page/{i}",
                priority=i % 7,
                meta={"openclaw_deadline": 1.9e9 + i, "depth": i % 9},
            )
        )
    ext.writer.commit()
    t1 = time.monotonic()
    ext.writer.snapshot()
    t2 = time.monotonic()
    ext.writer.snapshot(background=True)
    t3 = time.monotonic()
    ext.writer.join()
    size = crawler.stats.get_value("openclaw/checkpoint/snapshot_bytes")
    write_seconds = crawler.stats.get_value("openclaw/checkpoint/snapshot_seconds")
    ext.writer.journal.close()
    del ext
    t4 = time.monotonic()
    state = load(directory)
    t5 = time.monotonic()
    spider = _S()
    rebuilt = sum(
        1 for _st, data, _fp in state.requests.values() if request_from_data(json.loads(data), spider) is not None
    )
    t6 = time.monotonic()
    assert rebuilt == n
    return {
        "pending_requests": n,
        "checkpoint_bytes": size,
        "bytes_per_request": round(size / n, 1),
        "track_seconds": round(t1 - t0, 2),
        "snapshot_inline_stall_seconds": round(t2 - t1, 2),
        "snapshot_background_stall_seconds": round(t3 - t2, 2),
        "snapshot_write_seconds": write_seconds,
        "resume_read_verify_seconds": round(t5 - t4, 2),
        "resume_rebuild_requests_seconds": round(t6 - t5, 2),
        "resume_seconds_total": round(t6 - t4, 2),
    }


def run(quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="openclaw-killresume-") as tmp:
        work = Path(tmp)
        kills = {
            "openclaw_checkpoint": kill_scenario("openclaw", quick, work),
            "scrapy_jobdir": kill_scenario("jobdir", quick, work),
        }
        tp = throughput(quick, work)
        fd = throughput(quick, work, feeds=True)
        return {
            "tables": {
                "kill": {"baseline": "scrapy_jobdir", "configs": kills},
                "throughput": {
                    "baseline": "checkpoint_off",
                    "runs": tp,
                    "configs": {
                        "checkpoint_off": {"pages_per_s": tp["pages_per_s_off"]},
                        "checkpoint_on": {"pages_per_s": tp["pages_per_s_on"], "paired_ratio": tp["ratio_on_off"]},
                    },
                },
                "feeds": {
                    "baseline": "durable_feeds_off",
                    "runs": fd,
                    "configs": {
                        "durable_feeds_off": {"pages_per_s": fd["pages_per_s_off"]},
                        "durable_feeds_on": {"pages_per_s": fd["pages_per_s_on"], "paired_ratio": fd["ratio_on_off"]},
                    },
                },
                "scale": {"baseline": None, "configs": {"openclaw_checkpoint": scale(quick, work)}},
            }
        }


def main() -> None:
    run_module(run)


if __name__ == "__main__":
    main()
