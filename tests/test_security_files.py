"""A hostile local user who plants symlinks or opens up directories: the crawl's files are
never redirected, directories too open are tightened or refused, and what cannot be stored
is never dumped whole into the log."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from test_checkpoint_crawl import settings
from test_dlq_crawl import dlq_settings
from test_feeds_exactly_once import DURABLE_EXTENSIONS
from test_first_hour_errors import refused

from scrapy_openclaw._files import check_dir, private_dir
from scrapy_openclaw.checkpoint.restore import open_directory
from scrapy_openclaw.checkpoint.state import journal_path
from scrapy_openclaw.dlq.snapshots import _write
from scrapy_openclaw.exceptions import OpenClawConfigError, UnsafeDirectory
from scrapy_openclaw.testing.crawl import run_crawl
from tests.first_hour_project import start_project

SECRET = "Bearer s3cr3t-hdr-77"
TOKEN = "tok-9q8w7e"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    return victim


def test_a_symlink_planted_at_the_checkpoint_dir_is_refused_naming_the_setting(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "ckpt").symlink_to(victim)
    with pytest.raises(OpenClawConfigError, match=r"^setting OPENCLAW_CHECKPOINT_DIR: .*ckpt is a symlink") as err:
        open_directory(tmp_path / "ckpt", restart=False, notes=[])
    assert "\n" not in str(err.value)
    assert list(victim.iterdir()) == []  # not even the lock file went through


def test_a_symlink_at_the_snapshot_dir_is_refused(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    (tmp_path / "snaps").symlink_to(victim)
    with pytest.raises(UnsafeDirectory, match="setting OPENCLAW_SNAPSHOT_DIR: .*snaps is a symlink"):
        _write(tmp_path / "snaps", {"signature": ["a"], "content_hash": "0" * 64}, b"body", "0" * 64)
    assert list(victim.iterdir()) == []


def test_too_open_directories_are_tightened_when_ours_and_refused_when_not(tmp_path: Path, caplog: Any) -> None:
    ours = tmp_path / "ours"
    ours.mkdir()
    ours.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        private_dir(ours, setting="OPENCLAW_CHECKPOINT_DIR")
    assert _mode(ours) == 0o700
    assert "writable by others (mode 0777); tightened to 0700" in caplog.text
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o777)
    if os.getuid() != 0:
        pytest.skip("needs root to make a directory owned by someone else")  # pragma: no cover
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafeDirectory, match="writable by others .* owned by uid 65534, not this user"):
        check_dir(theirs, setting="OPENCLAW_DLQ_URI")
    assert _mode(theirs) == 0o777  # someone else's: left alone
    sticky = tmp_path / "shared-tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)  # /tmp-like, root's: files in it are ours alone
    check_dir(sticky)
    assert _mode(sticky) == 0o1777 or os.getuid() == 0


def test_a_dangling_journal_symlink_is_one_clear_line(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    journal_path(ckpt, 0).symlink_to(tmp_path / "nowhere")
    with pytest.raises(OpenClawConfigError) as err:
        open_directory(ckpt, restart=False, notes=[])
    text = str(err.value)
    assert text.startswith("setting OPENCLAW_CHECKPOINT_DIR: cannot read the checkpoint in")
    assert "journal-00000000.log is a symlink" in text and "\n" not in text
    assert not (tmp_path / "nowhere").exists()


def test_scrapy_crawl_refuses_a_planted_checkpoint_in_one_line(tmp_path: Path) -> None:
    """``scrapy crawl`` itself: one error line naming the setting, exit 1, no traceback."""
    root = start_project(tmp_path)
    ckpt = root / "ckpt"
    ckpt.mkdir(mode=0o700)
    journal_path(ckpt, 0).symlink_to(tmp_path / "nowhere")
    message = refused(("crawl", "plain", "-s", "OPENCLAW_CHECKPOINT_DIR=ckpt"), root)
    assert message == (
        f"setting OPENCLAW_CHECKPOINT_DIR: cannot read the checkpoint in {ckpt}: "
        f"{journal_path(ckpt, 0)} is a symlink (refused: files are never opened through one)"
    )
    ckpt.rename(tmp_path / "old-ckpt")  # (it holds the lock file now)
    ckpt.symlink_to(_victim(tmp_path))
    message = refused(("crawl", "plain", "-s", "OPENCLAW_CHECKPOINT_DIR=ckpt"), root)
    assert message.startswith(f"setting OPENCLAW_CHECKPOINT_DIR: {ckpt} is a symlink (refused")


def test_durable_feed_files_are_private_unless_a_mode_is_set(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 4, "links_per_page": 3}]})
    old = os.umask(0o022)
    try:
        for name, extra, expected in (("default", {}, 0o600), ("shared", {"OPENCLAW_FEED_FILE_MODE": 0o644}, 0o644)):
            feed = tmp_path / name / "items.jsonl"
            cfg = settings(tmp_path / name / "ckpt", tmp_path / name / "flushed.jsonl", **extra)
            cfg["FEEDS"] = {str(feed): {"format": "jsonlines"}}
            cfg["EXTENSIONS"] = dict(DURABLE_EXTENSIONS)
            result = run_crawl(settings=cfg, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / name)
            assert result.returncode == 0, result.log[-3000:]
            assert len(feed.read_text().splitlines()) >= 4  # every page (and / as page 0)
            assert _mode(feed) == expected, name
    finally:
        os.umask(old)


def test_a_dead_letter_file_symlink_is_never_followed(chaos_server: Any, tmp_path: Path) -> None:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 3, "not_found": [1]}]})
    victim = tmp_path / "victim.jsonl"
    victim.write_text("")
    victim.chmod(0o644)
    dlq_dir = tmp_path / "dlq"
    dlq_dir.mkdir(mode=0o700)
    (dlq_dir / "dead.jsonl").symlink_to(victim)
    result = run_crawl(
        settings=dlq_settings(str(dlq_dir / "dead.jsonl"), LOG_LEVEL="INFO"),
        spider_args={"start_urls": site.start_urls},
        out_dir=tmp_path / "r",
    )
    assert victim.read_text() == "" and _mode(victim) == 0o644
    assert "is a symlink (refused" in result.log


def test_a_dead_letter_that_cannot_be_stored_is_logged_masked(chaos_server: Any, tmp_path: Path) -> None:
    """The store fails for the whole crawl (its file is a directory): at close each dead letter
    is named by id, method and masked URL; no header, cookie or token reaches the log."""
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 3, "not_found": [1, 2]}]})
    (tmp_path / "dlq" / "dead.jsonl").mkdir(parents=True)
    urls = [f"{site.start_urls[0]}page/{n}?token={TOKEN}&id={n}" for n in (1, 2)]
    result = run_crawl(
        settings=dlq_settings(
            str(tmp_path / "dlq" / "dead.jsonl"),
            DEFAULT_REQUEST_HEADERS={"Authorization": SECRET, "Cookie": "sid=c00kie-v4l"},
            LOG_LEVEL="DEBUG",
        ),
        spider_args={"start_urls": ",".join(urls)},
        out_dir=tmp_path / "r",
    )
    lines = [line for line in result.log.splitlines() if "could not be stored in" in line]
    assert len(lines) == 2, result.log[-3000:]
    assert all("GET http://127.0.0.2" in line for line in lines)
    ours = "\n".join(line for line in result.log.splitlines() if "[scrapy_openclaw" in line)
    assert "could not be stored" in ours
    for secret in (SECRET, "s3cr3t", "c00kie-v4l", TOKEN):
        assert secret not in ours
    assert result.stats["openclaw/dlq/count"] == 2
