"""Signing in and out of the dashboard (see :mod:`etcdsched.api.ui.session`)."""

from __future__ import annotations

from aiohttp import web

from etcdsched.api.routing import CONTEXT
from etcdsched.api.ui.render import render
from etcdsched.api.ui.session import (
    View,
    action,
    clear_session,
    dashboard_path,
    error_page,
    same_origin,
    see_other,
    set_session,
)
from etcdsched.model.errors import EtcdschedError, Forbidden, Unauthorized

MAX_TOKEN_CHARS = 512


async def login_form(request: web.Request) -> web.StreamResponse:
    next_path = dashboard_path(request.query.get("next", ""), "/ui/jobs")
    return render("login.html", who=None, csrf="", next_path=next_path, error="")


async def login(request: web.Request) -> web.StreamResponse:
    """Check the posted token as the API would; good, it becomes the
    session cookie. A wrong one shows the form again (401): the same
    per-address limit on unknown tokens applies as for the API."""
    if not same_origin(request):
        return error_page(request, Forbidden("cross-origin request refused"))
    form = await request.post()
    secret = str(form.get("token", "")).strip()[:MAX_TOKEN_CHARS]
    next_path = dashboard_path(str(form.get("next", "")), "/ui/jobs")
    try:
        await request.app[CONTEXT].auth.authenticate(f"Bearer {secret}", request.remote or "")
    except Unauthorized:
        error = "That token is unknown, expired or revoked."
        return render("login.html", 401, who=None, csrf="", next_path=next_path, error=error)
    except EtcdschedError as exc:
        return error_page(request, exc)
    response = see_other(next_path)
    set_session(response, request, secret)
    return response


@action
async def logout(view: View) -> web.StreamResponse:
    response = see_other("/ui/login")
    clear_session(response, view.request)
    return response


async def home(request: web.Request) -> web.StreamResponse:
    return see_other("/ui/jobs")
