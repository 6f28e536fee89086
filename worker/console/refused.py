"""A refused request answered as a page of the console: its layout, what was refused and why,
and a link back to where the operator came from (docs/console.md).

The handlers refuse with aiohttp's HTTP errors and a plain-text reason; for a browser (one that
accepts HTML) this middleware renders that reason in `refused.html`, with the same status.
Scripts (the hosted page's refresh asks for JSON) keep the plain answer.
"""

from __future__ import annotations

import re

from aiohttp import web

from worker.console import pages
from worker.console.actions import safe_back
from worker.console.auth import Handler

# An action's page: /deposits/TX/submit -> /deposits/TX, /findings/7/ack -> /findings.
_DEPOSIT_ACTION = re.compile(r"^(/deposits/[^/]+)/[a-z-]+$")
_TITLES = {400: "Not done: the request was refused", 404: "Not found", 409: "Not done"}


async def _back(request: web.Request) -> str:
    """Where the refused request came from: the form's `back`, else the page of its subject."""
    if request.method == "POST" and request.content_type == "application/x-www-form-urlencoded":
        form = await request.post()  # read already by the handler: aiohttp keeps it
        back = form.get("back")
        if isinstance(back, str) and back:
            return safe_back(back)
    found = _DEPOSIT_ACTION.match(request.path)
    if found:
        return found.group(1)
    if request.path.startswith("/findings/"):
        return "/findings"
    return "/"


@web.middleware
async def refused_page(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render a 4xx refusal with a text reason as a console page when a browser asked."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        wants_html = "text/html" in request.headers.get("Accept", "")
        if not wants_html or not 400 <= exc.status < 500 or exc.status in (401, 403, 429):
            raise
        reason = exc.text or exc.reason
        context = {
            "title": _TITLES.get(exc.status, exc.reason),
            "reason": reason.removeprefix(f"{exc.status}: "),
            "back": await _back(request),
        }
        return pages.render("refused.html", request, context, status=exc.status)
