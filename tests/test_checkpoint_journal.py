"""Unit tests of the checkpoint files: journal, snapshot, recovery, CLI helpers."""

from __future__ import annotations

import argparse
import errno
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_openclaw.checkpoint import (
    FORMAT_VERSION,
    CheckpointExtension,
    CheckpointVersionError,
    CorruptSnapshot,
    JournalWriter,
    load,
    read_journal,
    read_snapshot,
    write_snapshot,
)
from scrapy_openclaw.checkpoint.journal import decode_line, encode_line
from scrapy_openclaw.checkpoint.state import journal_path, snapshot_path
from scrapy_openclaw.commands.checkpoint import Command, inspect_dir, verify_dir
from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.serialization import dumps, request_to_data


def _journal(path: Path, payloads: list[str]) -> None:
    writer = JournalWriter(path, {"gen": 0, "crawl_id": "c1"})
    writer.extend(payloads)
    assert writer.close()


def _req(url: str) -> str:
    return dumps(request_to_data(Request(url)))


def test_record_checksum_roundtrip_and_bitflip() -> None:
    line = encode_line("a 1 p - {}")
    assert decode_line(line) == "a 1 p - {}"
    flipped = bytearray(line)
    flipped[12] ^= 0x01
    assert decode_line(bytes(flipped)) is None
    assert decode_line(line[:-1]) is None  # torn: no newline


def test_journal_torn_tail_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "journal-00000000.log"
    _journal(path, [f"a {i} p - {_req(f'http://a.example/{i}')}" for i in range(1, 6)])
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # cut the last record mid-write
    contents = read_journal(path)
    assert contents.version == FORMAT_VERSION
    assert len(contents.payloads) == 4
    assert contents.torn_tail == 1 and contents.corrupt == 0


def test_journal_corrupt_record_mid_file_skips_only_it(tmp_path: Path) -> None:
    path = tmp_path / "journal-00000000.log"
    _journal(path, ["s " + "aa" * 20, "s " + "bb" * 20, "s " + "cc" * 20])
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"bb", b"bx", 1)
    path.write_bytes(b"".join(lines))
    contents = read_journal(path)
    assert contents.payloads == ["s " + "aa" * 20, "s " + "cc" * 20]
    assert contents.corrupt == 1 and contents.torn_tail == 0


def test_journal_write_failure_keeps_records_for_retry(tmp_path: Path, caplog: Any) -> None:
    path = tmp_path / "journal-00000000.log"
    writer = JournalWriter(path, {"gen": 0})
    writer.append("s " + "aa" * 20)
    real_fd = writer._fd
    import os

    writer._fd = os.open("/dev/full", os.O_WRONLY)  # a disk that is full: ENOSPC
    with caplog.at_level(logging.ERROR):
        assert writer.flush() is False
    assert "cannot write 1 records" in caplog.text
    assert writer.buffered == 1
    os.close(writer._fd)
    writer._fd = real_fd  # space again: the records go out at the next flush
    assert writer.flush() and writer.buffered == 0
    writer.close()
    assert read_journal(path).payloads == ["s " + "aa" * 20]


def _write_snap(path: Path, n: int = 3, opener: Any = None) -> int:
    requests = [(i, "p", _req(f"http://a.example/{i}")) for i in range(1, n + 1)]
    fps = {i.to_bytes(20, "big") for i in range(n)}
    header = {"gen": 1, "crawl_id": "c1", "next_id": n + 1}
    return write_snapshot(path, header, requests, fps, opener=opener)


def test_snapshot_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "snapshot-00000001.ckpt"
    assert _write_snap(path, 5) > 0
    snap = read_snapshot(path)
    assert [r[0] for r in snap.requests] == [1, 2, 3, 4, 5]
    assert json.loads(snap.requests[0][2])["url"] == "http://a.example/1"
    assert len(snap.fingerprints) == 5 and snap.header["crawl_id"] == "c1"
    assert not list(tmp_path.glob("*.tmp"))


def test_truncated_snapshot_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "snapshot-00000001.ckpt"
    _write_snap(path, 50)
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))  # whole lines but no end record
    with pytest.raises(CorruptSnapshot, match="no end record"):
        read_snapshot(path)
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptSnapshot, match="truncated"):
        read_snapshot(path)


def test_version_mismatch_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "snapshot-00000001.ckpt"
    path.write_bytes(encode_line(json.dumps({"kind": "snapshot", "v": FORMAT_VERSION + 1})))
    with pytest.raises(CheckpointVersionError, match="OPENCLAW_CHECKPOINT_RESTART"):
        read_snapshot(path)
    with pytest.raises(CheckpointVersionError):
        load(tmp_path)


def test_a_version_1_journal_is_read_and_a_newer_one_refused(tmp_path: Path) -> None:
    """Version 2 added the ``D`` record, which a version 1 reader skipped without a word (it
    would fetch again pages whose items a durable feed already holds): version 2 files stop
    such a reader with a clear error, and this one still reads what version 1 wrote."""
    assert FORMAT_VERSION == 3
    path = journal_path(tmp_path, 0)
    _journal(path, [f"a 1 p - {_req('http://a.example/1')}", f"a 2 p - {_req('http://a.example/2')}", "d 1"])
    lines = path.read_bytes().splitlines(keepends=True)
    header = json.loads(decode_line(lines[0]) or "")
    assert header["v"] == 3
    path.write_bytes(encode_line(json.dumps({**header, "v": 1}, sort_keys=True)) + b"".join(lines[1:]))
    assert read_journal(path).version == 1
    assert list(load(tmp_path).requests) == [2]
    for version in (4, True, "3"):
        path.write_bytes(encode_line(json.dumps({**header, "v": version}, sort_keys=True)) + b"".join(lines[1:]))
        with pytest.raises(CheckpointVersionError, match="reads versions 1-3"):
            read_journal(path)


@pytest.mark.crawl  # runs a crawl or a subprocess
def test_disk_full_during_snapshot_keeps_previous(tmp_path: Path) -> None:
    path = tmp_path / "snapshot-00000001.ckpt"
    _write_snap(path, 2)
    before = path.read_bytes()

    def full_disk(tmp: Path) -> Any:
        tmp.write_bytes(b"partial")  # the temp file exists, then the disk fills up
        return open("/dev/full", "wb")

    with pytest.raises(OSError) as info:
        _write_snap(path, 20000, opener=full_disk)
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.tmp"))


def test_recovery_falls_back_to_previous_snapshot_and_replays(tmp_path: Path) -> None:
    # gen 1 snapshot with requests 1..3; journal 1 adds 4, finishes 1; gen 2 snapshot damaged
    _write_snap(snapshot_path(tmp_path, 1), 3)
    _journal(journal_path(tmp_path, 1), [f"a 4 p {'dd' * 20} {_req('http://b.example/4')}", "f 2", "d 1"])
    snapshot_path(tmp_path, 2).write_bytes(b"garbage\n")
    state = load(tmp_path)
    assert state.snapshot_gen == 1 and state.bad_snapshots
    assert sorted(state.requests) == [2, 3, 4]
    assert state.requests[2][0] == "f"
    assert bytes.fromhex("dd" * 20) in state.fingerprints
    assert state.next_id == 5 and state.next_generation == 3
    info = inspect_dir(tmp_path)
    assert info["pending"] == 2 and info["in_flight"] == 1
    assert info["pending_by_domain"] == {"a.example": 2, "b.example": 1}
    ok, lines = verify_dir(tmp_path)
    assert not ok and any("DAMAGED  snapshot-00000002.ckpt" in line for line in lines)


def test_verify_command_exit_codes(tmp_path: Path, capsys: Any) -> None:
    _write_snap(snapshot_path(tmp_path, 1), 3)
    command = Command()
    command.settings = Settings()  # (scrapy sets the project's before run)
    command.run(["verify", str(tmp_path)], argparse.Namespace(json=False))
    assert getattr(command, "exitcode", 0) == 0
    path = snapshot_path(tmp_path, 1)
    raw = bytearray(path.read_bytes())
    raw[40] ^= 0x04
    path.write_bytes(bytes(raw))
    command = Command()
    command.settings = Settings()  # (scrapy sets the project's before run)
    command.run(["verify", str(tmp_path)], argparse.Namespace(json=False))
    assert command.exitcode == 1
    assert "checkpoint DAMAGED" in capsys.readouterr().out


class _Spider(Spider):
    name = "unit"

    def parse(self, response: Any) -> None:
        pass


def test_extension_off_without_dir_and_refuses_jobdir(tmp_path: Path) -> None:
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.misc import build_from_crawler

    with pytest.raises(NotConfigured):
        build_from_crawler(CheckpointExtension, get_crawler(_Spider))
    crawler = get_crawler(_Spider, {"OPENCLAW_CHECKPOINT_DIR": str(tmp_path / "c"), "JOBDIR": str(tmp_path / "j")})
    with pytest.raises(OpenClawConfigError, match="JOBDIR"):
        build_from_crawler(CheckpointExtension, crawler)


def test_extension_restores_crawl_id_and_locks_dir(tmp_path: Path) -> None:
    from scrapy.utils.misc import build_from_crawler

    from scrapy_openclaw.settings import crawl_id

    _write_snap(snapshot_path(tmp_path, 1), 2)
    crawler = get_crawler(_Spider, {"OPENCLAW_CHECKPOINT_DIR": str(tmp_path)})
    ext = build_from_crawler(CheckpointExtension, crawler)
    assert crawl_id(crawler) == "c1" and ext.resumed
    assert ext.pending_by_domain() == {"a.example": 2}
    with pytest.raises(OpenClawConfigError, match="another running crawl"):
        build_from_crawler(CheckpointExtension, get_crawler(_Spider, {"OPENCLAW_CHECKPOINT_DIR": str(tmp_path)}))
    ext.writer.journal.close()


def _extension_with_requests(tmp_path: Path, n: int) -> Any:
    from scrapy.utils.misc import build_from_crawler

    ext = build_from_crawler(CheckpointExtension, get_crawler(_Spider, {"OPENCLAW_CHECKPOINT_DIR": str(tmp_path)}))
    for i in range(n):
        ext._new_request(Request(f"http://a.example/{i}"))
    assert ext.writer.commit()
    return ext


def test_background_snapshot_writes_in_a_thread_while_the_journal_moves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from scrapy_openclaw.checkpoint import extension as module

    ext = _extension_with_requests(tmp_path, 500)
    gate, writers = threading.Event(), []
    real = module.write_snapshot

    def held_write(*args: Any, **kwargs: Any) -> int:
        writers.append(threading.current_thread())
        assert gate.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "write_snapshot", held_write)
    gen_before = ext.writer.gen
    assert ext.writer.snapshot(background=True)
    assert ext.writer.writing and ext.writer.gen == gen_before + 1
    # the crawl goes on while the file is written: new records land in the new generation
    ext._new_request(Request("http://a.example/late"))
    assert ext.writer.commit()
    midway = load(tmp_path)  # a crash now: the previous state plus both journals
    assert len(midway.requests) == 501 and midway.snapshot_gen is None
    gate.set()
    ext.writer.join()
    assert writers and writers[0] is not threading.main_thread()
    assert not ext.writer.writing and ext.stats.get_value("openclaw/checkpoint/snapshots") == 1
    state = load(tmp_path)
    assert state.snapshot_gen == ext.writer.gen and len(state.requests) == 501
    ext.writer.journal.close()


def test_background_snapshot_failure_keeps_every_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from scrapy_openclaw.checkpoint import extension as module

    ext = _extension_with_requests(tmp_path, 50)
    assert ext.writer.snapshot()  # a good generation to fall back on
    ext._new_request(Request("http://a.example/after-the-good-snapshot"))

    def disk_full(*args: Any, **kwargs: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, "write_snapshot", disk_full)
    with caplog.at_level(logging.ERROR):
        assert ext.writer.snapshot(background=True)
        ext.writer.join()
    assert "No space left on device" in caplog.text
    assert ext.stats.get_value("openclaw/checkpoint/snapshot_errors") == 1
    ext._new_request(Request("http://a.example/after-the-failure"))
    assert ext.writer.commit()
    state = load(tmp_path)
    assert len(state.requests) == 52 and not state.bad_snapshots
    ext.writer.journal.close()
