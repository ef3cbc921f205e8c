"""Error snapshots (issue 21): the first answers of each error signature, beside the dead letters.

One real crawl (the add-on, a chaos site with broken pages, 404s, a parse
failure and a ban host) fills the snapshot directory; the test reads it back
from disk and through ``scrapy openclaw-dlq show`` / ``stats``.
"""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

from scrapy.http import Headers

from scrapy_openclaw.dlq.snapshots import _redact_body, _redact_headers, iter_snapshots, snapshots_by_signature
from scrapy_openclaw.testing.chaos import BAN_MARKER, ChaosConfig, HostConfig
from scrapy_openclaw.testing.crawl import run_crawl
from scrapy_openclaw.testing.presets import address
from tests.test_dlq_crawl import cli, make_project, require_cli

MAX_BYTES = 40  # smaller than every chaos page


def test_secrets_are_masked() -> None:
    headers = _redact_headers(
        Headers(
            {
                "Set-Cookie": ["sid=abc", "x=1"],
                "Authorization": "Bearer t0k",
                "Location": "http://u:hunter2@h/?token=s3cret&a=1",
            }
        )
    )
    assert headers["Set-Cookie"] == ["***", "***"] and headers["Authorization"] == ["***"]
    assert "hunter2" not in headers["Location"][0] and "s3cret" not in headers["Location"][0]
    body = _redact_body(b"\xff\x00 see https://me:pw@api.example/x?api_key=K123 \xfe")
    assert b"pw@" not in body and b"K123" not in body and body.startswith(b"\xff\x00") and body.endswith(b"\xfe")


def test_one_snapshot_per_signature_capped_and_shown_by_the_cli(chaos_server: Any, tmp_path: Path) -> None:
    require_cli()
    healthy, banned = address(0), address(1)
    server = chaos_server(
        ChaosConfig(
            hosts=(
                HostConfig(
                    address=healthy,
                    pages=12,
                    links_per_page="all",
                    not_found=[3, 4],
                    status_script={5: (503,), 6: (503,)},
                    parse_fail={7: 9, 8: 9, 9: 9},
                ),
                HostConfig(address=banned, pages=6, links_per_page="all", ban_after=3, ban_seconds=None),
            )
        )
    )
    project = make_project(tmp_path / "proj", {})
    dead = project / "openclaw-data" / "chaos" / "deadletters.jsonl"
    policy = {
        "defaults": {
            "retry": {
                "protocol_retryable": {"max_attempts": 3, "base_delay": 0.05, "max_delay": 0.1},
                "parse": {"max_attempts": 2, "base_delay": 0.05, "max_delay": 0.1},
            }
        },
        "domains": {
            banned: {
                "health": {"ban_markers": [BAN_MARKER], "blocked_hold": 0.2},
                "retry": {"blocked": {"max_attempts": 2, "base_delay": 0.05, "max_delay": 0.1}},
            }
        },
    }
    settings = {
        "ADDONS": {"scrapy_openclaw.Addon": 100},
        "LOG_LEVEL": "INFO",
        "OPENCLAW_DLQ_URI": str(dead),
        "OPENCLAW_SNAPSHOT_COUNT": 2,
        "OPENCLAW_SNAPSHOT_MAX_BYTES": MAX_BYTES,
        "OPENCLAW_POLICY": policy,
    }
    result = run_crawl(
        settings=settings, spider_args={"start_urls": server.start_urls}, timeout=120, out_dir=tmp_path / "crawl"
    )
    assert result.returncode == 0, result.log[-3000:]
    # (the only tracebacks: Scrapy's "Spider error processing" of the parse failure given up)
    assert result.log.count("Traceback") == result.log.count("Spider error processing"), result.log[-3000:]
    assert "Cannot write an error snapshot" not in result.log

    directory = dead.parent / "snapshots"
    found = snapshots_by_signature(directory)
    assert set(found) >= {
        ("protocol_permanent", "404", "", healthy),
        ("protocol_retryable", "503", "", healthy),
        ("parse", "", "ValueError", healthy),
        ("blocked", "200", "", banned),
    }, sorted(found)
    # answers alike but for their Date header are one snapshot (two 503 pages, six answers) ...
    assert {sig: len(metas) for sig, metas in found.items() if sig[0] != "parse"} == dict.fromkeys(
        [s for s in found if s[0] != "parse"], 1
    )
    # ... and three pages that failed to parse, each its own body, are OPENCLAW_SNAPSHOT_COUNT
    assert len(found[("parse", "", "ValueError", healthy)]) == 2
    stats = result.stats
    assert stats["openclaw/snapshots/duplicates"] >= 5
    assert stats["openclaw/snapshots/written"] == sum(len(m) for m in found.values())
    for metas in found.values():
        meta = metas[0]
        body = Path(meta["body_path"]).read_bytes()
        assert len(body) == meta["body_bytes"] <= MAX_BYTES and meta["truncated"]
        assert Path(meta["body_path"]).name == hashlib.sha256(body).hexdigest()  # content-addressed
        for path in (Path(meta["path"]), Path(meta["body_path"])):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    bodies = list((directory / "bodies").iterdir())
    assert len({p.read_bytes() for p in bodies}) == len(bodies)  # the same data never twice
    assert not [p for p in directory.iterdir() if p.name.endswith(".tmp")]

    # the CLI points to them: stats lists every signature, show gives a dead letter's snapshots
    out = cli(project, "stats", "chaos")
    assert out.returncode == 0, out.stderr
    assert f"error snapshots of chaos in {directory}" in out.stdout
    for sig, metas in found.items():
        assert Path(metas[0]["path"]).name in out.stdout
    records = [json.loads(line) for line in dead.read_text(encoding="utf-8").splitlines()]
    letter = next(r for r in records if r["status"] == 503)
    shown = cli(project, "show", letter["id"][:12], "--spider", "chaos")
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert [s["path"] for s in data["snapshots"]] == [found[("protocol_retryable", "503", "", healthy)][0]["path"]]

    # a second crawl of the same site finds its signatures full: nothing new is written
    before = sorted(p.name for p in directory.iterdir())
    again = run_crawl(
        settings=settings, spider_args={"start_urls": server.start_urls}, timeout=120, out_dir=tmp_path / "crawl2"
    )
    assert again.returncode == 0
    assert sorted(p.name for p in directory.iterdir()) == before
    assert len(list(iter_snapshots(directory))) == sum(len(m) for m in found.values())
