"""A crawl whose configuration is wrong stops at start with one line and exit status 1.

An :class:`~scrapy_openclaw.exceptions.OpenClawConfigError` is a message for a
person, not a bug, yet Scrapy reports an exception that ends a crawl's start as a
traceback (asyncio's "Task exception was never retrieved", Twisted's "Unhandled
error in Deferred"). :func:`refuse_start` logs it once, on one line, instead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, TypeVar

from scrapy_openclaw.exceptions import OpenClawConfigError
from scrapy_openclaw.scrapy_internals import fail_bootstrap

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

F = TypeVar("F", bound="Callable[..., Any]")


def refuse_start(crawler: Crawler | None, exc: OpenClawConfigError) -> None:
    """Report *exc*, which stops *crawler* before it crawls, once and on one line.

    The crawl task's exception is marked as seen so that asyncio does not print it
    again; the exception still propagates, so a script that awaits the crawl gets it.
    """
    if getattr(exc, "reported", False):
        return
    exc.reported = True  # type: ignore[attr-defined]
    logger.error(
        "Crawl not started: %(error)s",
        {"error": exc},
        extra={"crawler": crawler} if crawler is not None else None,
    )
    if crawler is not None:
        fail_bootstrap(crawler)
    _seen_by_task(exc)


def reports_config_errors(from_crawler: F) -> F:
    """Decorate a component's ``from_crawler``: its configuration errors go through :func:`refuse_start`."""

    @functools.wraps(from_crawler)
    def wrapper(cls: Any, crawler: Crawler, *args: Any, **kwargs: Any) -> Any:
        try:
            return from_crawler(cls, crawler, *args, **kwargs)
        except OpenClawConfigError as exc:
            refuse_start(crawler, exc)
            raise

    return wrapper  # type: ignore[return-value]


def _seen_by_task(exc: BaseException) -> None:
    """When *exc* ends the running asyncio task, retrieve it there (it was reported already).

    Any other exception that ends the task is handed to the loop's exception
    handler, as asyncio would have done.
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop (a Deferred-based runner, a unit test)
        return
    if task is None:
        return

    def retrieve(done: asyncio.Task[Any]) -> None:
        if done.cancelled():
            return
        error = done.exception()
        if error is not None and error is not exc:
            done.get_loop().call_exception_handler(
                {"message": "Task exception was never retrieved", "exception": error, "future": done}
            )

    task.add_done_callback(retrieve)
