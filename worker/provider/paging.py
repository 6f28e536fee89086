"""Paged reads of the provider that a wrong answer cannot make endless."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from worker.logs import get_logger
from worker.provider.models import Page

__all__ = ["DEFAULT_MAX_PAGES", "pages"]

log = get_logger(__name__)

DEFAULT_MAX_PAGES = 100
"""Pages one paged read fetches at most (`scheduler.max_pages`)."""

T = TypeVar("T")


async def pages(
    fetch: Callable[[int], Awaitable[Page[T]]], max_pages: int, *, what: str
) -> AsyncIterator[T]:
    """The records of pages 1, 2, ... as `fetch(page_num)` gives them, until the last page.

    A provider answer cannot make this endless: it stops after `max_pages` pages and on a page
    whose records are those of the page before (a server ignoring pageNum), each with a log line;
    the rest is read by the next run.
    """
    previous: tuple[list[T], int] | None = None
    page_num = 1
    while True:
        page = await fetch(page_num)
        seen = (page.records, page.refused)
        if previous is not None and seen == previous:
            log.warning(
                "paging stopped: page repeats the previous one",
                paged=what,
                page=page_num,
                totalPage=page.totalPage,
            )
            return
        for record in page.records:
            yield record
        # A page whose records were all refused (logged by the reader) is no last page.
        if not (page.records or page.refused) or page_num >= page.totalPage:
            return
        if page_num >= max_pages:
            log.warning(
                "paging stopped at the page cap; the rest is read next run",
                paged=what,
                pages=page_num,
                totalPage=page.totalPage,
            )
            return
        previous = seen
        page_num += 1
