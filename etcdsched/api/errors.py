"""The one place where failures become HTTP responses.

Every error body has the shape ``{"error": {"code", "message", "field"}}``:
``code`` is stable and machine-readable, ``field`` names the input at fault
(``spec.trigger.every``, ``limit``, ``Idempotency-Key``) or is ``null``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import traceback

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from etcdsched.model.errors import EtcdschedError, InvalidInput, QuotaExceeded, Unauthorized
from etcdsched.runtime.quoting import quoted

log = logging.getLogger(__name__)
MAX_LISTED_ERRORS = 5
MAX_RETRY_AFTER = 3600
"""Seconds: the most a ``Retry-After`` ever says (a tiny quota rate would
otherwise ask for centuries, in a header hundreds of digits long)."""
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class MalformedRequest(InvalidInput):
    """The body is not JSON, or not the JSON value the route expects (HTTP 400)."""

    code = "malformed_request"
    http_status = 400


class UnsupportedMediaType(InvalidInput):
    """A request body that is not ``application/json`` (HTTP 415)."""

    code = "unsupported_media_type"
    http_status = 415


def retry_after_seconds(seconds: float) -> int:
    """What ``Retry-After`` says for a wait of ``seconds``: whole seconds,
    rounded up, at least 1 and at most :data:`MAX_RETRY_AFTER` (also for
    an infinite or NaN wait, which a rate near zero can produce)."""
    if not math.isfinite(seconds) or seconds >= MAX_RETRY_AFTER:
        return MAX_RETRY_AFTER
    return max(1, math.ceil(seconds))


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"code": code, "message": message, "field": field}}
    return web.json_response(body, status=status, headers=headers)


def field_path(loc: tuple[int | str, ...]) -> str | None:
    return ".".join(str(part) for part in loc) or None


def validation_response(exc: ValidationError, prefix: tuple[str, ...] = ()) -> web.Response:
    """422 naming the first invalid field; the message lists the first few."""
    message, field = validation_detail(exc, prefix)
    return error_response(422, InvalidInput.code, message, field)


def validation_detail(exc: ValidationError, prefix: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """The message (the first few invalid fields, each with why) and the
    first invalid field of a validation error, its paths under ``prefix``."""
    errors = exc.errors(include_url=False)
    if not errors:
        return str(exc), field_path(prefix)
    parts = [
        f"{field_path((*prefix, *err['loc'])) or '(body)'}: {err['msg']}"
        for err in errors[:MAX_LISTED_ERRORS]
    ]
    if len(errors) > MAX_LISTED_ERRORS:
        parts.append(f"and {len(errors) - MAX_LISTED_ERRORS} more")
    return "; ".join(parts), field_path((*prefix, *errors[0]["loc"]))


def _etcdsched_response(exc: EtcdschedError) -> web.Response:
    headers = None
    if isinstance(exc, QuotaExceeded):
        headers = {"Retry-After": str(retry_after_seconds(exc.retry_after))}
    if isinstance(exc, Unauthorized):  # RFC 6750: say which scheme to use
        headers = {"WWW-Authenticate": 'Bearer realm="etcdsched"'}
    if exc.http_status >= 500:
        log.warning("request failed: %s: %s", exc.code, quoted(exc.message))
    return error_response(exc.http_status, exc.code, exc.message, exc.field, headers)


def _http_response(exc: web.HTTPException) -> web.Response:
    code = _HTTP_CODES.get(exc.status, "http_error")
    headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
    return error_response(exc.status, code, exc.reason, None, headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map exceptions to JSON error bodies: our error tree by its
    ``http_status``, pydantic validation to 422, aiohttp's own HTTP errors
    (unknown route, wrong method, body too large) to JSON with their status,
    and anything else to a logged 500 that leaks no detail."""
    try:
        return await handler(request)
    except EtcdschedError as exc:
        return _etcdsched_response(exc)
    except ValidationError as exc:
        return validation_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_response(exc)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:
        _log_unexpected(request, exc)
        return error_response(500, "internal", "internal server error")


def _log_unexpected(request: web.Request, exc: Exception) -> None:
    """The traceback's frames (our source lines) as they are; the path and
    the exception's message, which may carry a tenant's input, quoted."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    log.error(
        "unexpected error in %s %s: %s: %s\nTraceback (most recent call last):\n%s",
        request.method,
        quoted(request.path),
        type(exc).__name__,
        quoted(exc),
        frames.rstrip(),
    )
