"""The README documents every setting and policy knob, and its commands exist."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scrapy_openclaw import policy
from scrapy_openclaw.settings import DEFAULTS

README = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_every_setting_is_in_the_readme_table(name):
    assert f"| `{name}` |" in README


def _knobs():
    for section, cls in (
        ("health", policy.HealthPolicy),
        ("retry", policy.RetryPolicy),
        ("deadline", policy.DeadlinePolicy),
    ):
        for field in dataclasses.fields(cls):
            yield f"{section}.{field.name}"


@pytest.mark.parametrize("knob", list(_knobs()))
def test_every_policy_knob_is_in_the_readme(knob):
    assert f"| `{knob}` |" in README


def test_the_two_setup_commands_open_the_readme():
    head = README.split("\n## ", 1)[0]
    assert "pip install -e . && cd sample_project && scrapy crawl demo" in head
    assert 'pip install -e ".[test]" && python -m pytest -q -n 3\n' in head


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pytest -q -n 3\n" in ci
