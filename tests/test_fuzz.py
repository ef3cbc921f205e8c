"""Property-based fuzzing of what reads untrusted or hand-written input (issue 17).

Every generated policy file, tasks file and dead-letter record gives a result
or our own error (``OpenClawConfigError`` / ``InvalidRecord``), never another
exception, within 10 s of CPU and 200 MB each. A tasks file that loads must also build
its crawl command line (a value that passes validation must not fail every
window later).
"""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from scrapy.settings import Settings

from scrapy_openclaw.dlq.records import InvalidRecord, read_record, seal, unseal
from scrapy_openclaw.dlq.stores import JsonlStore
from scrapy_openclaw.errors import OpenClawConfigError
from scrapy_openclaw.policy import PolicySet
from scrapy_openclaw.schedule.scheduler import crawl_command
from scrapy_openclaw.schedule.tasks import load_tasks

if TYPE_CHECKING:
    from collections.abc import Callable

TIME_LIMIT = 10.0
MEMORY_LIMIT = 200 * 1024 * 1024
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    # No shrinking: a failure is reported as generated (readable: a small document
    # with one fragment spliced in), rather than after minutes of shrinking in CI.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

pytestmark = pytest.mark.crawl  # property searches of seconds each


def bounded(check: Callable[[], object]) -> None:
    """Fail unless *check* stays within TIME_LIMIT seconds and MEMORY_LIMIT bytes (Python allocations).

    Two runs: one timed, one under tracemalloc (which slows allocation several
    times over, so timing it would measure the tracer). Time is this thread's
    CPU time, not wall time: other work on a shared machine must not fail it.
    The limit catches a hang or a quadratic blow-up (the slowest generated input
    took 7 ms on a quiet machine), not a slow machine.
    """
    started = time.thread_time()
    check()
    elapsed = time.thread_time() - started
    assert elapsed < TIME_LIMIT, f"took {elapsed:.2f}s"
    tracemalloc.start()
    try:
        check()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"peaked at {peak / 1e6:.0f} MB"


# --- generated YAML -------------------------------------------------------------

POLICY_KEYS = [
    "defaults",
    "domains",
    "health",
    "retry",
    "deadline",
    "network",
    "parse",
    "protocol_retryable",
    "base_rate",
    "min_rate",
    "initial_rate",
    "burst",
    "circuit_cooldown",
    "circuit_cooldown_max",
    "max_attempts",
    "jitter",
    "classes",
    "expired",
    "default",
    "*.example.com",
    "a.example",
]
TASK_KEYS = [
    "tasks",
    "defaults",
    "t1",
    "spider",
    "cron",
    "interval",
    "timezone",
    "settings",
    "args",
    "max_attempts",
    "retry_backoff",
    "retry_backoff_max",
    "timeout",
    "incremental",
    "initial_cursor",
    "run_missed",
    "checkpoint_dir",
    "EXTENSIONS",
    "OPENCLAW_POLICY",
    "CONCURRENT_REQUESTS",
    "since",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        [
            "UTC",
            "America",
            "Europe/Paris",
            "0 3 * * *",
            "*/5 * * * * *",
            "full",
            "boost",
            "not json",
            '{"a": 1}',
            "2024-01-01",
            "chaos",
            "-x",
            "",
            "9" * 400,
        ]
    ),
    st.text(max_size=20),
)


def documents(keys: list[str]) -> st.SearchStrategy[Any]:
    key = st.one_of(st.sampled_from(keys), st.text(max_size=8), st.integers(-5, 5))
    return st.recursive(
        SCALARS,
        lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(key, children, max_size=5)),
        max_leaves=25,
    )


# Fragments spliced into YAML text: aliases, bombs, deep nesting, odd tags and bytes.
FRAGMENTS = [
    "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
    "x: &x {y: *x}\n",
    "&r [*r]\n",
    "x: " + "[" * 3000 + "]" * 3000 + "\n",
    "? [a]\n: 1\n",
    "? {a: 1}\n: 2\n",
    "x: !!python/object/apply:os.system ['true']\n",
    "x: !!binary aGVsbG8=\n",
    "x: 2024-01-01 10:00:00\n",
    "x: 1\nx: 2\n",
    "<<: {a: 1}\n",
    "x: !!set {a, b}\n",
    "x: 0x" + "f" * 5000 + "\n",
    "x: .nan\n",
    "%YAML 1.1\n---\nx: 1\n",
    "--- 1\n--- 2\n",
    "x: *undefined\n",
    "\t\x00\x07",
]


def yaml_inputs(keys: list[str]) -> st.SearchStrategy[bytes]:
    structured = documents(keys).map(lambda doc: yaml.safe_dump(doc, allow_unicode=True, default_flow_style=None))
    spliced = st.tuples(structured, st.sampled_from(FRAGMENTS), st.booleans()).map(
        lambda t: t[0] + t[1] if t[2] else t[1] + t[0]
    )
    texts = st.one_of(structured, spliced, st.text(alphabet="{}[]&*:!- ,'\"\n\tab01<>?%#|", max_size=200))
    return st.one_of(texts.map(lambda s: s.encode("utf-8", "surrogatepass")), st.binary(max_size=200))


@FUZZ
@given(data=yaml_inputs(POLICY_KEYS))
def test_policy_loader(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "policy.yaml"
    path.write_bytes(data)

    def check() -> None:
        try:
            PolicySet.from_settings(Settings({"OPENCLAW_POLICY_FILE": str(path)})).for_domain("www.a.example")
        except OpenClawConfigError:
            pass

    bounded(check)


@FUZZ
@given(doc=documents(POLICY_KEYS))
def test_policy_setting(doc: Any) -> None:
    for value in (doc, json.dumps(doc)):

        def check(value: Any = value) -> None:
            try:
                PolicySet.from_settings(Settings({"OPENCLAW_POLICY": value})).for_domain("a.example")
            except OpenClawConfigError:
                pass

        bounded(check)


@FUZZ
@given(data=yaml_inputs(TASK_KEYS))
def test_tasks_loader(tmp_path: Path, data: bytes) -> None:
    check_tasks_file(tmp_path, data)


def check_tasks_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_bytes(data)

    def check() -> None:
        try:
            tasks = load_tasks(path)
        except OpenClawConfigError:
            return
        for task in tasks:  # what loads must run: the command line of every window builds
            crawl_command(
                task,
                Settings(),
                checkpoint_dir=tmp_path / "w",
                run_file=tmp_path / "r.json",
                cursor=task.initial_cursor,
            )

    bounded(check)


def _task_file(task: dict[str, Any]) -> bytes:
    return yaml.safe_dump({"tasks": {"t": {"spider": "s", "interval": 60, **task}}}).encode()


@FUZZ
@given(task=st.dictionaries(st.sampled_from(TASK_KEYS[3:]), documents(TASK_KEYS), max_size=4))
def test_tasks_loader_near_valid(tmp_path: Path, task: dict[str, Any]) -> None:
    check_tasks_file(tmp_path, _task_file(task))


# --- dead-letter records --------------------------------------------------------------

DLQ_FIELDS = [
    "url",
    "domain",
    "error_class",
    "reason",
    "spider",
    "crawl_id",
    "method",
    "status",
    "attempts",
    "exception_type",
    "exception_message",
    "traceback",
    "first_attempt_at",
    "last_attempt_at",
    "request",
    "item",
    "validation_error",
    "id",
    "created_at",
    "version",
    "_crc",
    "_mac",
    "_mark",
    "at",
]
GOOD = {
    "id": "0123abcd",
    "version": 1,
    "created_at": 1.0,
    "url": "https://a.example/",
    "domain": "a.example",
    "error_class": "network",
    "reason": "timeout",
    "spider": "s",
    "crawl_id": "c",
    "request": {"url": "https://a.example/", "method": "GET"},
}


def records() -> st.SearchStrategy[Any]:
    changed = st.dictionaries(st.sampled_from(DLQ_FIELDS), documents(DLQ_FIELDS), max_size=4)
    near = st.tuples(changed, st.lists(st.sampled_from(list(GOOD)), max_size=3)).map(
        lambda t: {k: v for k, v in {**GOOD, **t[0]}.items() if k not in t[1]}
    )
    return st.one_of(near, documents(DLQ_FIELDS))


def test_dlq_record_reader_refuses_a_bad_unsigned_checksum() -> None:
    """Found by the fuzz test below (in CI): a checksum of the wrong type crashed the check."""
    with pytest.raises(InvalidRecord, match="checksum mismatch"):
        read_record(unseal(json.dumps({**GOOD, "_crc": [], "url": {"url": None, "0": None}})))


@FUZZ
@given(record=records(), signed=st.booleans())
def test_dlq_record_reader(record: Any, signed: bool) -> None:
    data = record
    if signed and isinstance(record, dict):
        try:
            data = seal(record)
        except (ValueError, TypeError):  # not JSON-safe (nan): it could not have been stored signed
            pass

    def check() -> None:
        try:
            letter = read_record(unseal(data if isinstance(data, str) else json.dumps(data, default=repr)))
        except InvalidRecord:
            return
        assert letter.id and isinstance(letter.url, str)

    bounded(check)


def _line(record: Any) -> bytes:
    try:
        return (seal(record) if isinstance(record, dict) else json.dumps(record)).encode()
    except (ValueError, TypeError):
        return repr(record).encode()


@FUZZ
@given(lines=st.lists(st.one_of(records().map(_line), st.binary(max_size=80)), max_size=8))
def test_dlq_store_reader(tmp_path: Path, lines: list[bytes]) -> None:
    path = tmp_path / "dead.jsonl"
    path.write_bytes(b"\n".join(lines))

    def check() -> None:
        store = JsonlStore(path)
        try:
            for letter in store.iter():
                assert isinstance(letter.id, str)
        finally:
            store.close()

    bounded(check)
