"""API tokens: create, list, revoke (see :mod:`etcdsched.api.auth` for roles).

An admin manages every token; a tenant-admin manages its own tenant's
tokens of no higher role than its own (so not an admin token that happens
to name its tenant), and can give no one more than its own role. Another tenant's token is reported
as not found, like any other tenant's object.
"""

from __future__ import annotations

from aiohttp import web

from etcdsched.api.auth import ROLE_RANK, Principal, TokenRecord, create_token
from etcdsched.api.routing import Call, Route, json_model
from etcdsched.api.schemas import TokenBody, TokenCreated, TokenList, TokenView
from etcdsched.model.errors import Conflict, Forbidden, InvalidInput, NotFound
from etcdsched.store.cache import list_all
from etcdsched.store.kv import Cmp, Ops, prefix_end

TOKEN_ID_LENGTH = 64


def _view(token_id: str, record: TokenRecord) -> TokenView:
    return TokenView(id=token_id, **record.model_dump(exclude={"v"}))


def _may_grant(who: Principal, tenant: str, role: str) -> None:
    if not who.sees(tenant):
        raise Forbidden(f"a token of tenant {who.tenant} cannot make tokens of {tenant}")
    if ROLE_RANK[role] > ROLE_RANK[who.role]:
        raise Forbidden(f"a {who.role} token cannot make a {role} token")


def _manages(who: Principal, record: TokenRecord) -> bool:
    """Its tenant's tokens of no higher role than the caller's (an admin: all)."""
    return who.sees(record.tenant) and ROLE_RANK[record.role] <= ROLE_RANK[who.role]


async def create_api_token(call: Call) -> web.StreamResponse:
    body = call.body_as(TokenBody)
    tenant = body.tenant or call.who.tenant
    _may_grant(call.who, tenant, body.role)
    services = call.services
    now_ms = services.clock.now_ms()
    expires = now_ms + int(body.expires_in.total_seconds() * 1000) if body.expires_in else None
    issued = await create_token(
        services.store,
        services.keys,
        tenant=tenant,
        role=body.role,
        name=body.name,
        now_ms=now_ms,
        expires_ms=expires,
    )
    created = TokenCreated(token=issued.secret, **_view(issued.id, issued.record).model_dump())
    return json_model(created, 201)


async def list_tokens(call: Call) -> web.StreamResponse:
    keys = call.services.keys
    prefix = keys.tokens_prefix()
    items, _ = await list_all(call.services.store, prefix, prefix_end(prefix))
    views = []
    for key, kv in sorted(items.items()):
        record = kv.decode(TokenRecord).value
        if _manages(call.who, record):
            views.append(_view(key.removeprefix(prefix), record))
    return json_model(TokenList(items=views))


async def revoke_token(call: Call) -> web.StreamResponse:
    """Compare: the token is the one we read and checked the tenant of (its
    last use may be written meanwhile: then read it again)."""
    token_id = call.match("token_id")
    if len(token_id) != TOKEN_ID_LENGTH or not all(c in "0123456789abcdef" for c in token_id):
        raise InvalidInput("a token id is 64 lower-case hex digits", field="token_id")
    key = call.services.keys.token(token_id)
    for _ in range(3):
        kv = await call.services.store.get(key)
        if kv is None or not _manages(call.who, kv.decode(TokenRecord).value):
            raise NotFound(f"token {token_id} not found", field="token_id")
        result = await call.services.store.txn([Cmp.mod(key, kv.mod_revision)], [Ops.delete(key)])
        if result.succeeded:
            return web.Response(status=204)
    raise Conflict(f"token {token_id} keeps changing; try again")


ROUTES = [
    Route(
        "POST",
        "/v1/tokens",
        create_api_token,
        "Create an API token",
        "tokens",
        body=TokenBody,
        response=TokenCreated,
        status=201,
        auth="tenant-admin",
    ),
    Route(
        "GET",
        "/v1/tokens",
        list_tokens,
        "List tokens (never their secrets)",
        "tokens",
        response=TokenList,
        auth="tenant-admin",
    ),
    Route(
        "DELETE",
        "/v1/tokens/{token_id}",
        revoke_token,
        "Revoke a token (every API instance refuses it within a second)",
        "tokens",
        status=204,
        auth="tenant-admin",
    ),
]
