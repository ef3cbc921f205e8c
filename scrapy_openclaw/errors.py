"""The error taxonomy: every failure is classified once, here.

Retry budgets, health penalties, dead-letter records and metric labels all
use the :class:`Classification` this module returns, so that a 503 or a
dropped connection means the same thing to every component.
"""

from __future__ import annotations

import builtins
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from scrapy.settings import default_settings
from scrapy.utils.misc import load_object
from twisted.internet import error as txerror
from twisted.python.failure import Failure

from scrapy_openclaw.exceptions import ItemValidationError as ItemValidationError  # (re-exported: public names)
from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.exceptions import ParseError as ParseError
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.scrapy_internals import download_error_types, tunnel_error
from scrapy_openclaw.settings import OpenClawSettings, is_set

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings


class ErrorClass(str, enum.Enum):
    NETWORK = "network"
    PROTOCOL_RETRYABLE = "protocol_retryable"
    PROTOCOL_PERMANENT = "protocol_permanent"
    PARSE = "parse"
    BUSINESS = "business"
    BLOCKED = "blocked"  # a ban or challenge page (see BAN_MARKERS), whatever its status

    def __str__(self) -> str:
        return self.value


# What a network failure was, for health penalties and labels. "timeout" is
# penalised as a timeout, every other reason as a connection failure.
TIMEOUT = "timeout"
DNS = "dns"
REFUSED = "refused"
CONNECTION_LOST = "connection_lost"
CONNECT_FAILED = "connect_failed"
TLS = "tls"
DATA_LOSS = "data_loss"
OTHER_NETWORK = "network_error"


@dataclass(frozen=True)
class Classification:
    """What went wrong: the class, a short stable reason, and the HTTP status."""

    error_class: ErrorClass
    reason: str  # "http_503", "timeout", "dns", "ValueError", ...
    status: int | None = None

    @property
    def retryable(self) -> bool:
        return self.error_class in RETRYABLE_CLASSES

    @property
    def is_throttle(self) -> bool:
        """The server asked us to slow down (429, 503)."""
        return self.status in (429, 503)

    @property
    def is_timeout(self) -> bool:
        return self.reason == TIMEOUT


RETRYABLE_CLASSES = frozenset({ErrorClass.NETWORK, ErrorClass.PROTOCOL_RETRYABLE, ErrorClass.PARSE, ErrorClass.BLOCKED})


@dataclass(frozen=True)
class BanMarker:
    """Text that makes an answer a ban or challenge page: in its headers (``name: value``,
    lower case) or in the start of its body (case-insensitive)."""

    name: str  # names the reason: "blocked_<name>"
    body: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()


#: Statuses on which the built-in markers are looked for (a 200 ban page needs a marker
#: the domain's policy lists: ``health.ban_markers``).
BAN_STATUSES = frozenset({403, 429, 503})
#: The built-in challenge markers, kept small: each is specific to a bot-protection
#: vendor's challenge or block page, so an ordinary error page does not match.
BAN_MARKERS: tuple[BanMarker, ...] = (
    BanMarker(
        "cloudflare",
        body=("cf-chl", "<title>just a moment...</title>", "attention required! | cloudflare"),
        headers=("cf-mitigated: challenge",),
    ),
    BanMarker("captcha", body=("g-recaptcha", "h-captcha", "cf-turnstile", "captcha-form")),
    BanMarker("datadome", body=("captcha-delivery.com",), headers=("x-datadome: protected",)),
    BanMarker("perimeterx", body=("px-captcha", "_pxappid")),
    BanMarker("akamai", body=("errors.edgesuite.net",)),
)
#: Bytes of a body searched for markers: challenge pages are small, and a marker a
#: policy lists is expected near the top (a captcha form, a login wall).
BAN_SCAN_BYTES = 256 * 1024


def _network_table() -> list[tuple[tuple[type[BaseException], ...], str]]:
    return [
        (
            (*download_error_types("DownloadTimeoutError"), txerror.TimeoutError, TimeoutError),
            TIMEOUT,
        ),
        ((*download_error_types("CannotResolveHostError"), txerror.DNSLookupError), DNS),
        (
            (*download_error_types("DownloadConnectionRefusedError"), txerror.ConnectionRefusedError),
            REFUSED,
        ),
        (download_error_types("ResponseDataLossError"), DATA_LOSS),
        (
            (
                txerror.ConnectionDone,
                txerror.ConnectionLost,
                ConnectionResetError,
                ConnectionAbortedError,
            ),
            CONNECTION_LOST,
        ),
        ((tunnel_error(),), TLS),
        (
            (*download_error_types("DownloadFailedError"), txerror.ConnectError, OSError),
            CONNECT_FAILED,
        ),
    ]


_NETWORK_TABLE: list[tuple[tuple[type[BaseException], ...], str]] = []


def _unwrap(exc: BaseException | Failure) -> BaseException:
    """The exception itself, out of its Failure if wrapped."""
    if isinstance(exc, Failure):
        # (Twisted infers ``value`` Optional from its None placeholder; a built Failure always holds one)
        return cast(BaseException, exc.value)
    return exc


def _network_reason(exc: BaseException) -> str | None:
    """Name a download failure, or None if it is not a network failure."""
    if not _NETWORK_TABLE:
        _NETWORK_TABLE.extend(_network_table())
    for types, reason in _NETWORK_TABLE:
        if types and isinstance(exc, types):
            return reason
    # Twisted wraps HTTP/1.1 client failures (ResponseNeverReceived,
    # ResponseFailed) around the real reasons.
    reasons = getattr(exc, "reasons", None)
    if reasons:
        inner = reasons[0].value if isinstance(reasons[0], Failure) else reasons[0]
        if isinstance(inner, BaseException):
            return _network_reason(inner) or CONNECTION_LOST
    name = type(exc).__name__
    if name in ("ResponseNeverReceived", "ResponseFailed", "RequestGenerationFailed"):
        return CONNECTION_LOST
    return None


class ErrorTaxonomy:
    """Classifies responses and exceptions according to the crawl's settings."""

    def __init__(
        self,
        retry_http_codes: frozenset[int],
        parse_exceptions: tuple[type[BaseException], ...],
        validation_exceptions: tuple[type[BaseException], ...],
        network_exceptions: tuple[type[BaseException], ...] = (),
    ):
        self.retry_http_codes = retry_http_codes
        self.parse_exceptions = parse_exceptions
        self.validation_exceptions = validation_exceptions
        # beyond the built-in table: the project's RETRY_EXCEPTIONS
        self.network_exceptions = network_exceptions

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ErrorTaxonomy:
        """Validate *settings* and build the taxonomy they describe (outside a crawl)."""
        return cls.from_config(OpenClawSettings.from_settings(settings), settings)

    @classmethod
    def from_config(cls, config: OpenClawSettings, settings: BaseSettings) -> ErrorTaxonomy:
        """Statuses: ``OPENCLAW_RETRY_HTTP_CODES`` when set, else Scrapy's
        ``RETRY_HTTP_CODES``; a project's ``RETRY_EXCEPTIONS`` extend the network class."""
        codes: Any = config.retry_http_codes
        if codes is None:
            codes = settings.getlist("RETRY_HTTP_CODES", _scrapy_default("RETRY_HTTP_CODES"))
        network: tuple[type[BaseException], ...] = ()
        if is_set(settings, "RETRY_EXCEPTIONS"):
            network = _load_types("RETRY_EXCEPTIONS", settings.getlist("RETRY_EXCEPTIONS"))
        return cls(
            retry_http_codes=_status_codes(codes),
            parse_exceptions=_load_types("OPENCLAW_PARSE_EXCEPTIONS", config.parse_exceptions),
            validation_exceptions=_load_types("OPENCLAW_VALIDATION_EXCEPTIONS", config.validation_exceptions),
            network_exceptions=network,
        )

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> ErrorTaxonomy:
        """The crawl's one taxonomy (built once from its settings)."""
        config = OpenClawSettings.for_crawler(crawler)
        return shared(crawler, "taxonomy", lambda: cls.from_config(config, crawler.settings))

    def classify_status(self, status: int) -> Classification | None:
        """None for a success (1xx-3xx); otherwise retryable or permanent."""
        if status < 400:
            return None
        if status in self.retry_http_codes:
            return Classification(ErrorClass.PROTOCOL_RETRYABLE, f"http_{status}", status)
        return Classification(ErrorClass.PROTOCOL_PERMANENT, f"http_{status}", status)

    def classify_ban(
        self,
        status: int,
        headers: Any,
        body: bytes,
        *,
        markers: tuple[str, ...] = (),
        builtin: bool = True,
    ) -> Classification | None:
        """A ban or challenge page: a built-in marker on a 403/429/503 (with *builtin*), or
        one of the domain's own *markers* (any status, 200 included); None otherwise.

        *headers* is a Scrapy ``Headers`` (or any mapping of bytes/str to values).
        """
        if not markers and not (builtin and status in BAN_STATUSES):
            return None  # the common case costs one set lookup
        text = body[:BAN_SCAN_BYTES].decode("utf-8", "replace").lower()
        for marker in markers:
            if marker.lower() in text:
                return Classification(ErrorClass.BLOCKED, "blocked_policy", status)
        if not (builtin and status in BAN_STATUSES):
            return None
        lines = _header_lines(headers)
        for known in BAN_MARKERS:
            if any(m in text for m in known.body) or any(h in lines for h in known.headers):
                return Classification(ErrorClass.BLOCKED, f"blocked_{known.name}", status)
        return None

    def classify_download_error(self, exc: BaseException | Failure) -> Classification | None:
        """Classify an exception raised while downloading; None if not a network error."""
        exc = _unwrap(exc)
        reason = _network_reason(exc)
        if reason is None:
            if not isinstance(exc, self.network_exceptions):
                return None
            reason = type(exc).__name__
        return Classification(ErrorClass.NETWORK, reason)

    def classify_callback_error(self, exc: BaseException | Failure) -> Classification | None:
        """Classify an exception raised by a spider callback; None if it is a bug."""
        exc = _unwrap(exc)
        if isinstance(exc, self.parse_exceptions):
            return Classification(ErrorClass.PARSE, type(exc).__name__)
        return None

    def classify_item_error(self, exc: BaseException | Failure) -> Classification | None:
        """Classify an exception raised by a pipeline; None if not a validation error."""
        exc = _unwrap(exc)
        if isinstance(exc, self.validation_exceptions):
            return Classification(ErrorClass.BUSINESS, type(exc).__name__)
        return None


def _header_lines(headers: Any) -> frozenset[str]:
    """``name: value`` lines in lower case, one per value."""
    out = set()
    for name, values in (headers or {}).items():
        if not isinstance(values, (list, tuple)):
            values = [values]
        key = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        for value in values:
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            out.add(f"{key.lower()}: {text.strip().lower()}")
    return frozenset(out)


def _scrapy_default(name: str) -> Any:
    return getattr(default_settings, name)


def _status_codes(codes: Any) -> frozenset[int]:
    if isinstance(codes, (str, int)):
        codes = str(codes).split(",")
    try:
        return frozenset(int(x) for x in codes)
    except (TypeError, ValueError):
        raise OpenClawConfigError(f"retryable HTTP codes: expected a list of status codes, got {codes!r}") from None


def _load_types(name: str, values: Any) -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = []
    for path in values:
        try:
            obj: Any = path if isinstance(path, type) else _load_builtin_or_object(path)
        except OpenClawConfigError as exc:
            raise OpenClawConfigError(f"setting {name}: {exc}") from None
        if not (isinstance(obj, type) and issubclass(obj, BaseException)):
            raise OpenClawConfigError(f"setting {name}: {path!r} is not an exception type")
        types.append(obj)
    return tuple(types)


def _load_builtin_or_object(path: str) -> Any:
    if "." not in path:
        try:
            return getattr(builtins, path)
        except AttributeError:
            raise OpenClawConfigError(f"unknown exception type {path!r}") from None
    try:
        return load_object(path)
    except (ImportError, NameError, ValueError) as exc:
        raise OpenClawConfigError(f"cannot import {path!r}: {exc}") from None
