"""Retry-After: seconds, HTTP-dates, and garbage that must never crash."""

from __future__ import annotations

import logging
from email.utils import formatdate

import pytest

from scrapy_openclaw.retry_after import parse_retry_after

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        (b" 2.5 ", 2.5),
        (formatdate(NOW + 30, usegmt=True), 30.0),
        ("99999999", 600.0),  # capped
        ("-5", 0.0),
        (formatdate(NOW - 30, usegmt=True), 0.0),  # a date in the past
        (None, None),
        ("", None),
        ("soon", None),
        ("nan", None),
        (b"\xff\xfe\x00", None),
        ("Wed, 99 Foo 2026 99:99:99 GMT", None),
    ],
)
def test_values(value, expected):
    assert parse_retry_after(value, cap=600, now=NOW) == expected


def test_malformed_value_is_logged(caplog):
    with caplog.at_level(logging.WARNING):
        parse_retry_after("soon", cap=600, now=NOW)
    assert "malformed Retry-After" in caplog.text
