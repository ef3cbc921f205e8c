"""``scrapy openclaw-checkpoint inspect|verify DIR``: look into a checkpoint without running a crawl.

``inspect`` prints what a resume would restore (pending by domain, in flight,
fingerprints, age, version, finished or not, and each durable feed's offset
and item count); ``--json`` for scripts.
``verify`` checks every file's checksums and exits 1 when anything is
damaged (a torn journal tail, typical after a crash and harmless, is
reported but does not fail verification).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlparse

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from scrapy_openclaw.checkpoint.journal import FORMAT_VERSION, CheckpointError, read_journal
from scrapy_openclaw.checkpoint.snapshot import read_snapshot
from scrapy_openclaw.checkpoint.state import age, checkpoint_files, generations, journal_path, load, snapshot_path
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.redact import mask_uri
from scrapy_openclaw.settings import OpenClawSettings


def _journal_spider(directory: Path, gens: list[int]) -> str | None:
    """The spider named by a journal header: a crawl that died before its first snapshot has no other."""
    for gen in reversed(gens):
        try:
            header = read_journal(journal_path(directory, gen)).header or {}
        except CheckpointError:
            continue
        if isinstance(header.get("spider"), str):
            return header["spider"]
    return None


def inspect_dir(directory: Path) -> dict[str, Any]:
    """A JSON-safe summary of what resuming from *directory* would restore."""
    state = load(directory)
    by_domain: dict[str, int] = {}
    in_flight = 0
    for st, data, _fp in state.requests.values():
        try:
            host = urlparse(json.loads(data).get("url", "")).hostname or "?"
        except ValueError:
            host = "?"
        by_domain[host] = by_domain.get(host, 0) + 1
        in_flight += st == "f"
    return {
        "directory": str(directory),
        "format_version": state.header.get("v", FORMAT_VERSION if not state.empty else None),
        "crawl_id": state.crawl_id,
        "spider": state.header.get("spider") or _journal_spider(directory, state.journal_gens),
        "finished": state.finished,
        "finish_reason": state.header.get("reason"),
        "snapshot_generation": state.snapshot_gen,
        "journal_generations": state.journal_gens,
        "age_seconds": None if (a := age(state)) is None else round(a, 1),
        "pending": len(state.requests) - in_flight,
        "in_flight": in_flight,
        "pending_by_domain": dict(sorted(by_domain.items(), key=lambda kv: (-kv[1], kv[0]))),
        "fingerprints": len(state.fingerprints),
        "outputs": _outputs(state.outputs),
        "dropped_records": state.dropped,
        "warnings": state.warnings,
        "bytes": sum(p.stat().st_size for p in checkpoint_files(directory) if p.exists()),
    }


def _outputs(outputs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Durable feeds and opted-in pipelines: where a resume continues each one."""
    rows = []
    for key, st in sorted(outputs.items()):
        kind, _, name = key.partition(":")
        if kind == "next":
            continue  # (a later batch's start, journaled before its bytes: not where a resume continues)
        if kind == "feed":
            rows.append(
                {
                    "kind": "feed",
                    "name": mask_uri(name),
                    "uri": mask_uri(st["uri"]),
                    "batch": st["batch"],
                    "offset": st["offset"],
                    "items": st["items"],
                }
            )
        else:
            rows.append({"kind": "pipeline", "name": name, "marker": st.get("marker"), "items": st["items"]})
    return rows


def verify_dir(directory: Path) -> tuple[bool, list[str]]:
    """Check every snapshot and journal; (ok, one line per file)."""
    ok, lines = True, []
    snaps, journals = generations(directory)
    if not snaps and not journals:
        return False, [f"{directory}: no checkpoint files"]
    for gen in snaps:
        path = snapshot_path(directory, gen)
        try:
            snap = read_snapshot(path)
            lines.append(f"ok       {path.name}: {len(snap.requests)} requests, {len(snap.fingerprints)} fingerprints")
        except (CheckpointError, OSError, ValueError) as exc:
            ok = False
            lines.append(f"DAMAGED  {path.name}: {exc}")
    for gen in journals:
        path = journal_path(directory, gen)
        try:
            contents = read_journal(path)
        except (CheckpointError, OSError) as exc:
            ok = False
            lines.append(f"DAMAGED  {path.name}: {exc}")
            continue
        if contents.corrupt or contents.header is None:
            ok = False
            lines.append(
                f"DAMAGED  {path.name}: {contents.corrupt} corrupt records"
                + ("" if contents.header else ", no valid header")
            )
        elif contents.torn_tail:
            lines.append(
                f"ok       {path.name}: {len(contents.payloads)} records, torn tail of "
                f"{contents.torn_tail} (a crash mid-write; skipped on resume)"
            )
        else:
            lines.append(f"ok       {path.name}: {len(contents.payloads)} records")
    return ok, lines


class Command(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "inspect|verify DIR [--json]"

    def short_desc(self) -> str:
        return "Inspect or verify a scrapy-openclaw checkpoint directory"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", action="store_true", help="print inspect output as JSON")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if len(args) != 2 or args[0] not in ("inspect", "verify"):
            raise UsageError("expected: inspect DIR | verify DIR")
        directory = Path(args[1])
        if not directory.is_dir():
            raise UsageError(f"{directory}: not a directory")
        try:  # lines are checked with the project's store key (OpenClawSettings configures it)
            OpenClawSettings.from_settings(self.settings)
        except OpenClawConfigError as exc:
            raise UsageError(str(exc), print_help=False) from None
        if args[0] == "verify":
            try:
                ok, lines = verify_dir(directory)
            except CheckpointError as exc:
                ok, lines = False, [str(exc)]
            print("\n".join(lines))
            print("checkpoint OK" if ok else "checkpoint DAMAGED")
            self.exitcode = 0 if ok else 1
            return
        try:
            info = inspect_dir(directory)
        except CheckpointError as exc:
            print(f"error: {exc}")
            self.exitcode = 1
            return
        if opts.json:
            print(json.dumps(info, indent=1))
            return
        age_s = info["age_seconds"]
        print(f"checkpoint   {info['directory']} (format v{info['format_version']}, {info['bytes']} bytes)")
        print(f"crawl        {info['crawl_id']} spider={info['spider']}")
        state = "finished" if info["finished"] else f"resumable (last close: {info['finish_reason'] or 'crash'})"
        print(
            f"state        {state}, written {age_s if age_s is not None else '?'} s ago "
            f"({time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() - (age_s or 0)))})"
        )
        print(
            f"requests     {info['pending']} pending, {info['in_flight']} in flight, "
            f"{info['fingerprints']} fingerprints seen"
        )
        for domain, n in info["pending_by_domain"].items():
            print(f"  {n:>8}  {domain}")
        if info["outputs"]:
            print("feeds        durable offset (bytes), items, where a resume continues:")
        for out in info["outputs"]:
            if out["kind"] == "feed":
                offset = "not opened yet" if out["offset"] is None else f"{out['offset']:>12}"
                batch = f" (batch {out['batch']})" if out["batch"] != 1 else ""
                print(f"  {offset}  {out['items']:>8} items  {out['uri']}{batch}")
            else:
                print(f"  {out['marker']!s:>12}  {out['items']:>8} items  pipeline {out['name']}")
        for warning in info["warnings"]:
            print(f"warning: {warning}")
