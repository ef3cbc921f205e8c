"""docs/troubleshooting.md covers every message a user can act on: each message below is still
raised (or logged) in the named module, and the page quotes it; every module that raises a
configuration or usage error has its messages listed here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scrapy_openclaw"
PAGE = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")

#: (module, words of the message as the code has them and the page quotes them)
MESSAGES = [
    ("settings.py", "unknown scrapy-openclaw setting"),
    ("settings.py", "expected a string, got"),
    ("settings.py", "is out of range ["),
    ("settings.py", "is not an HTTP status (a whole number from 100 to 599"),
    ("health/registry/__init__.py", "setting OPENCLAW_HEALTH_REGISTRY_CLASS="),
    ("health/registry/__init__.py", "must name a subclass of "),
    ("errors.py", "retryable HTTP codes: expected a list of status codes, got"),
    ("errors.py", "is not an exception type"),
    ("errors.py", "unknown exception type"),
    ("errors.py", "cannot import"),
    ("retry/compat.py", "expected a logging level, got"),
    ("retry/compat.py", "unknown logging level"),
    ("dlq/pipeline.py", "setting OPENCLAW_DLQ_URI"),
    ("lifecycle.py", "this Scrapy version's engine has no slot add_request/remove_request"),
    ("paths.py", "cannot read"),
    ("paths.py", "expected pkg://PACKAGE/FILE (a file inside an importable package"),
    ("paths.py", "so that it travels in the egg or wheel?"),
    ("paths.py", "package data (pkg://) is read-only; give a directory or file path"),
    ("checkpoint/restore.py", "point it at a directory this user can create and write"),
    ("checkpoint/restore.py", "another running crawl uses this checkpoint directory"),
    ("checkpoint/extension/__init__.py", "seen requests and fight over them); unset JOBDIR"),
    ("settings.py", "needs a store key shared by every worker: set "),
    ("serialization/signing.py", "a store key needs at least"),
    ("serialization/signing.py", "must be owned by this user and private (chmod 600"),
    ("serialization/signing.py", "empty or too short (delete it to generate a new key"),
    ("policy/validation.py", "unknown key ("),
    ("policy/validation.py", "did you mean"),
    ("policy/validation.py", "must be a mapping, got"),
    ("policy/validation.py", "must be a number, got"),
    ("policy/validation.py", "must be a whole number, got"),
    ("policy/validation.py", "must be finite, got"),
    ("policy/validation.py", "out of range:"),
    ("policy/validation.py", "must be true or false, got"),
    ("policy/validation.py", "must be one of"),
    ("policy/validation.py", "must be a list of non-empty strings, got"),
    ("settings.py", "setting OPENCLAW_POLICY: not a JSON object"),
    ("policy/loading.py", "the policy must be a mapping with 'defaults' and/or 'domains'"),
    ("yamlconfig.py", "invalid YAML"),
    ("yamlconfig.py", "invalid YAML: nested too deeply"),
    ("yamlconfig.py", "aliases expand to more than"),
    ("yamlconfig.py", "aliases nest deeper than"),
    ("yamlconfig.py", "an alias refers to itself"),
    ("yamlconfig.py", "a key must be a plain value, not a"),
    ("yamlconfig.py", "unusable key"),
    ("yamlconfig.py", "duplicate key (first set on line"),
    ("yamlconfig.py", "is larger than"),
    ("yamlconfig.py", "is not UTF-8 text"),
    ("commands/addon_check.py", "scrapy-openclaw is off: the settings set"),
    ("addon.py", "(a RetryMiddleware subclass in DOWNLOADER_MIDDLEWARES) "),
    ("addon.py", "AUTOTHROTTLE_ENABLED is ignored"),
    ("health/middleware.py", "AutoThrottle and DomainHealthMiddleware both set download slot delays"),
    ("health/middleware.py", "Giving up on"),
    ("health/notices.py", "Circuit for"),
    ("health/notices.py", "under the circuit floor"),
    ("health/notices.py", "domain failures in a row"),
    ("health/notices.py", "the probe sent after the cool-down failed"),
    ("health/notices.py", "more %(times)s (closed"),
    ("health/notices.py", "has been slow for"),
    ("health/notices.py", "Holding"),
    ("health/notices.py", "(the site asked to wait)"),
    ("health/middleware.py", "the site asked to wait (Retry-After)"),
    ("commands/ctl.py", "live control is off in that crawl"),
    ("commands/ctl.py", "no endpoint: give --url http://HOST:PORT (or set OPENCLAW_METRICS_PORT), or --redis"),
    ("commands/ctl.py", "expected a command: domains, hold, release, limit, give-up, restore, pause, resume, close"),
    ("commands/ctl.py", "expected one DOMAIN"),
    ("commands/ctl.py", "takes no arguments"),
    ("commands/ctl.py", "expected a duration like 90, 15m, 2h"),
    ("commands/ctl.py", "expected a duration >= 0"),
    ("commands/ctl.py", "expected a number or 'off'"),
    ("commands/ctl.py", "--redis: give a URL or set REDIS_URL"),
    ("commands/ctl.py", "--redis needs --spider NAME (the crawl's Redis keys start with it"),
    ("commands/dlq/__init__.py", "unknown option(s"),
    ("commands/dlq/__init__.py", "expected one of"),
    ("commands/dlq/__init__.py", "argument(s), got"),
    ("commands/dlq/__init__.py", "names another spider"),
    ("commands/dlq/replay.py", "names another spider"),
    ("commands/dlq/inspecting.py", "is ambiguous"),
    ("commands/dlq/text.py", "expected a UNIX time, an ISO date/time or an age like 30m, 2h, 1d"),
    ("commands/checkpoint.py", "expected: inspect DIR | verify DIR"),
    ("commands/checkpoint.py", "not a directory"),
    ("commands/report.py", "expected at most one argument, the spider name"),
    ("commands/report.py", "--format text is written for one site's operator: name it with --domain"),
    ("commands/report.py", "name the spider (its report.json) or give --path FILE"),
    ("commands/report.py", "--redis needs the spider name"),
    ("commands/schedule.py", "expected TASKS.yaml or `status [TASKS.yaml]`"),
    ("commands/schedule.py", "expected one tasks file"),
    ("commands/schedule.py", "status takes at most one tasks file"),
    ("commands/sites.py", "expected list, show DOMAIN or forget DOMAIN... / forget --all"),
    ("commands/sites.py", "show takes one domain"),
    ("commands/sites.py", "forget takes domains, or --all (not both)"),
    ("distributed/items.py", "but no hash tag, so no key can share its Redis Cluster slot"),
]
#: How the page may quote what the code formats ("%(times)s" is "times"; "|" is escaped in a table).
_PAGE_FORMS = {
    "more %(times)s (closed": "more times (closed",
    "expected: inspect DIR | verify DIR": r"inspect DIR \| verify DIR",
}
_RAISES = re.compile(r"\b(?:OpenClawConfigError|UsageError)\(\s*f?[\"']")


@pytest.mark.parametrize(("module", "words"), MESSAGES, ids=[f"{m}:{w[:30]}" for m, w in MESSAGES])
def test_the_message_is_in_the_code_and_on_the_page(module: str, words: str) -> None:
    source = " ".join((PACKAGE / module).read_text(encoding="utf-8").split())
    # (a message may be split over implicitly concatenated string literals)
    joined = re.sub(r"\"\s+f?\"", "", source)
    assert words in joined, f"{module} no longer says {words!r}: update MESSAGES and docs/troubleshooting.md"
    assert _PAGE_FORMS.get(words, words) in PAGE, f"docs/troubleshooting.md does not explain {words!r}"


def test_every_module_raising_a_message_is_listed() -> None:
    listed = {module for module, _ in MESSAGES}
    raising = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if _RAISES.search(path.read_text(encoding="utf-8"))
    }
    assert raising <= listed, f"messages of {sorted(raising - listed)} are not in docs/troubleshooting.md"
