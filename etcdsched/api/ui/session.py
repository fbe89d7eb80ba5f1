"""Dashboard sessions: the bearer token in a cookie, CSRF, and the wrappers
that turn a page or an action into an aiohttp handler.

The login form posts an API token; the :class:`~etcdsched.api.auth.Authenticator`
checks it exactly as for the JSON API, and the token itself becomes the
session cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` over TLS,
``Path=/ui/``). Holding the token rather than a server-side session id
means any API instance serves any session and a revoked token ends its
sessions everywhere at once, with no session store to keep.

Every state-changing form carries a CSRF token, the HMAC of the session's
token with a fixed label: a page of another site can neither read the
cookie nor compute the HMAC without it. A POST must also come from the
dashboard's own origin when the browser says where it came from
(``Origin``). Either check failing is a 403 before anything is read. The
login form, posted before there is a session, has its own token
(:mod:`etcdsched.api.ui.pages_login`).

Each page or action builds a :class:`~etcdsched.api.routing.Call` for the
caller and goes through the same functions and role checks as the JSON
routes (:meth:`View.require`), so a page never shows or does what the API
would refuse.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from aiohttp import web
from pydantic import BaseModel, ValidationError

from etcdsched.api.auth import Principal
from etcdsched.api.errors import validation_detail
from etcdsched.api.routing import CONTEXT, ApiContext, Call, CallHandler
from etcdsched.api.ui.render import render
from etcdsched.model.errors import EtcdschedError, Forbidden, InvalidInput, Unauthorized
from etcdsched.runtime.quoting import quoted

log = logging.getLogger(__name__)
COOKIE = "etcdsched_ui"
COOKIE_PATH = "/ui/"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_LABEL = b"etcdsched-ui-csrf-v1"


def csrf_token(secret: str) -> str:
    """The CSRF token of the session holding ``secret``."""
    return hmac.new(secret.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def sent_csrf(request: web.Request, form: Mapping[str, object]) -> str:
    """The CSRF token a POST carries: the form field, else the header."""
    return str(form.get(CSRF_FIELD, "")) or request.headers.get(CSRF_HEADER, "")


def tokens_match(sent: str, expected: str) -> bool:
    """Constant-time; an empty token never matches."""
    return bool(expected) and hmac.compare_digest(sent.encode(), expected.encode())


def over_tls(request: web.Request) -> bool:
    """Whether the browser reached us over TLS: directly, or through a TLS
    proxy that says so. Trusting the header can only make the cookie
    stricter (``Secure``), never looser."""
    return request.secure or request.headers.get("X-Forwarded-Proto", "") == "https"


def set_session(response: web.StreamResponse, request: web.Request, secret: str) -> None:
    response.set_cookie(
        COOKIE,
        secret,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=over_tls(request),
    )


def clear_session(response: web.StreamResponse, request: web.Request) -> None:
    response.del_cookie(
        COOKIE, path=COOKIE_PATH, httponly=True, samesite="Strict", secure=over_tls(request)
    )


def same_origin(request: web.Request) -> bool:
    """A POST's ``Origin`` (when sent: browsers send it with every form
    POST) names this host; ``null`` (a sandboxed or privacy-stripped
    origin) does not."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    forwarded = request.headers.get("X-Forwarded-Host")
    hosts = {request.host} | ({forwarded} if forwarded else set())
    return urlsplit(origin).netloc in hosts


@dataclass
class View:
    """One dashboard request from a signed-in caller."""

    request: web.Request
    ctx: ApiContext
    who: Principal
    secret: str

    @property
    def csrf(self) -> str:
        return csrf_token(self.secret)

    def call(
        self, body: BaseModel | None = None, query: BaseModel | None = None, size: int = 0
    ) -> Call:
        """The API call this request stands for: JSON route functions take it."""
        return Call(self.request, self.ctx, self.who, body, query, size)

    def require(self, handler: CallHandler) -> None:
        """403 unless the caller's role may use the JSON route of ``handler``:
        the dashboard asks for exactly what the API asks for."""
        self.who_may(handler, refuse=True)

    def who_may(self, handler: CallHandler, refuse: bool = False) -> bool:
        """Whether the caller's role may use the JSON route of ``handler``."""
        route = next(r for r in self.ctx.routes if r.handler is handler)
        if route.needs == "none" or self.who.can(route.needs):
            return True
        if refuse:
            raise Forbidden(f"this needs a token with the {route.needs} role or above")
        return False

    def page(self, template: str, status: int = 200, **context: Any) -> web.Response:
        """The page with what every page shows: who is signed in, the CSRF
        token for its forms."""
        return render(template, status, who=self.who, csrf=self.csrf, **context)


PageHandler = Callable[[View], Awaitable[web.StreamResponse]]


def login_url(request: web.Request) -> str:
    return f"/ui/login?next={quote(request.path_qs, safe='')}"


async def _signed_in(request: web.Request) -> View | None:
    """The caller's view, or None without a valid session cookie."""
    secret = request.cookies.get(COOKIE)
    if not secret:
        return None
    ctx = request.app[CONTEXT]
    try:
        who = await ctx.auth.authenticate(f"Bearer {secret}", request.remote or "")
    except Unauthorized:
        return None
    return View(request, ctx, who, secret)


def error_page(request: web.Request, exc: EtcdschedError, view: View | None = None) -> web.Response:
    """An error as a page with the API's status and message."""
    if exc.http_status >= 500:
        log.warning("dashboard request failed: %s: %s", exc.code, quoted(exc.message))
    status, code, message = exc.http_status, exc.code, exc.message
    if view is not None:
        return view.page("error.html", status, error_status=status, code=code, message=message)
    return render(
        "error.html", status, who=None, csrf="", error_status=status, code=code, message=message
    )


def page(handler: PageHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A GET page: signed-in callers only (others go to the login page),
    errors of our tree as error pages."""

    async def handle(request: web.Request) -> web.StreamResponse:
        view = None
        try:
            view = await _signed_in(request)
            if view is None:
                response = see_other(login_url(request))
                if COOKIE in request.cookies:
                    clear_session(response, request)
                return response
            return await handler(view)
        except EtcdschedError as exc:
            return error_page(request, exc, view)

    handle.__name__ = handler.__name__
    return handle


def action(handler: PageHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A POST: same origin, a valid session and its CSRF token, or 403
    before anything else is read."""

    async def handle(request: web.Request) -> web.StreamResponse:
        if not same_origin(request):
            return error_page(request, Forbidden("cross-origin request refused"))
        view = None
        try:
            view = await _signed_in(request)
            if view is None:
                raise Unauthorized("not signed in (or the token was revoked)")
            form = await request.post()
            if not tokens_match(sent_csrf(request, form), view.csrf):
                raise Forbidden("missing or wrong CSRF token")
            return await handler(view)
        except ValidationError as exc:
            message, field = validation_detail(exc)
            return error_page(request, InvalidInput(message, field=field), view)
        except EtcdschedError as exc:
            return error_page(request, exc, view)

    handle.__name__ = handler.__name__
    return handle


def see_other(location: str) -> web.Response:
    """303 to ``location``: after a POST the browser GETs the page."""
    return web.Response(status=303, headers={"Location": location})


def dashboard_path(raw: str, fallback: str) -> str:
    """``raw`` if it is a dashboard path (never another site), else ``fallback``."""
    if raw.startswith("/ui/") and not raw.startswith("//") and "\\" not in raw:
        return raw
    return fallback
