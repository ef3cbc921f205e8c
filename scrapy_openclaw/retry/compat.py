"""How Scrapy's own retry settings, meta keys and stats map onto classified retry.

A project that adds the add-on keeps what its ``RETRY_*`` settings mean; the
docs/retry.md ("Scrapy's retry settings") says how, this module does it.
"Set" means set above Scrapy's default priority (by the project, a spider,
the command line or an add-on): Scrapy's defaults leave our policy in charge.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.utils.python import global_object_name
from scrapy.utils.response import response_status_message
from twisted.python.failure import Failure

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.runtime import shared
from scrapy_openclaw.settings import is_set as is_set  # (re-exported: Scrapy's settings a project set)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

    from scrapy_openclaw.errors import Classification

#: Scrapy's stats prefix (``retry/count``, ``retry/max_reached``, ``retry/reason_count/<reason>``).
SCRAPY_STATS_PREFIX = "retry"
#: What Scrapy logs a give-up at when ``RETRY_GIVE_UP_LOG_LEVEL`` is unset (or absent, Scrapy < 2.17).
DEFAULT_GIVE_UP_LOG_LEVEL = "ERROR"


def log_level(value: int | str, where: str = "give-up log level") -> int:
    """A logging level from a number or a name (``"ERROR"``), as Scrapy reads it."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise OpenClawConfigError(f"{where}: expected a logging level, got {value!r}")
    if isinstance(value, int):
        return value
    level = logging.getLevelName(value.upper())
    if not isinstance(level, int):
        raise OpenClawConfigError(f"{where}: unknown logging level {value!r}")
    return level


@dataclass(frozen=True)
class ScrapyRetrySettings:
    """Scrapy's retry settings as they apply to classified retry, read once per crawl."""

    #: ``RETRY_TIMES`` when set (retries per request, all classes), else None: the policy's.
    retry_times: int | None
    priority_adjust: int
    give_up_log_level: int
    #: ``RETRY_TIMES`` as Scrapy reads it (2 by default): robots.txt is retried as Scrapy retries it
    robots_retry_times: int = 2

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> ScrapyRetrySettings:
        level = settings.get("RETRY_GIVE_UP_LOG_LEVEL")
        return cls(
            retry_times=settings.getint("RETRY_TIMES") if is_set(settings, "RETRY_TIMES") else None,
            priority_adjust=settings.getint("RETRY_PRIORITY_ADJUST"),
            give_up_log_level=log_level(
                DEFAULT_GIVE_UP_LOG_LEVEL if level is None else level, "setting RETRY_GIVE_UP_LOG_LEVEL"
            ),
            robots_retry_times=settings.getint("RETRY_TIMES"),
        )

    @classmethod
    def for_crawler(cls, crawler: Crawler) -> ScrapyRetrySettings:
        return shared(crawler, "scrapy_retry_settings", lambda: cls.from_settings(crawler.settings))


def scrapy_reason(
    classification: Classification,
    *,
    response: Response | None = None,
    exception: BaseException | Failure | None = None,
) -> str:
    """The reason Scrapy's RetryMiddleware would name in ``retry/reason_count/<reason>``.

    ``"503 Service Unavailable"`` for a status, the exception's class path
    (``"twisted.internet.error.ConnectionLost"``) for an exception, else ours.
    """
    if isinstance(exception, Failure):
        exception = exception.value
    if exception is not None:
        return global_object_name(type(exception))
    status = response.status if response is not None else classification.status
    if status is not None:
        return response_status_message(status)
    return classification.reason
