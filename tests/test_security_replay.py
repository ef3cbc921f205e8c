"""Replay bypasses only the duplicate filter: a forged dead letter (a hostile writer of the store) is
refused unread, an own one outside ``allowed_domains`` is refused as the crawl's offsite filter would,
and ``--dry-run`` shows the requests the replay sends, with the same counts and no credentials."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_dlq_crawl import cli, dlq_settings, make_project, require_cli

from scrapy_openclaw.deadletter import DeadLetter
from scrapy_openclaw.dlq import JsonlStore

FENCED = """
from scrapy_openclaw.testing.spiders import ChaosSpider


class FencedSpider(ChaosSpider):
    name = "fenced"
    allowed_domains = ["127.0.0.2"]
"""
SECRET = "Basic c2VjcmV0LXVzZXI6cGFzcw=="


def letter(url: str, **request: Any) -> DeadLetter:
    return DeadLetter(
        url=url,
        domain=url.split("/")[2].split(":")[0],
        error_class="network",
        reason="timeout",
        spider="fenced",
        crawl_id="c",
        request={"url": url, "callback": "parse", **request},
    )


def test_replay_keeps_the_offsite_filter_and_dry_run_says_what_it_sends(chaos_server: Any, tmp_path: Path) -> None:
    require_cli()
    site = chaos_server({"hosts": [{"address": f"127.0.0.{n}", "pages": 6, "links_per_page": 0} for n in (2, 3)]})
    inside, outside = site.urls["127.0.0.2"], site.urls["127.0.0.3"]
    path = tmp_path / "dl.jsonl"
    store = JsonlStore(path)
    own = [
        letter(f"{inside}page/1", headers={"Authorization": [SECRET]}),
        letter(f"{outside}page/3"),  # the crawl's own, yet offsite: its offsite filter would stop it
        letter(f"{outside}page/2", meta={"allow_offsite": True}),  # the crawl let it through itself
    ]
    for record in own:
        store.append(record)
    store.close()
    forged = letter(f"{outside}page/4?token=t0k3n", headers={"Authorization": [SECRET], "Host": ["127.0.0.2"]})
    with open(path, "a", encoding="utf-8") as f:  # a writer without the store key
        f.write(json.dumps(forged.to_dict()) + "\n")
    project = make_project(tmp_path / "proj", {**dlq_settings(str(path)), "SPIDER_MODULES": ["fenced_spiders"]})
    (project / "fenced_spiders.py").write_text(FENCED, encoding="utf-8")

    dry = cli(project, "replay", "fenced", "--dry-run")
    assert "would replay 2 dead letter(s) of fenced" in dry.stdout, dry.stdout + dry.stderr[-3000:]
    assert "would skip 1 that could not be rebuilt or were refused" in dry.stdout
    assert f"GET {inside}page/1  callback=parse" in dry.stdout and "Authorization: ***" in dry.stdout
    assert f"GET {outside}page/2" in dry.stdout and "page/3" in dry.stderr and "offsite" in dry.stderr
    assert "refused: not sealed" in dry.stderr and "page/4" not in dry.stdout
    assert not site_requests(site), "a dry run sends nothing"

    replay = cli(project, "replay", "fenced")
    assert "replayed 2 dead letter(s) of fenced" in replay.stdout, replay.stdout + replay.stderr[-3000:]
    assert "skipped 1 that could not be rebuilt or were refused" in replay.stdout
    assert replay.returncode == dry.returncode == 1
    assert sorted(site_requests(site)) == sorted([f"{inside}page/1", f"{outside}page/2"])
    for out in (dry, replay, cli(project, "show", own[0].id), cli(project, "show", own[0].id, "--raw")):
        assert SECRET not in out.stdout + out.stderr and "t0k3n" not in out.stdout + out.stderr
    assert "***" in cli(project, "show", own[0].id).stdout


def site_requests(site: Any) -> list[str]:
    return [h["base_url"] + r["path"].lstrip("/") for h in site.truth()["hosts"].values() for r in h["requests"]]
