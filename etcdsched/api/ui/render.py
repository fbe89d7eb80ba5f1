"""Jinja2 rendering for the dashboard: the environment, its filters, and
the security headers every page carries.

Autoescaping is on for every template, and the environment is strict
about undefined names, so a template that names a missing value fails in
the tests instead of printing nothing. Times are rendered in UTC inside a
``<time>`` element (``datetime`` and a ``title`` in UTC); ``ui.js``
rewrites the visible text into the viewer's own zone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import jinja2
from aiohttp import web
from markupsafe import Markup

from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.durations import format_duration

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
"""Scripts and styles only from the dashboard's own static files (no
inline script can run, even if some text escaped escaping), no framing
(clickjacking of the action buttons), and no caching of tenant data."""


def utc_iso(ms: int, with_ms: bool = False) -> str:
    moment = ms_to_utc(ms)
    text = moment.isoformat(timespec="milliseconds" if with_ms else "seconds")
    return text.replace("+00:00", "Z")


def time_element(ms: int | None, with_ms: bool = False) -> Markup:
    """``<time>`` in UTC; ``ui.js`` shows it in the viewer's zone, the
    title keeps UTC for hovering."""
    if ms is None:
        return Markup('<span class="muted">&ndash;</span>')
    iso = utc_iso(ms, with_ms)
    shown = iso.replace("T", " ").replace("Z", " UTC")
    precision = "ms" if with_ms else "s"
    return Markup('<time datetime="{0}" title="{1}" data-precision="{2}">{1}</time>').format(
        iso, shown, precision
    )


def duration_text(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.3f} s"
    return format_duration(timedelta(milliseconds=ms - ms % 1000))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("etcdsched.api.ui", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["when"] = time_element
    env.filters["when_ms"] = lambda ms: time_element(ms, with_ms=True)
    env.filters["duration"] = duration_text
    return env


ENVIRONMENT = _environment()


def render(
    template: str, status: int = 200, headers: dict[str, str] | None = None, **context: Any
) -> web.Response:
    """The page, as an HTML response with the security headers."""
    html = ENVIRONMENT.get_template(template).render(**context)
    return web.Response(
        text=html,
        status=status,
        content_type="text/html",
        headers={**SECURITY_HEADERS, **(headers or {})},
    )
