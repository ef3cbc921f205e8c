"""The error taxonomy: one classification for every failure."""

from __future__ import annotations

import json

import pytest
import scrapy.exceptions
from scrapy.exceptions import DropItem
from scrapy.settings import Settings
from twisted.internet import error as txerror
from twisted.python.failure import Failure
from twisted.web._newclient import ResponseNeverReceived

from scrapy_openclaw.errors import ErrorClass, ErrorTaxonomy, ItemValidationError, ParseError
from scrapy_openclaw.settings import DEFAULTS


@pytest.fixture
def taxonomy():
    return ErrorTaxonomy.from_settings(Settings(DEFAULTS))


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (200, None),
        (304, None),
        (429, ErrorClass.PROTOCOL_RETRYABLE),
        (503, ErrorClass.PROTOCOL_RETRYABLE),
        (408, ErrorClass.PROTOCOL_RETRYABLE),
        (404, ErrorClass.PROTOCOL_PERMANENT),
        (410, ErrorClass.PROTOCOL_PERMANENT),
        (403, ErrorClass.PROTOCOL_PERMANENT),
        (501, ErrorClass.PROTOCOL_PERMANENT),
    ],
)
def test_statuses(taxonomy, status, error_class):
    result = taxonomy.classify_status(status)
    assert (result.error_class if result else None) == error_class


def test_throttle_statuses(taxonomy):
    assert taxonomy.classify_status(429).is_throttle and taxonomy.classify_status(503).is_throttle
    assert not taxonomy.classify_status(500).is_throttle


# Scrapy >= 2.16 raises its own download exceptions; older ones raise Twisted's.
NEWER = [
    (name, reason)
    for name, reason in (
        ("DownloadTimeoutError", "timeout"),
        ("CannotResolveHostError", "dns"),
        ("DownloadConnectionRefusedError", "refused"),
        ("ResponseDataLossError", "data_loss"),
    )
    if hasattr(scrapy.exceptions, name)
]


@pytest.mark.parametrize(("name", "reason"), NEWER)
def test_scrapy_download_exceptions(taxonomy, name, reason):
    exc = getattr(scrapy.exceptions, name)("x")
    assert taxonomy.classify_download_error(exc).reason == reason


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (txerror.TimeoutError(), "timeout"),
        (txerror.DNSLookupError(), "dns"),
        (txerror.ConnectionRefusedError(), "refused"),
        (txerror.ConnectionLost(), "connection_lost"),
        (ResponseNeverReceived([Failure(txerror.ConnectionDone())]), "connection_lost"),
        (ResponseNeverReceived([Failure(txerror.TimeoutError())]), "timeout"),
    ],
)
def test_network_failures(taxonomy, exc, reason):
    result = taxonomy.classify_download_error(Failure(exc))
    assert result.error_class is ErrorClass.NETWORK and result.reason == reason
    assert result.retryable


def test_non_network_exception_is_not_classified(taxonomy):
    assert taxonomy.classify_download_error(RuntimeError("bug")) is None


def test_callback_errors(taxonomy):
    assert taxonomy.classify_callback_error(ParseError("no title")).error_class is ErrorClass.PARSE
    try:
        json.loads("{")
    except ValueError as exc:
        assert taxonomy.classify_callback_error(exc).reason == "JSONDecodeError"
    assert taxonomy.classify_callback_error(ZeroDivisionError()) is None  # a bug, not a parse error


def test_user_parse_exception_from_settings():
    taxonomy = ErrorTaxonomy.from_settings(Settings({**DEFAULTS, "OPENCLAW_PARSE_EXCEPTIONS": ["ZeroDivisionError"]}))
    assert taxonomy.classify_callback_error(ZeroDivisionError()).error_class is ErrorClass.PARSE
    assert taxonomy.classify_callback_error(ValueError()) is None


def test_item_errors(taxonomy):
    assert taxonomy.classify_item_error(ItemValidationError("price")).error_class is ErrorClass.BUSINESS
    assert not taxonomy.classify_item_error(DropItem("duplicate"))  # a plain drop is not a failure


def _statuses(taxonomy):
    return {s for s in range(400, 600) if taxonomy.classify_status(s).retryable}


def test_retryable_statuses_follow_scrapy_retry_http_codes():
    from scrapy.settings import default_settings

    assert _statuses(ErrorTaxonomy.from_settings(Settings())) == set(default_settings.RETRY_HTTP_CODES)
    project = ErrorTaxonomy.from_settings(Settings({"RETRY_HTTP_CODES": [403]}))
    assert _statuses(project) == {403}
    # throttling stays a domain signal for the health middleware, retried or not
    assert project.classify_status(503).is_throttle and not project.classify_status(503).retryable
    ours = ErrorTaxonomy.from_settings(Settings({"RETRY_HTTP_CODES": [403], "OPENCLAW_RETRY_HTTP_CODES": [500, 429]}))
    assert _statuses(ours) == {500, 429}  # ours, when set, wins


class CustomDownloadError(Exception):
    pass


def test_a_projects_retry_exceptions_extend_the_network_class():
    from scrapy.settings import default_settings

    # Scrapy's default list is covered by our table and adds nothing
    assert ErrorTaxonomy.from_settings(Settings()).network_exceptions == ()
    assert ErrorTaxonomy.from_settings(Settings()).classify_download_error(CustomDownloadError()) is None
    settings = Settings({"RETRY_EXCEPTIONS": [f"{__name__}.CustomDownloadError", ZeroDivisionError]})
    taxonomy = ErrorTaxonomy.from_settings(settings)
    result = taxonomy.classify_download_error(Failure(CustomDownloadError("x")))
    assert (result.error_class, result.reason) == (ErrorClass.NETWORK, "CustomDownloadError")
    assert taxonomy.classify_download_error(ZeroDivisionError()).error_class is ErrorClass.NETWORK
    # ... extend, never narrow: the built-in reasons stay
    assert taxonomy.classify_download_error(txerror.DNSLookupError()).reason == "dns"
    assert len(default_settings.RETRY_EXCEPTIONS) > 2


def test_bad_retry_exceptions_name_the_setting():
    from scrapy_openclaw.errors import OpenClawConfigError

    with pytest.raises(OpenClawConfigError, match="setting RETRY_EXCEPTIONS: cannot import 'no.such.Error'"):
        ErrorTaxonomy.from_settings(Settings({"RETRY_EXCEPTIONS": ["no.such.Error"]}))
    with pytest.raises(OpenClawConfigError, match="setting RETRY_EXCEPTIONS: 'json.loads' is not an exception type"):
        ErrorTaxonomy.from_settings(Settings({"RETRY_EXCEPTIONS": ["json.loads"]}))
