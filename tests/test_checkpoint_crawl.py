"""Kill -9 / SIGTERM / resume with real crawl subprocesses against the chaos site.

Items are written by :class:`~scrapy_openclaw.testing.pipelines.FlushedItemsPipeline` (flushed to the OS per
item) so "zero lost" is judged on what a killed process really left: the
feed exporter buffers in memory and would lose items no matter what the
checkpoint does.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.checkpoint import load
from scrapy_openclaw.checkpoint.state import generations, snapshot_path
from scrapy_openclaw.testing.chaos import ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import read_result, start_crawl

TESTS_DIR = str(Path(__file__).resolve().parent)


def site(pages: int = 80, latency: float = 0.05, hosts: int = 2) -> ChaosConfig:
    return ChaosConfig(
        hosts=tuple(
            HostConfig(
                address=f"127.0.0.{2 + i}", pages=pages, links_per_page=4, latency=latency, latency_jitter=latency
            )
            for i in range(hosts)
        ),
        seed=3,
    )


def settings(ckpt: Path, items: Path, **extra: Any) -> dict[str, Any]:
    base = {
        "OPENCLAW_CHECKPOINT_DIR": str(ckpt),
        "OPENCLAW_CHECKPOINT_FLUSH": 0.2,
        "OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL": 1.0,
        "EXTENSIONS": {"scrapy_openclaw.checkpoint.CheckpointExtension": 10},
        "ITEM_PIPELINES": {"scrapy_openclaw.testing.pipelines.FlushedItemsPipeline": 100},
        "FLUSHED_ITEMS_FILE": str(items),
        "CONCURRENT_REQUESTS": 8,
        "RETRY_ENABLED": False,
        "LOG_LEVEL": "INFO",
    }
    base.update(extra)
    return base


@pytest.fixture(autouse=True)
def _tests_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Crawl subprocesses import this file's spiders (it is on their PYTHONPATH)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS_DIR, os.environ.get("PYTHONPATH")])))


def items_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # a line cut by kill -9
    return out


def fetched_pages(truth: dict[str, Any]) -> dict[str, int]:
    """URL -> times the server answered it with 200."""
    counts: dict[str, int] = {}
    for host in truth["hosts"].values():
        base = host["base_url"].rstrip("/")
        for r in host["requests"]:
            if r["status"] == 200:
                url = base + r["path"]
                counts[url] = counts.get(url, 0) + 1
    return counts


def wait_for(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def run_to_end(server: Any, cfg: dict[str, Any], out: Path, timeout: float = 90) -> Any:
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out)
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return read_result(out, proc.returncode)


def test_kill9_repeatedly_loses_nothing(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=100, latency=0.1))
    reachable = server.reachable().ok
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    # a tiny snapshot interval: some kills land while a snapshot is being written
    cfg = settings(ckpt, items, OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=0.05, CONCURRENT_REQUESTS=4)
    kills, run, final = 0, 0, None
    for pause in (0.0, 0.7, 0.3, None):  # kill at different moments after progress was seen
        before = len(items_of(items))
        out = tmp_path / f"run{run}"
        run += 1
        if pause is None:
            final = run_to_end(server, cfg, out)
            break
        proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out)
        wait_for(lambda b=before: len(items_of(items)) > b + 10 or proc.poll() is not None, 30)
        time.sleep(pause)
        if proc.poll() is not None:
            final = read_result(out, proc.returncode)
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        kills += 1
    assert final is not None
    assert kills == 3, "the crawl finished before it could be killed three times"
    assert final.returncode == 0, final.log[-3000:]
    assert "Resuming crawl" in final.log
    truth = server.truth()
    fetched = fetched_pages(truth)
    scraped = {it["url"] for it in items_of(items)}
    assert reachable <= scraped, f"lost pages: {sorted(reachable - scraped)[:10]}"
    assert set(fetched) == reachable
    # re-fetches are bounded by what can be in flight or unflushed when killed
    refetched = sum(n - 1 for n in fetched.values())
    # per kill: CONCURRENT_REQUESTS in flight + pages finished in the last unflushed 0.2 s batch
    # (4 slots / 0.1 s latency -> ~8 pages), with a wide margin for a loaded machine
    bound = kills * (4 + 8) * 2
    assert refetched <= bound, (refetched, bound)
    assert load(ckpt).finished


def test_sigterm_leaves_final_snapshot_and_resumes(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=60, latency=0.1, hosts=1))
    reachable = server.reachable().ok
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(ckpt, items, OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=60.0, CONCURRENT_REQUESTS=2)
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "r1")
    assert wait_for(lambda: len(items_of(items)) >= 5, 30)
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    first = read_result(tmp_path / "r1", proc.returncode)
    assert first.stats.get("finish_reason") == "shutdown", first.log[-2000:]
    state = load(ckpt)
    snaps, journals = generations(ckpt)
    assert state.snapshot_gen == snaps[-1] and not [g for g in journals if g >= snaps[-1]]
    assert not state.finished and state.requests, "a clean stop leaves a resumable snapshot"
    assert all(st == "p" for st, _, _ in state.requests.values())  # nothing in flight after a clean stop
    assert state.dropped == 0
    server_before = fetched_pages(server.truth())

    second = run_to_end(server, cfg, tmp_path / "r2")
    assert second.returncode == 0, second.log[-3000:]
    assert second.stats["openclaw/checkpoint/restored"] == len(state.requests)
    fetched = fetched_pages(server.truth())
    assert {it["url"] for it in items_of(items)} >= reachable
    # a clean stop re-fetches nothing
    assert all(n == 1 for n in fetched.values()), {u: n for u, n in fetched.items() if n > 1}
    assert len(server_before) < len(fetched)
    assert load(ckpt).finished


def test_finished_dir_starts_clean_and_restart_flag(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=15, latency=0.0, hosts=1))
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(ckpt, items)
    first = run_to_end(server, cfg, tmp_path / "r1")
    assert first.returncode == 0 and load(ckpt).finished
    n_items = len(items_of(items))
    second = run_to_end(server, cfg, tmp_path / "r2")
    assert "holds a finished crawl" in second.log
    assert len(items_of(items)) == 2 * n_items  # a new crawl from the start
    # an unfinished checkpoint + OPENCLAW_CHECKPOINT_RESTART: starts over
    cfg_slow = settings(ckpt, items, CONCURRENT_REQUESTS=1, DOWNLOAD_DELAY=0.2)
    proc = start_crawl(settings=cfg_slow, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "r3")
    assert wait_for(lambda: len(items_of(items)) >= 2 * n_items + 3, 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert not load(ckpt).finished
    third = run_to_end(server, {**cfg, "OPENCLAW_CHECKPOINT_RESTART": True}, tmp_path / "r4")
    assert "discarding the checkpoint" in third.log and "Resuming crawl" not in third.log
    assert third.stats["item_scraped_count"] == n_items


def test_corrupted_checkpoint_files_are_survived(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=40, latency=0.1, hosts=1))
    reachable = server.reachable().ok
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(ckpt, items, CONCURRENT_REQUESTS=2, OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=0.5)
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "r1")
    assert wait_for(lambda: len(items_of(items)) >= 12, 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    snaps, journals = generations(ckpt)
    assert snaps, "a snapshot was written before the kill"
    # truncate the newest snapshot, and tear + corrupt the newest journal
    newest = snapshot_path(ckpt, snaps[-1])
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    journal = ckpt / f"journal-{journals[-1]:08d}.log"
    with open(journal, "ab") as f:
        f.write(b'0badc0de a 99999 p - {"url": "http://127.0.0.2:1/x"')  # torn, no newline
    result = run_to_end(server, cfg, tmp_path / "r2")
    assert result.returncode == 0, result.log[-3000:]
    assert "skipped damaged snapshot" in result.log
    assert "dropped 1 damaged journal records" in result.log
    assert {it["url"] for it in items_of(items)} >= reachable


def test_unserialisable_meta_reported_at_enqueue(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=5, latency=0.0, hosts=1))
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(ckpt, items)
    proc = start_crawl(
        spider="test_checkpoint_crawl.BadMetaSpider",
        settings=cfg,
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "r1",
    )
    proc.wait(60)
    result = read_result(tmp_path / "r1", proc.returncode)
    assert result.returncode == 0, result.log[-3000:]
    assert "Checkpoint cannot save a request" in result.log
    assert "['meta']['handle']" in result.log and server.start_urls[0].rstrip("/") in result.log
    assert result.stats["openclaw/checkpoint/unserializable"] >= 1


@pytest.mark.parametrize(
    "queue",
    [None, "scrapy_openclaw.pqueues.DeadlinePriorityQueue"],
    ids=["scrapy-queue-delayed-requests", "deadline-queue"],
)
def test_kill9_while_retries_wait_loses_none(chaos_server: Any, tmp_path: Path, queue: str | None) -> None:
    """Retries waiting out their backoff (held by DelayedRequests, or in our queue's timer
    heap) are live requests too: killed mid-wait, the resumed crawl fetches each retry once."""
    pages = 10
    server = chaos_server(
        ChaosConfig(
            hosts=(
                HostConfig(
                    address="127.0.0.2",
                    pages=pages,
                    links_per_page="all",
                    status_script={p: (503, 200) for p in range(1, pages)},
                ),
            )
        )
    )
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(
        ckpt,
        items,
        RETRY_ENABLED=True,
        CONCURRENT_REQUESTS=4,
        DOWNLOADER_MIDDLEWARES={
            "scrapy_openclaw.retry.ClassifiedRetryMiddleware": 550,
            "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
        },
        OPENCLAW_POLICY={
            "defaults": {
                "retry": {
                    "protocol_retryable": {"base_delay": 5.0, "max_delay": 5.0, "jitter": "none"},
                    "budget_min_retries": 1000,
                }
            }
        },
    )
    if queue:
        cfg["SCHEDULER_PRIORITY_QUEUE"] = queue
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=tmp_path / "r1")

    def statuses() -> dict[str, int]:
        return server.truth(include_requests=False)["hosts"]["127.0.0.2"]["statuses"]

    def retries_on_disk() -> int:
        """Live requests the checkpoint on disk holds as retries (their meta carries retry state)."""
        return sum('"openclaw_retry"' in data for _st, data, _fp in load(ckpt).requests.values())

    assert wait_for(lambda: statuses().get("503", 0) >= pages - 1 or proc.poll() is not None, 30)
    # the waiting retries are on disk (an event: the journal read back, not a wait for a batch)
    assert wait_for(lambda: retries_on_disk() >= pages - 1 or proc.poll() is not None, 30)
    assert proc.poll() is None and statuses().get("200", 0) == 1, "killed while every retry waits"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)

    final = run_to_end(server, cfg, tmp_path / "r2")
    assert final.returncode == 0, final.log[-3000:]
    assert final.stats.get("openclaw/checkpoint/restored", 0) >= pages - 1, final.log[-6000:]
    assert {it["url"] for it in items_of(items)} >= server.reachable().ok
    truth = server.truth()["hosts"]["127.0.0.2"]
    for page in range(1, pages):
        # the first attempt finished before the kill; only its waiting retry was restored
        assert [r["status"] for r in truth["requests"] if r["path"] == f"/page/{page}"] == [503, 200]
    assert load(ckpt).finished


def test_requests_vetoed_before_the_queue_are_not_kept(chaos_server: Any, tmp_path: Path) -> None:
    """An offsite link never enters the scheduler: the checkpoint must not keep it as live
    (it would be re-injected by every resume, and a finished crawl would look unfinished)."""
    server = chaos_server(site(pages=10, latency=0.0, hosts=1))
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    proc = start_crawl(
        spider="test_checkpoint_crawl.OffsiteLinkSpider",
        settings=settings(ckpt, items),
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "r1",
    )
    proc.wait(60)
    result = read_result(tmp_path / "r1", proc.returncode)
    assert result.returncode == 0, result.log[-3000:]
    assert result.stats.get("offsite/filtered", 0) >= 1, "the offsite filter saw the link"
    assert "still recorded as live" not in result.log
    state = load(ckpt)
    assert state.finished and not state.requests


def test_resume_without_a_callback_dead_letters_and_stays_resumable(chaos_server: Any, tmp_path: Path) -> None:
    server = chaos_server(site(pages=60, latency=0.2, hosts=1))
    ckpt, items, dead = tmp_path / "ckpt", tmp_path / "items.jsonl", tmp_path / "dead.jsonl"
    cfg = settings(
        ckpt,
        items,
        CONCURRENT_REQUESTS=2,
        OPENCLAW_DLQ_URI=str(dead),
        ITEM_PIPELINES={
            "scrapy_openclaw.testing.pipelines.FlushedItemsPipeline": 100,
            "scrapy_openclaw.dlq.DeadLetterPipeline": 200,
        },
    )
    proc = start_crawl(
        spider="test_checkpoint_crawl.CallbackSpider",
        settings=cfg,
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "r1",
    )
    assert wait_for(lambda: len(items_of(items)) >= 4, 60)

    def on_disk() -> bool:  # (the journal read back: a request with its callback is on disk)
        return any(json.loads(data).get("callback") == "parse_page" for _st, data, _fp in load(ckpt).requests.values())

    assert wait_for(on_disk, 30)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert any(json.loads(data).get("callback") == "parse_page" for _st, data, _fp in load(ckpt).requests.values())

    proc = start_crawl(
        spider="test_checkpoint_crawl.CallbackGoneSpider",
        settings=cfg,
        spider_args={"start_urls": server.start_urls},
        out_dir=tmp_path / "r2",
    )
    proc.wait(90)
    result = read_result(tmp_path / "r2", proc.returncode)
    assert result.returncode == 0, result.log[-3000:]
    lost = result.stats["openclaw/checkpoint/unrestorable"]
    assert lost >= 1
    letters = [json.loads(line) for line in dead.read_text(encoding="utf-8").splitlines()]
    mine = [d for d in letters if d.get("reason") == "checkpoint_unrestorable"]
    assert len(mine) == lost and all(d["request"]["callback"] == "parse_page" for d in mine)
    assert "ERROR: Checkpoint: cannot restore request" in result.log
    assert "the checkpoint stays resumable" in result.log
    state = load(ckpt)
    assert not state.finished and len(state.requests) == lost  # kept: a run with the callback restores them


@pytest.mark.crawl  # runs a crawl or a subprocess
def test_jobdir_is_refused(tmp_path: Path) -> None:
    proc = start_crawl(
        settings={
            "OPENCLAW_CHECKPOINT_DIR": str(tmp_path / "c"),
            "JOBDIR": str(tmp_path / "c"),
            "EXTENSIONS": {"scrapy_openclaw.checkpoint.CheckpointExtension": 10},
        },
        spider_args={"start_urls": "http://127.0.0.1:9/"},
        out_dir=tmp_path / "r",
    )
    proc.wait(60)
    result = read_result(tmp_path / "r", proc.returncode)
    assert "cannot be combined with OPENCLAW_CHECKPOINT_DIR" in result.log


# a spider importable by the subprocess (this file is on its PYTHONPATH)
try:
    from scrapy_openclaw.testing.spiders import ChaosSpider
except ImportError:  # pragma: no cover
    ChaosSpider = None  # type: ignore[assignment,misc]

if ChaosSpider is not None:

    class BadMetaSpider(ChaosSpider):
        name = "badmeta"

        async def start(self):  # type: ignore[override]
            import scrapy

            for url in self.start_urls:
                yield scrapy.Request(url, meta={"handle": object()}, callback=self.parse)

    class CallbackSpider(ChaosSpider):
        """Follows links with ``parse_page``; :class:`CallbackGoneSpider` is the same spider without it."""

        name = "callback"

        def parse(self, response):  # type: ignore[no-untyped-def]
            for request in super().parse(response):
                if hasattr(request, "callback"):
                    request = request.replace(callback=self.parse_page)
                yield request

        def parse_page(self, response):  # type: ignore[no-untyped-def]
            yield from self.parse(response)

    class CallbackGoneSpider(ChaosSpider):
        name = "callback"

    class OffsiteLinkSpider(ChaosSpider):
        name = "offsitelink"
        allowed_domains = ["127.0.0.2"]

        def parse(self, response):  # type: ignore[no-untyped-def]
            import scrapy

            yield scrapy.Request("http://offsite.invalid/elsewhere", callback=self.parse)
            yield from super().parse(response)
