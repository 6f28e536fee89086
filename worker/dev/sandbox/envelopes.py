"""The sandbox's answers in the interface's three envelope forms (wallet/stable, e-mail
verification, partner), with exact decimals."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from worker.provider import jsonio

PARTNER_SUCCESS = "SUCCESS"
PARTNER_BAD_REQUEST = "INVALID_PARAMETER"


def trace_id() -> str:
    """A fresh trace id."""
    return uuid.uuid4().hex


def respond(
    payload: Mapping[str, Any], status: int = 200, *, numbers: bool = False
) -> web.Response:
    """A JSON answer with exact decimals (`numbers`: decimals as JSON numbers)."""
    body = jsonio.dumpb(payload, decimals_as_numbers=numbers)
    return web.Response(body=body, status=status, content_type="application/json")


def ok_envelope(data: Any, *, success: bool | None = None) -> dict[str, Any]:
    """The wallet envelope of a success (`success` for the stable contract)."""
    out: dict[str, Any] = {"status": 200, "code": None, "msg": "OK", "traceId": trace_id()}
    if success is not None:
        out["success"] = success
    out["data"] = data
    return out


def fail_envelope(code: str, msg: str) -> dict[str, Any]:
    """The wallet envelope of a business failure (sent with HTTP 200)."""
    return {
        "status": 500,
        "code": code,
        "msg": msg,
        "success": False,
        "traceId": trace_id(),
        "data": None,
    }


def partner_ok(data: Any) -> dict[str, Any]:
    """The partner envelope of a success."""
    return {"code": PARTNER_SUCCESS, "message": "success", "data": data, "trace_id": trace_id()}


def partner_fail(code: str, message: str) -> dict[str, Any]:
    """The partner envelope of a business failure."""
    return {"code": code, "message": message, "data": None, "trace_id": trace_id()}


class PartnerFailure(Exception):
    """A partner operation refuses the request: answered with the partner envelope."""

    def __init__(self, message: str, code: str = PARTNER_BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StableFailure(Exception):
    """A stable operation refuses the request: wallet envelope with success false."""

    def __init__(self, message: str, code: str = "VALIDATION_FAILED") -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class MissingInput(Exception):
    """A request lacks a header or query parameter it needs: a plain HTTP 400 with the wallet
    envelope (no wallet code: the wallet codes are about payer details and deposits)."""


def bad_request(msg: str) -> dict[str, Any]:
    """The wallet envelope of a plain bad request (sent with HTTP 400)."""
    return {"status": 400, "code": None, "msg": msg, "traceId": trace_id(), "data": None}
