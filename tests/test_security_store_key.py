"""The store key: where it comes from, and a hostile writer of each store (checkpoint, dead letters,
Redis control stream) refused, counted and reported, never run."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
import redis
from scrapy import Request
from scrapy.settings import Settings
from test_checkpoint_crawl import items_of, settings, wait_for
from test_distributed import bench

from scrapy_openclaw.checkpoint import load
from scrapy_openclaw.checkpoint.journal import JournalWriter, read_journal
from scrapy_openclaw.checkpoint.records import CheckpointError, CheckpointVersionError
from scrapy_openclaw.checkpoint.state import journal_path
from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq import JsonlStore
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.serialization import dumps, request_to_data, signing
from scrapy_openclaw.settings import OpenClawSettings
from scrapy_openclaw.testing.crawl import read_result, run_crawl, start_crawl


@pytest.fixture
def key_scope(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Tests that configure another process key get the session's back afterwards."""
    saved = signing._spec, signing._key
    yield monkeypatch
    signing._spec, signing._key = saved


def _config(settings: dict[str, Any]) -> OpenClawSettings:
    return OpenClawSettings.read(Settings(settings))  # (not validated: resolve() checks the key)


def use(settings: dict[str, Any]) -> None:
    OpenClawSettings.from_settings(Settings(settings))  # (configures the process's key)


def test_the_project_key_file_is_generated_private_once(key_scope: Any, tmp_path: Path) -> None:
    key_scope.delenv("OPENCLAW_STORE_KEY")
    key_scope.chdir(tmp_path)
    (tmp_path / "scrapy.cfg").write_text("[settings]\ndefault = x\n")
    (tmp_path / "sub").mkdir()
    key_scope.chdir(tmp_path / "sub")  # resolved from the project root, whatever the directory
    first = signing.resolve()
    path = tmp_path / "openclaw-data" / "store.key"
    assert first.source == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert signing.resolve().secret == first.secret  # read back, not generated again
    path.chmod(0o640)
    with pytest.raises(OpenClawConfigError, match="private"):
        signing.resolve()
    path.unlink()
    os.symlink(tmp_path / "elsewhere", path)  # a planted symlink is never followed (nor created through)
    with pytest.raises(OSError, match="symlink"):
        signing.resolve()
    assert not (tmp_path / "elsewhere").exists()


def test_the_key_from_a_setting_or_the_variable_it_names(key_scope: Any) -> None:
    key_scope.setenv("MY_CRAWL_KEY", "k" * 20)
    assert signing.resolve(_config({"OPENCLAW_STORE_KEY_ENV": "MY_CRAWL_KEY"})).secret == b"k" * 20
    assert signing.resolve(_config({"OPENCLAW_STORE_KEY": "s" * 16})).source == "OPENCLAW_STORE_KEY"
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_STORE_KEY: a store key needs at least 16"):
        signing.resolve(_config({"OPENCLAW_STORE_KEY": "short"}))


def test_distributed_mode_refuses_to_start_without_a_shared_key(key_scope: Any, tmp_path: Path) -> None:
    key_scope.delenv("OPENCLAW_STORE_KEY")
    key_scope.chdir(tmp_path)
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_DISTRIBUTED=True needs a store key shared"):
        use({"OPENCLAW_DISTRIBUTED": True})
    assert not (tmp_path / "openclaw-data").exists()  # no per-worker key generated
    use({"OPENCLAW_DISTRIBUTED": True, "OPENCLAW_STORE_KEY": "x" * 32})
    assert signing.current().source == "OPENCLAW_STORE_KEY"


# --------------------------------------------------------------------------- checkpoint


def _req(url: str, **kw: Any) -> str:
    return dumps(request_to_data(Request(url, **kw)))


def _crc_line(payload: str) -> bytes:
    """A line as an older version wrote it (anyone can compute a CRC32)."""
    body = payload.encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def test_a_forged_checkpoint_line_is_refused_and_counted(tmp_path: Path) -> None:
    path = journal_path(tmp_path, 0)
    writer = JournalWriter(path, {"gen": 0, "crawl_id": "c1"})
    writer.append(f"a 1 p - {_req('http://a.test/own', meta={'proxy': 'http://u:p@127.0.0.1:3128'})}")
    assert writer.close()
    forged = _req("http://evil.test/", headers={"Authorization": "Basic eDp5"}, meta={"allow_offsite": True})
    with open(path, "ab") as f:
        f.write(_crc_line(f"a 2 p - {forged}"))
        f.write(b"0" * 32 + f" a 3 p - {forged}\n".encode())
    contents = read_journal(path)
    assert contents.refused == 2 and len(contents.payloads) == 1
    state = load(tmp_path)
    assert list(state.requests) == [1] and state.refused == 2
    assert json.loads(state.requests[1][1])["meta"]["proxy"] == "http://u:p@127.0.0.1:3128"  # trusted whole
    assert any("2 complete lines failed the store key check" in w for w in state.warnings)


def test_a_checkpoint_of_an_older_version_is_refused_with_advice(key_scope: Any, tmp_path: Path) -> None:
    path = journal_path(tmp_path, 0)
    header = json.dumps({"kind": "journal", "v": 2, "gen": 0, "crawl_id": "old"}, sort_keys=True)
    path.write_bytes(_crc_line(header) + _crc_line(f"a 1 p - {_req('http://a.test/1')}"))
    with pytest.raises(CheckpointVersionError, match="OPENCLAW_STORE_ACCEPT_UNSIGNED=True"):
        load(tmp_path)
    use({"OPENCLAW_STORE_ACCEPT_UNSIGNED": True})
    state = load(tmp_path)
    assert list(state.requests) == [1] and state.crawl_id == "old"


def test_a_checkpoint_sealed_with_another_key_is_a_clear_error(key_scope: Any, tmp_path: Path) -> None:
    use({"OPENCLAW_STORE_KEY": "a" * 32})
    JournalWriter(journal_path(tmp_path, 0), {"gen": 0}).close()
    use({"OPENCLAW_STORE_KEY": "b" * 32})
    with pytest.raises(CheckpointError, match="sealed with another store key"):
        load(tmp_path)


def test_a_forged_checkpoint_entry_is_never_fetched(chaos_server: Any, tmp_path: Path) -> None:
    """A hostile writer appends a request for the site (with an Authorization header) to a live
    checkpoint: the resumed crawl refuses it (counted), and the site never sees it."""
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 40, "links_per_page": 3, "latency": 0.1}]})
    ckpt, items = tmp_path / "ckpt", tmp_path / "items.jsonl"
    cfg = settings(ckpt, items, OPENCLAW_CHECKPOINT_SNAPSHOT_INTERVAL=60.0, CONCURRENT_REQUESTS=2)
    first = start_crawl(settings=cfg, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / "r1")
    assert wait_for(lambda: len(items_of(items)) >= 3, 30)
    first.kill()
    first.wait(10)
    journal = max(ckpt.glob("journal-*"))
    forged = _req(f"{site.start_urls[0]}forged", headers={"Authorization": "Basic eDp5"}, meta={"allow_offsite": 1})
    with open(journal, "ab") as f:
        f.write(_crc_line(f"a 999999 p - {forged}"))
        f.write(b"f" * 32 + f" a 999998 p - {forged}\n".encode())
    second = run_crawl(settings=cfg, spider_args={"start_urls": site.start_urls}, out_dir=tmp_path / "r2")
    assert second.returncode == 0, second.log[-3000:]
    assert second.stats["openclaw/checkpoint/refused"] == 2
    assert "failed the store key check" in second.log
    paths = [r["path"] for h in site.truth()["hosts"].values() for r in h["requests"]]
    assert "/forged" not in paths and paths


# --------------------------------------------------------------------------- dead letters


def test_an_unsigned_dead_letter_is_refused_unless_accepted(key_scope: Any, tmp_path: Path, caplog: Any) -> None:
    path = tmp_path / "dl.jsonl"
    own = DeadLetter(
        url="http://a.test/1", domain="a.test", error_class="network", reason="t", spider="s", crawl_id="c"
    )
    writer = JsonlStore(path)
    writer.append(own)
    writer.close()
    old = DeadLetter(
        url="http://a.test/2", domain="a.test", error_class="network", reason="t", spider="s", crawl_id="c"
    )
    data = old.to_dict()
    with open(path, "a", encoding="utf-8") as f:
        f.write(dumps({**data, "_crc": zlib.crc32(dumps(data).encode())}) + "\n")
    store = JsonlStore(path)
    with caplog.at_level(logging.WARNING):
        assert [r.url for r in store.iter()] == ["http://a.test/1"]
    assert store.refused == 1 and "OPENCLAW_STORE_ACCEPT_UNSIGNED=True" in caplog.text
    use({"OPENCLAW_STORE_ACCEPT_UNSIGNED": True})
    assert [r.url for r in JsonlStore(path).iter()] == ["http://a.test/1", "http://a.test/2"]


# --------------------------------------------------------------------------- control stream


def test_a_control_command_without_a_seal_is_not_run(chaos_server: Any, redis_server: Any, tmp_path: Path) -> None:
    site = chaos_server({"hosts": [{"address": "127.0.0.2", "pages": 40, "links_per_page": 3, "latency": 0.1}]})
    cfg = {
        **bench.ours(redis_server.url),
        "CONCURRENT_REQUESTS": 2,
        "OPENCLAW_CONTROL_TOKEN": "t" * 24,
        "OPENCLAW_CONTROL_POLL": 0.1,
    }
    worker = start_crawl(bench.SPIDER, cfg, {"start_urls": site.start_urls}, out_dir=tmp_path / "w0")
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert wait_for(lambda: client.llen("chaos:items") >= 3, 30)
        time.sleep(0.5)  # the worker reads the stream from its end: sent after it started
        for n in range(50):
            command = json.dumps({"command": "close", "reason": "attacker"})
            client.xadd("chaos:control", {"command": command, "who": "attacker", "origin": "x", "at": str(n)})
        worker.wait(120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    result = read_result(tmp_path / "w0", worker.returncode)
    assert result.stats["finish_reason"] == "finished", result.log[-3000:]
    assert result.stats["openclaw/control/refused"] == 50
    assert result.log.count("without a valid store key seal") == 1  # condensed
    assert "by attacker" not in result.log
    assert client.llen("chaos:items") == len(site.reachable().ok)
