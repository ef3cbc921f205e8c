"""Hostile and careless configuration (issue 17, items 3, 4, 7, 8, 9, 12): a clear error, never a crash."""

from __future__ import annotations

import json
import logging
import os
import stat
import textwrap
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_openclaw import yamlconfig
from scrapy_openclaw._files import atomic_write, is_temp
from scrapy_openclaw.checkpoint.journal import JournalWriter
from scrapy_openclaw.checkpoint.snapshot import write_snapshot
from scrapy_openclaw.checkpoint.state import (
    checkpoint_files,
    file_name,
    generations,
    journal_path,
    load,
    parse_name,
    snapshot_path,
    temp_files,
)
from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.health.registry import health_registry_class
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.schedule.tasks import load_tasks
from scrapy_openclaw.settings import validate_settings

TASK = "tasks:\n  t:\n    spider: s\n    interval: 60\n"

# An 800-byte document whose aliases expand to 9^9 (~387 million) nodes.
LIST_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [*{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}, *{a}]\n" for a, b in zip("abcdefgh", "bcdefghi")
)
MAP_BOMB = "a: &a {x: 1, y: 1}\n" + "".join(
    f"{b}: &{b} {{p: *{a}, q: *{a}, r: *{a}, s: *{a}}}\n" for a, b in zip("abcdefghijkl", "bcdefghijklm")
)


def policy_error(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "policy.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(OpenClawConfigError) as info:
        PolicySet.from_settings(Settings({"OPENCLAW_POLICY_FILE": str(path)}))
    return str(info.value)


def tasks_error(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "tasks.yaml"
    path.write_bytes(text if isinstance(text, bytes) else textwrap.dedent(text).encode())
    with pytest.raises(OpenClawConfigError) as info:
        load_tasks(path)
    return str(info.value)


# --- item 3: bounded YAML -----------------------------------------------------


@pytest.mark.parametrize("bomb", [LIST_BOMB, MAP_BOMB], ids=["lists", "mappings"])
@pytest.mark.parametrize("error_of", [policy_error, tasks_error], ids=["policy", "tasks"])
def test_alias_bomb_is_refused_before_it_expands(tmp_path: Path, bomb: str, error_of: Any) -> None:
    assert len(bomb) < 900
    tracemalloc.start()
    try:
        message = error_of(tmp_path, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 1024 * 1024
    assert ".yaml, line " in message and "alias bomb" in message


@pytest.mark.parametrize("text", ["defaults: &a {health: *a}\n", "&a [*a]\n"], ids=["mapping", "list"])
def test_self_referencing_alias(tmp_path: Path, text: str) -> None:
    message = policy_error(tmp_path, text)
    assert "policy.yaml, line 1" in message and "refers to itself" in message


@pytest.mark.parametrize("text", ["x: " + "[" * 5000 + "]" * 5000, "x: " + "{a: " * 5000 + "1" + "}" * 5000])
def test_five_thousand_nested_brackets(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused after the scanner reads MAX_DEPTH of them, not after scanning all (seconds, found by the fuzz test)."""
    tokens = []
    fetch = yamlconfig._BoundedLoader.fetch_more_tokens
    monkeypatch.setattr(yamlconfig._BoundedLoader, "fetch_more_tokens", lambda self: tokens.append(1) or fetch(self))
    assert "nested deeper than" in policy_error(tmp_path, text)
    assert "tasks.yaml, line 1" in tasks_error(tmp_path, text)
    assert len(tokens) < 2 * 3 * yamlconfig.MAX_DEPTH  # two loads, ~2 tokens per level


def test_deep_block_nesting_is_refused_by_the_scanner(tmp_path: Path) -> None:
    text = "".join(" " * i + "a:\n" for i in range(2000)) + " " * 2000 + "1\n"
    assert "policy.yaml, line 50: invalid YAML: nested deeper than" in policy_error(tmp_path, text)


def test_merge_keys_still_work(tmp_path: Path) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text("defaults: &d {max_attempts: 2}\ntasks:\n  t:\n    <<: *d\n    spider: s\n    interval: 60\n")
    assert load_tasks(path)[0].max_attempts == 2


# --- item 7: clear errors ---------------------------------------------------------


def test_non_utf8_files(tmp_path: Path) -> None:
    assert "policy.yaml, line 2: policy file is not UTF-8" in policy_error(tmp_path, b"defaults:\n  x: caf\xe9\n")
    assert "tasks.yaml, line 3: tasks file is not UTF-8" in tasks_error(tmp_path, b"tasks:\n  t:\n    spider: \xff\n")


@pytest.mark.parametrize("digits", [400, 5000])
def test_huge_integers(tmp_path: Path, digits: int) -> None:
    number = "9" * digits
    assert "line 3: invalid YAML: integer too large" in policy_error(
        tmp_path, f"defaults:\n  health:\n    burst: {number}\n"
    )
    assert "line 4: invalid YAML: integer too large" in tasks_error(tmp_path, TASK.replace("60", number))
    with pytest.raises(OpenClawConfigError, match="number too large"):
        PolicySet.from_settings(Settings({"OPENCLAW_POLICY": {"defaults": {"health": {"burst": 10**digits}}}}))


def test_complex_and_duplicate_keys(tmp_path: Path) -> None:
    assert "line 1: invalid YAML: a key must be a plain value, not a list" in policy_error(tmp_path, "? [a, b]\n: 1\n")
    assert "not a mapping" in tasks_error(tmp_path, "{a: 1}: 2\n")
    message = tasks_error(tmp_path, TASK + "    interval: 30\n")
    assert "tasks.yaml, line 5: key tasks.t.interval: duplicate key (first set on line 4)" in message
    message = policy_error(tmp_path, "domains:\n  a.com: {}\n  a.com: {}\n")
    assert "line 3: key domains.a.com: duplicate key" in message


def test_timezone_that_is_a_directory(tmp_path: Path) -> None:
    message = tasks_error(tmp_path, TASK + "    timezone: America\n")
    assert "line 5: key tasks.t.timezone: unknown time zone 'America'" in message


def test_retry_http_codes_must_be_statuses() -> None:
    for bad in ("abc", "500,x", [500, "600"], [True]):
        with pytest.raises(OpenClawConfigError, match="OPENCLAW_RETRY_HTTP_CODES: .* is not an HTTP status"):
            validate_settings(Settings({"OPENCLAW_RETRY_HTTP_CODES": bad}))
    validate_settings(Settings({"OPENCLAW_RETRY_HTTP_CODES": "500,503"}))
    validate_settings(Settings({"OPENCLAW_RETRY_HTTP_CODES": [429, "503"]}))


@pytest.mark.parametrize(
    ("health", "lower", "upper"),
    [
        ({"min_rate": 5, "base_rate": 2}, "min_rate", "base_rate"),
        ({"initial_rate": 5, "base_rate": 2}, "initial_rate", "base_rate"),
        ({"circuit_cooldown": 120}, "circuit_cooldown", "circuit_cooldown_max"),
    ],
)
def test_contradicting_keys_name_both(tmp_path: Path, health: dict[str, Any], lower: str, upper: str) -> None:
    body = "\n".join(f"    {k}: {v}" for k, v in health.items())
    message = policy_error(tmp_path, f"defaults:\n  health:\n{body}\n")
    assert f"key defaults.health.{lower}: {lower}" in message and f"must be <= {upper}" in message
    assert "policy.yaml, line 3" in message


def test_contradiction_across_layers_names_both_places(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("domains:\n  slow.example:\n    health: {min_rate: 3}\n")
    settings = Settings(
        {"OPENCLAW_POLICY_FILE": str(path), "OPENCLAW_POLICY": {"defaults": {"health": {"base_rate": 1}}}}
    )
    with pytest.raises(OpenClawConfigError) as info:
        PolicySet.from_settings(settings)
    message = str(info.value)
    assert "policy.yaml, line 3: key domains.slow.example.health.min_rate" in message
    assert "setting OPENCLAW_POLICY, key defaults.health.base_rate" in message


def test_builtin_default_above_a_user_ceiling_is_no_contradiction() -> None:
    PolicySet.from_settings(Settings({"OPENCLAW_POLICY": {"defaults": {"health": {"base_rate": 0.1}}}}))


# --- item 8: OPENCLAW_POLICY as JSON text ----------------------------------------


def test_policy_setting_as_json_text() -> None:
    text = json.dumps({"defaults": {"health": {"burst": 7}}, "domains": {"a.example": {"health": {"burst": 2}}}})
    policies = PolicySet.from_settings(Settings({"OPENCLAW_POLICY": text}))
    assert policies.for_domain("b.example").health.burst == 7
    assert policies.for_domain("a.example").health.burst == 2
    with pytest.raises(OpenClawConfigError, match="OPENCLAW_POLICY"):
        PolicySet.from_settings(Settings({"OPENCLAW_POLICY": "[1, 2]"}))


# --- item 9: tasks values that would crash every window ---------------------------


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("    args: {since: 2024-01-01}\n", "line 5: key tasks.t.args.since: a date cannot be passed"),
        (
            "    incremental: true\n    initial_cursor: {at: 2024-01-01 10:00:00}\n",
            "line 6: key tasks.t.initial_cursor.at: a datetime cannot be passed",
        ),
        (
            "    settings: {EXTENSIONS: not json}\n",
            "key tasks.t.settings.EXTENSIONS: must be a mapping or a JSON object",
        ),
        ("    settings: {ITEM_PIPELINES: [a]}\n", "key tasks.t.settings.ITEM_PIPELINES: must be a mapping"),
        ("    settings: {OPENCLAW_RETRY_HTTP_CODES: abc}\n", "is not an HTTP status"),
        (
            "    settings: {OPENCLAW_POLICY: {defaults: {health: {burst: -1}}}}\n",
            "key tasks.t.settings.OPENCLAW_POLICY: setting OPENCLAW_POLICY: key defaults.health.burst: out of range",
        ),
        ("    settings: {OPENCLAW_NOPE: 1}\n", "unknown scrapy-openclaw setting"),
        ("    args: {x: .inf}\n", "must be a finite number"),
    ],
)
def test_tasks_values_that_cannot_reach_the_crawl(tmp_path: Path, extra: str, expected: str) -> None:
    assert expected in tasks_error(tmp_path, TASK + extra)


def test_tasks_json_settings_accepted(tmp_path: Path) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(
        TASK + "    settings:\n      EXTENSIONS: '{\"a.B\": 1}'\n"
        "      OPENCLAW_POLICY: {defaults: {health: {burst: 3}}}\n"
    )
    assert load_tasks(path)[0].settings["OPENCLAW_POLICY"] == {"defaults": {"health": {"burst": 3}}}


# --- item 4: private files, exclusive temp files, the registry class ---------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_checkpoint_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        directory = tmp_path / "a" / "ckpt"
        from scrapy_openclaw._files import private_dir

        private_dir(directory)
        journal = JournalWriter(journal_path(directory, 0), {"gen": 0})
        journal.close()
        write_snapshot(snapshot_path(directory, 1), {"gen": 1}, [(1, "p", "{}")], [b"x" * 20])
        atomic_write(directory / "other.json", b"{}")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == 0o700 and _mode(directory) == 0o700
    for path in directory.iterdir():
        assert _mode(path) == 0o600, path
    assert not temp_files(directory)


def test_temp_files_are_exclusive_and_only_ours_are_cleaned(tmp_path: Path) -> None:
    # A symlink planted at the old fixed temp name is never followed.
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "snapshot-00000001.ckpt.tmp.link").symlink_to(victim)
    os.symlink(victim, tmp_path / "snapshot-00000001.ckpt.tmp")
    write_snapshot(snapshot_path(tmp_path, 1), {"gen": 1}, [], [])
    assert victim.read_text() == "keep"
    someone_elses = tmp_path / "notes.tmp"
    someone_elses.write_text("mine")
    ours = tmp_path / ".openclaw-snapshot-00000002.ckpt.abc123.tmp"
    ours.write_text("torn")
    assert is_temp(ours.name) and not is_temp(someone_elses.name)
    assert someone_elses not in checkpoint_files(tmp_path)
    assert set(temp_files(tmp_path)) == {ours, tmp_path / "snapshot-00000001.ckpt.tmp"}


def test_health_registry_class_must_be_a_registry() -> None:
    for path in ("os.system", "builtins.print", "scrapy_openclaw.policy.PolicySet"):
        with pytest.raises(OpenClawConfigError, match="must name a subclass of scrapy_openclaw.health.HealthRegistry"):
            health_registry_class(path)
    with pytest.raises(OpenClawConfigError, match="cannot load it"):
        health_registry_class("no_such_module.Registry")


def test_health_registry_class_is_checked_before_it_is_called(tmp_path: Path) -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_openclaw.health import HealthRegistry

    marker = tmp_path / "called"
    crawler = get_crawler(settings_dict={"OPENCLAW_HEALTH_REGISTRY_CLASS": "pathlib.Path.touch"})
    with pytest.raises(OpenClawConfigError):
        HealthRegistry.for_crawler(crawler)
    assert not marker.exists()


# --- item 12: checkpoint names -----------------------------------------------------


def test_names_round_trip_and_strays_are_reported(tmp_path: Path, caplog: Any) -> None:
    for gen in (0, 7, 99999999, 100000000, 123456789012):
        assert parse_name(file_name("journal", gen)) == ("journal", gen)
        assert parse_name(file_name("snapshot", gen)) == ("snapshot", gen)
    for stray in ("journal-1.log", "journal-000000001.log", "journal-0000000a.log", "snapshot-00000001.log"):
        assert parse_name(stray) is None
    (tmp_path / "journal-99999999.log").write_bytes(b"")
    (tmp_path / "journal-7.log").write_bytes(b"")
    state = load(tmp_path)
    assert state.next_generation == 100000000
    assert any("journal-7.log" in w for w in state.warnings)
    JournalWriter(journal_path(tmp_path, state.next_generation), {"gen": state.next_generation}).close()
    assert generations(tmp_path)[1] == [99999999, 100000000]  # the reader sees what the writer wrote
    assert load(tmp_path).next_generation == 100000001


def test_stray_generation_does_not_hide_later_progress(tmp_path: Path) -> None:
    from scrapy_openclaw.checkpoint.journal import encode_line

    (tmp_path / "journal-99999999.log").write_bytes(b"")
    gen = load(tmp_path).next_generation
    writer = JournalWriter(journal_path(tmp_path, gen), {"gen": gen})
    writer.append('a 1 p - {"url": "https://example.com/"}')
    writer.close()
    assert list(load(tmp_path).requests) == [1]
    assert encode_line("x")  # the journal format itself is unchanged


def test_yaml_errors_do_not_log_a_traceback(tmp_path: Path, caplog: Any) -> None:
    with caplog.at_level(logging.DEBUG):
        policy_error(tmp_path, LIST_BOMB)
    assert "Traceback" not in caplog.text


def test_dead_letter_files_are_private(tmp_path: Path) -> None:
    from scrapy_openclaw.deadletter import DeadLetter
    from scrapy_openclaw.dlq.stores import JsonlStore

    old = os.umask(0o022)
    try:
        store = JsonlStore(tmp_path / "dlq" / "dead.jsonl")
        for n in range(2):
            store.append(
                DeadLetter(
                    url=f"https://a.example/{n}",
                    domain="a.example",
                    error_class="network",
                    reason="timeout",
                    spider="s",
                    crawl_id="c",
                    request={"url": "https://a.example/", "headers": {"Cookie": ["secret"]}},
                )
            )
        store.close()
        before = _mode(tmp_path / "dlq" / "dead.jsonl")
        JsonlStore(tmp_path / "dlq" / "dead.jsonl").purge()
    finally:
        os.umask(old)
    assert before == 0o600 and _mode(tmp_path / "dlq") == 0o700
    for path in (tmp_path / "dlq").iterdir():
        assert _mode(path) == 0o600, path
