"""Webhooks of a tenant, and the deliveries of a run (docs/webhooks.md).

Editors of a tenant manage its webhooks; viewers list them. No answer ever
carries a webhook's secret: it is write-only. Plain ``http://`` URLs and
private targets (loopback, private and other non-public networks) need an
admin's allowance, ``allow_http`` / ``allow_private``; link-local and cloud
metadata addresses are refused even then. An editor who changes the URL of
an allowed webhook drops the allowance (it was granted for the old URL).
Another tenant's webhooks are not found, like any other tenant's object.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from etcdsched.api.auth import Principal
from etcdsched.api.routes_runs import visible_run
from etcdsched.api.routing import Call, Route, json_model
from etcdsched.model.errors import Forbidden, InvalidInput, NotFound
from etcdsched.model.notify import WEBHOOK_NAME_PATTERN, EventKind
from etcdsched.model.notify_records import SECRET_FIELDS, Delivery, DeliveryState, Webhook
from etcdsched.model.notify_safety import redacted_url, target_refusal
from etcdsched.model.spec import TENANT_PATTERN
from etcdsched.store.outbox import run_deliveries_stored
from etcdsched.store.webhooks import WebhookStore

MIN_SECRET = 16


class WebhookBody(BaseModel):
    """``PUT /v1/tenants/{tenant}/webhooks/{name}``: the whole webhook.
    ``secret`` may be left out when replacing (the stored one is kept)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="https:// unless an admin allows http.")
    events: frozenset[EventKind] = Field(
        frozenset(),
        description="Events of every job of the tenant sent here; empty: only jobs whose"
        " spec.notify names this webhook.",
    )
    secret: str | None = Field(
        None,
        min_length=MIN_SECRET,
        max_length=256,
        description="The HMAC signing key (write-only: never returned).",
    )
    allow_http: bool | None = Field(None, description="Admin only: allow an http:// URL.")
    allow_private: bool | None = Field(
        None,
        description="Admin only: allow loopback and private targets (never link-local"
        " or cloud metadata ones).",
    )


class WebhookView(BaseModel):
    tenant: str
    name: str
    url: str = Field(description="Whole for editors; a viewer sees no path or query.")
    events: list[EventKind]
    allow_http: bool
    allow_private: bool
    created_ms: int
    updated_ms: int


class WebhookList(BaseModel):
    items: list[WebhookView]


class DeliveryView(BaseModel):
    event_id: str
    kind: EventKind
    webhook: str
    run_id: str
    attempt: int
    state: DeliveryState
    attempts: int
    last_status: int | None
    last_error: str
    created_ms: int
    next_attempt_ms: int
    last_attempt_ms: int | None
    ended_ms: int | None
    body: dict[str, Any]


class DeliveryList(BaseModel):
    items: list[DeliveryView]


def _view(hook: Webhook, who: Principal) -> WebhookView:
    """Never the secret; for a viewer, not the URL's path and query either
    (a Slack-style receiver's path is its credential)."""
    data = hook.model_dump(exclude={"v", *SECRET_FIELDS})
    data["events"] = sorted(hook.events)
    if not who.can("editor"):
        data["url"] = redacted_url(hook.url)
    return WebhookView.model_validate(data)


def _path(call: Call, *, name: bool = True, naming: bool = False) -> tuple[str, str]:
    """The path's tenant (404 unless the caller sees it) and webhook name:
    a name that cannot be a webhook's is not found, or, when ``naming``
    a new one, refused (422)."""
    tenant = call.match("tenant")
    if not re.fullmatch(TENANT_PATTERN, tenant) or not call.who.sees(tenant):
        raise NotFound(f"tenant {tenant[:64]} not found", field="tenant")
    hook = call.match("name") if name else ""
    if name and not re.fullmatch(WEBHOOK_NAME_PATTERN, hook):
        if not naming:
            raise NotFound(f"webhook {hook[:64]} not found", field="name")
        raise InvalidInput(
            "a webhook name is 1-63 lower-case letters, digits, '_', '.', '-'", field="name"
        )
    return tenant, hook


async def put_webhook(call: Call) -> web.StreamResponse:
    tenant, name = _path(call, naming=True)
    body = call.body_as(WebhookBody)
    webhooks = WebhookStore(call.services.store, call.services.keys)
    try:
        old: Webhook | None = (await webhooks.get(tenant, name)).value
    except NotFound:
        old = None
    admin = call.who.is_admin
    if not admin and (body.allow_http is not None or body.allow_private is not None):
        raise Forbidden("only an admin may set allow_http or allow_private")
    kept = old if old is not None and old.url == body.url else None
    allow_http = _allowed(body.allow_http, kept.allow_http if kept else False)
    allow_private = _allowed(body.allow_private, kept.allow_private if kept else False)
    _check_target(body.url, allow_http, allow_private)
    secret = body.secret or (old.secret if old is not None else "")
    if not secret:
        raise InvalidInput(
            f"a new webhook needs a secret ({MIN_SECRET}+ characters)", field="secret"
        )
    now = call.services.clock.now_ms()
    hook = Webhook(
        tenant=tenant,
        name=name,
        url=body.url,
        events=body.events,
        secret=secret,
        allow_http=allow_http,
        allow_private=allow_private,
        created_ms=old.created_ms if old is not None else now,
        updated_ms=now,
    )
    await webhooks.put(hook)
    return json_model(_view(hook, call.who))


def _allowed(asked: bool | None, kept: bool) -> bool:
    """An admin's explicit setting, else what the webhook had for this URL."""
    return kept if asked is None else asked


def _check_target(url: str, allow_http: bool, allow_private: bool) -> None:
    why = target_refusal(url, allow_http=allow_http, allow_private=allow_private)
    if why is not None:
        raise InvalidInput(why, field="url")


async def get_webhook(call: Call) -> web.StreamResponse:
    tenant, name = _path(call)
    hook = await WebhookStore(call.services.store, call.services.keys).get(tenant, name)
    return json_model(_view(hook.value, call.who))


async def list_webhooks(call: Call) -> web.StreamResponse:
    tenant, _ = _path(call, name=False)
    hooks = await WebhookStore(call.services.store, call.services.keys).list(tenant)
    return json_model(WebhookList(items=[_view(h, call.who) for h in hooks]))


async def delete_webhook(call: Call) -> web.StreamResponse:
    tenant, name = _path(call)
    await WebhookStore(call.services.store, call.services.keys).delete(tenant, name)
    return web.Response(status=204)


async def list_run_deliveries(call: Call) -> web.StreamResponse:
    run = (await visible_run(call, call.run_id())).value
    found = await run_deliveries_stored(
        call.services.store, call.services.keys, run.partition, run.id
    )
    return json_model(DeliveryList(items=[_delivery_view(d) for d in found]))


def _delivery_view(delivery: Delivery) -> DeliveryView:
    return DeliveryView.model_validate(delivery.model_dump(exclude={"v"}))


HOOK = "/v1/tenants/{tenant}/webhooks/{name}"
ROUTES = [
    Route(
        "PUT",
        HOOK,
        put_webhook,
        "Create or replace a webhook of a tenant (its secret is write-only)",
        "webhooks",
        body=WebhookBody,
        response=WebhookView,
    ),
    Route("GET", HOOK, get_webhook, "Read a webhook (no secret)", "webhooks", response=WebhookView),
    Route("DELETE", HOOK, delete_webhook, "Delete a webhook", "webhooks", status=204),
    Route(
        "GET",
        "/v1/tenants/{tenant}/webhooks",
        list_webhooks,
        "List a tenant's webhooks (no secrets)",
        "webhooks",
        response=WebhookList,
    ),
    Route(
        "GET",
        "/v1/runs/{run_id}/deliveries",
        list_run_deliveries,
        "A run's webhook deliveries: pending, delivered or failed",
        "webhooks",
        response=DeliveryList,
    ),
]
