"""Signing in and out of the dashboard (see :mod:`etcdsched.api.ui.session`).

The login form is posted before there is a session, so the session's CSRF
token cannot protect it; without protection another site could post *its*
token and sign the victim into the attacker's tenant (login CSRF). The
form is protected by a double submit instead: showing the form sets a
random value in a short-lived pre-login cookie (``HttpOnly``,
``SameSite=Strict``, ``Path=/ui/``) and puts the same value in the form;
a POST whose form value does not match its cookie (compared in constant
time), or whose ``Origin`` names another host, is a 403. Another site can
neither read nor set that cookie, so it cannot make the two match.
"""

from __future__ import annotations

import secrets

from aiohttp import web

from etcdsched.api.routing import CONTEXT
from etcdsched.api.ui.render import render
from etcdsched.api.ui.session import (
    COOKIE,
    COOKIE_PATH,
    clear_session,
    csrf_token,
    dashboard_path,
    error_page,
    over_tls,
    same_origin,
    see_other,
    sent_csrf,
    set_session,
    tokens_match,
)
from etcdsched.model.errors import EtcdschedError, Forbidden, Unauthorized

MAX_TOKEN_CHARS = 512
LOGIN_COOKIE = "etcdsched_ui_login"
LOGIN_COOKIE_SECONDS = 3600
"""How long a login form may sit before it is posted: long enough for a
tab left open, short enough that a stolen value soon means nothing."""
EXPIRED_FORM = "The sign-in form expired or came from elsewhere: sign in again."


def _login_page(
    request: web.Request, next_path: str, status: int = 200, error: str = ""
) -> web.Response:
    """The form, with a fresh pre-login value in its cookie and its field."""
    value = secrets.token_urlsafe(32)
    response = render("login.html", status, who=None, csrf=value, next_path=next_path, error=error)
    response.set_cookie(
        LOGIN_COOKIE,
        value,
        max_age=LOGIN_COOKIE_SECONDS,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=over_tls(request),
    )
    return response


async def login_form(request: web.Request) -> web.StreamResponse:
    next_path = dashboard_path(request.query.get("next", ""), "/ui/jobs")
    return _login_page(request, next_path)


async def login(request: web.Request) -> web.StreamResponse:
    """Check the posted token as the API would; good, it becomes the
    session cookie. A wrong one shows the form again (401): the same
    per-address limit on unknown tokens applies as for the API. Without
    the pre-login value of its own cookie the form is refused (403) and
    shown again, with a fresh one."""
    if not same_origin(request):
        return error_page(request, Forbidden("cross-origin request refused"))
    form = await request.post()
    next_path = dashboard_path(str(form.get("next", "")), "/ui/jobs")
    if not tokens_match(sent_csrf(request, form), request.cookies.get(LOGIN_COOKIE, "")):
        return _login_page(request, next_path, 403, EXPIRED_FORM)
    secret = str(form.get("token", "")).strip()[:MAX_TOKEN_CHARS]
    try:
        await request.app[CONTEXT].auth.authenticate(f"Bearer {secret}", request.remote or "")
    except Unauthorized:
        error = "That token is unknown, expired or revoked."
        return _login_page(request, next_path, 401, error)
    except EtcdschedError as exc:
        return error_page(request, exc)
    response = see_other(next_path)
    set_session(response, request, secret)
    response.del_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    """Delete the session cookie. Not an :func:`~etcdsched.api.ui.session.action`:
    that refuses a revoked token before the handler runs, and the cookie
    of a revoked token must go too. The CSRF token is the HMAC of the
    cookie's value, which needs no valid token to check."""
    if not same_origin(request):
        return error_page(request, Forbidden("cross-origin request refused"))
    secret = request.cookies.get(COOKIE, "")
    form = await request.post()
    if secret and not tokens_match(sent_csrf(request, form), csrf_token(secret)):
        return error_page(request, Forbidden("missing or wrong CSRF token"))
    response = see_other("/ui/login")
    clear_session(response, request)
    return response


async def home(request: web.Request) -> web.StreamResponse:
    return see_other("/ui/jobs")
