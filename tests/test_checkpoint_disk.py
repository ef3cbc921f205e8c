"""A checkpoint and durable feed whose disk fills up or turns read-only mid-crawl.

The crawl must stop with one error naming the path and the space left (no
error per commit, no traceback), and a resume once the disk takes writes
again must leave every reachable page in the feed exactly once (judged by the
chaos site's own record). Disk full is a small tmpfs filled by a ballast file
(as root) and a file size limit, RLIMIT_FSIZE, in the crawl's process (any
user). Read-only is a tmpfs remounted read-only (as root: root ignores mode
bits) or the directory's mode 0500 (any other user).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scrapy_openclaw.testing.crawl import read_result, start_crawl
from tests.test_feeds_exactly_once import jsonl_lines, served_pages, settings, site, wait_for

ROOT = os.geteuid() == 0 if hasattr(os, "geteuid") else False
ERROR_LINE = "stopping the crawl. Free space"


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs (root only), unmounted after the test."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root; the RLIMIT_FSIZE and mode-0500 cases cover other users")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(directory: Path) -> Path:
    """Write a ballast file until the filesystem is full; its path (delete it to free the space)."""
    ballast = directory / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return ballast


def _config(ckpt: Path, feed: Path, **extra: Any) -> dict[str, Any]:
    return settings(ckpt, {str(feed): {"format": "jsonlines"}}, **extra)


def _stopped_once(result: Any, path_part: str) -> None:
    """The crawl closed on the refused write with one error line naming the path, and nothing else."""
    assert result.stats.get("finish_reason") == "checkpoint_unwritable", result.log[-3000:]
    errors = [line for line in result.log.splitlines() if " ERROR: " in line or " CRITICAL: " in line]
    assert len(errors) == 1, "\n".join(errors[:10])
    assert ERROR_LINE in errors[0] and path_part in errors[0], errors[0]
    assert "Traceback" not in result.log
    assert result.stats.get("log_count/ERROR") == 1


def _resume_exactly_once(server: Any, cfg: dict[str, Any], feed: Path, out: Path) -> None:
    cfg = dict(cfg, LOG_LEVEL="INFO")
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out)
    proc.wait(120)
    final = read_result(out, proc.returncode)
    assert final.returncode == 0 and final.stats.get("finish_reason") == "finished", final.log[-3000:]
    assert "Resuming crawl" in final.log
    urls = [item["url"] for item in jsonl_lines(feed)]
    reachable = server.reachable().ok
    assert served_pages(server) == reachable
    twice = sorted({u for u in urls if urls.count(u) > 1})
    assert not twice, f"{len(twice)} item(s) written twice: {twice[:5]}"
    assert set(urls) == reachable, f"lost: {sorted(reachable - set(urls))[:5]}"


def _crawl_until(server: Any, cfg: dict[str, Any], feed: Path, out: Path, act: Any) -> Any:
    """Start a crawl, run *act* once the feed has items, wait for the crawl to end; its result."""
    proc = start_crawl(settings=cfg, spider_args={"start_urls": server.start_urls}, out_dir=out)
    try:
        assert wait_for(lambda: len(jsonl_lines(feed)) >= 10 or proc.poll() is not None, 60)
        assert proc.poll() is None, "the crawl ended before the disk was taken away"
        act()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return read_result(out, proc.returncode)


def test_a_full_disk_stops_the_crawl_once_and_a_resume_after_freeing_it_loses_nothing(
    chaos_server: Any, tmpfs: Path, tmp_path: Path
) -> None:
    server = chaos_server(site(pages=150, latency=0.05).to_dict())
    ckpt, feed = tmpfs / "ckpt", tmpfs / "items.jsonl"
    cfg = _config(ckpt, feed)
    ballast: list[Path] = []
    result = _crawl_until(server, cfg, feed, tmp_path / "run0", lambda: ballast.append(_fill(tmpfs)))
    _stopped_once(result, str(tmpfs))
    assert "No space left on device" in result.log and "free of" in result.log
    assert len(jsonl_lines(feed)) < len(server.reachable().ok)
    ballast[0].unlink()  # space freed
    _resume_exactly_once(server, cfg, feed, tmp_path / "run1")


def test_a_file_size_limit_stops_the_crawl_once_and_a_resume_without_it_loses_nothing(
    chaos_server: Any, tmp_path: Path
) -> None:
    """RLIMIT_FSIZE in the crawl's process (SIGXFSZ ignored, so a write past it fails with EFBIG)."""
    server = chaos_server(site(pages=150, latency=0.05).to_dict())
    ckpt, feed = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = _config(ckpt, feed, LOG_LEVEL="WARNING")  # (the log file is limited too)
    proc = _limited_crawl(server, cfg, tmp_path / "run0", limit=12_000)
    proc.wait(120)
    result = read_result(tmp_path / "run0", proc.returncode)
    _stopped_once(result, str(tmp_path))
    assert "File too large" in result.log and "RLIMIT_FSIZE" in result.log
    _resume_exactly_once(server, cfg, feed, tmp_path / "run1")


def _limited_crawl(server: Any, cfg: dict[str, Any], out: Path, limit: int) -> subprocess.Popen[bytes]:
    """``runcrawl`` under a file size limit, through a wrapper that sets it and then runs the module."""
    import json

    from scrapy_openclaw.testing.servers import subprocess_env

    out.mkdir(parents=True)
    (out / "settings.json").write_text(json.dumps(cfg), encoding="utf-8")
    wrapper = (
        "import resource, runpy, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
        "sys.argv = ['runcrawl'] + sys.argv[1:]; runpy.run_module('scrapy_openclaw.testing.runcrawl', "
        "run_name='__main__')"
    )
    args = [sys.executable, "-c", wrapper, "--spider", "scrapy_openclaw.testing.spiders.ChaosSpider"]
    args += ["--settings-json", str(out / "settings.json"), "--out", str(out)]
    args += ["-a", "start_urls=" + ",".join(server.start_urls)]
    return subprocess.Popen(args, env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_checkpoint_directory_that_turns_read_only_stops_the_crawl_once_and_resumes(
    chaos_server: Any, tmp_path: Path
) -> None:
    """As root: a read-only bind mount over the directory (root ignores mode bits, and a remount
    of the whole filesystem is refused while the crawl has files open); otherwise: mode 0500.
    Either way the files already open stay writable and the next new one (a snapshot, the next
    journal) is refused."""
    server = chaos_server(site(pages=150, latency=0.05).to_dict())
    feed, ckpt = tmp_path / "items.jsonl", tmp_path / "ckpt"
    mounted: list[bool] = []
    if ROOT:

        def take() -> None:
            # A file the crawl opens for writing through the new mount between the bind and the
            # remount keeps the mount busy (EBUSY, as .ci/run once met): detach it and bind again.
            for _ in range(20):
                subprocess.run(["mount", "--bind", str(ckpt), str(ckpt)], check=True)
                mounted.append(True)
                remount = subprocess.run(["mount", "-o", "remount,bind,ro", str(ckpt)], capture_output=True, text=True)
                if remount.returncode == 0:
                    return
                subprocess.run(["umount", "-l", str(ckpt)], check=False)
                mounted.clear()
                time.sleep(0.05)
            raise AssertionError(f"could not make {ckpt} read-only: {remount.stderr}")

        def give() -> None:
            subprocess.run(["umount", str(ckpt)], check=True)
            mounted.clear()

    else:

        def take() -> None:
            ckpt.chmod(0o500)

        def give() -> None:
            ckpt.chmod(0o700)

    cfg = _config(ckpt, feed)
    try:
        result = _crawl_until(server, cfg, feed, tmp_path / "run0", take)
        _stopped_once(result, str(ckpt))
        assert ("Read-only file system" if ROOT else "Permission denied") in result.log
        give()
        _resume_exactly_once(server, cfg, feed, tmp_path / "run1")
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ckpt)], check=False)


def test_a_directory_turning_read_only_between_a_snapshot_and_its_cleanup_is_one_refusal(tmp_path: Path) -> None:
    """Found by the suite loop beside two CPU hogs: a background snapshot written just before the
    directory turned read-only, collected just after, could not delete the older generation, and
    the unlink's error escaped into the reactor. It is a refused write like the others now."""
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.checkpoint.snapshot import write_snapshot
    from scrapy_openclaw.checkpoint.snapshotter import Snapshotter
    from scrapy_openclaw.checkpoint.state import snapshot_path

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    mounted: list[bool] = []

    def write_then_turn_read_only(path: Path, *args: Any) -> int:
        size = write_snapshot(path, *args)
        if path.name == snapshot_path(ckpt, 3).name:
            if ROOT:
                subprocess.run(["mount", "--bind", str(ckpt), str(ckpt)], check=True)
                mounted.append(True)
                subprocess.run(["mount", "-o", "remount,bind,ro", str(ckpt)], check=True)
            else:
                ckpt.chmod(0o500)
        return size

    refused: list[tuple[Path, OSError]] = []
    snapshotter = Snapshotter(ckpt, MemoryStatsCollector(get_crawler()), write_then_turn_read_only, None)
    snapshotter.on_refused = lambda path, exc: refused.append((Path(path), exc))
    try:
        for gen in (1, 2, 3):  # the third one's cleanup (gen 1) meets the read-only directory
            assert snapshotter.write(gen, {"gen": gen}, [], [], background=False)
        [(path, exc)] = refused
        assert path == snapshot_path(ckpt, 1) and exc.errno in (errno.EROFS, errno.EACCES), (path, exc)
        assert snapshot_path(ckpt, 1).exists() and snapshot_path(ckpt, 3).exists()  # left behind, not lost
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ckpt)], check=False)
        ckpt.chmod(0o700)
