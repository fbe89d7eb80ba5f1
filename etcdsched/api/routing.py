"""The route table: one :class:`Route` per operation, used both to register
handlers and to build the OpenAPI document, so the two cannot drift.

Binding a route wraps its handler: authenticate (unless ``auth="none"``),
check the role, parse and validate the query string and JSON body against the
route's pydantic models, and hand the handler a :class:`Call`. Handlers
therefore never see unvalidated input, and every write validates before it
touches etcd.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from etcdsched.api.auth import Authenticator, Principal
from etcdsched.api.body import read_json
from etcdsched.api.errors import MalformedRequest, validation_detail
from etcdsched.api.quotas import Quotas
from etcdsched.api.services import ApiServices
from etcdsched.model.errors import Forbidden, InvalidInput, NotFound, QuotaExceeded
from etcdsched.model.records import STORAGE_ONLY, JobRecord
from etcdsched.store.keys import JOB_ID_PATTERN, full_job_id, tenant_of_job

M = TypeVar("M", bound=BaseModel)
AuthMode = Literal["none", "viewer", "editor", "tenant-admin", "admin"]
"""Who may call a route: nobody needs a token (none), or a token of at least this role."""


@dataclass(frozen=True)
class Header:
    """A request or response header of a route, as documented (a request
    header is validated by its handler, which must agree with ``schema``)."""

    name: str
    description: str
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "string"})
    required: bool = False


class FollowSlots:
    """Log follow streams open per tenant in this process, bounded: each
    holds a connection (and polls etcd) for as long as its attempt runs."""

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._open: dict[str, int] = {}

    @contextlib.contextmanager
    def hold(self, tenant: str) -> Iterator[None]:
        if self._open.get(tenant, 0) >= self.per_tenant:
            raise QuotaExceeded(
                f"tenant {tenant} has {self.per_tenant} log follows open here (the most)",
                retry_after=5.0,
            )
        self._open[tenant] = self._open.get(tenant, 0) + 1
        try:
            yield
        finally:
            self._open[tenant] -= 1


@dataclass
class ApiContext:
    """Per-application state shared by all requests."""

    services: ApiServices
    auth: Authenticator
    quotas: Quotas
    max_body_bytes: int
    follows: FollowSlots = field(default_factory=lambda: FollowSlots(32))
    routes: Sequence[Route] = ()
    openapi: dict[str, object] = field(default_factory=dict)


CONTEXT = web.AppKey("etcdsched_api", ApiContext)


@dataclass
class Call:
    """One request after authentication and validation."""

    request: web.Request
    ctx: ApiContext
    principal: Principal | None
    body: BaseModel | None
    query: BaseModel | None
    body_bytes: int = 0
    """Size of the request body as it came (0 without one)."""

    @property
    def services(self) -> ApiServices:
        return self.ctx.services

    @property
    def who(self) -> Principal:
        assert self.principal is not None, "route is not authenticated"
        return self.principal

    def match(self, name: str) -> str:
        return self.request.match_info[name]

    def job_id(self) -> str:
        """The path's job as a full id (``<tenant>:<name>``): a bare name is
        the caller's own tenant's; another tenant's is not found."""
        return full_id_for(self.who, self.match("job_id"), "job_id")

    def run_id(self) -> str:
        """The path's run, its job part resolved as :meth:`job_id` does."""
        raw = self.match("run_id")
        job_part, sep, seq = raw.rpartition("@")
        if not sep:
            raise NotFound(f"run {raw} not found", field="run_id")
        return f"{full_id_for(self.who, job_part, 'run_id')}@{seq}"

    def body_as(self, model: type[M]) -> M:
        assert isinstance(self.body, model), f"route body is not {model.__name__}"
        return self.body

    def query_as(self, model: type[M]) -> M:
        assert isinstance(self.query, model), f"route query is not {model.__name__}"
        return self.query


def full_id_for(who: Principal, raw: str, field: str) -> str:
    """``raw`` (a job name or full id, from a path) as a full job id, or 404:
    another tenant's id is indistinguishable from a missing one."""
    tenant = tenant_of_job(raw) or who.tenant
    if not JOB_ID_PATTERN.fullmatch(raw) or not who.sees(tenant):
        raise NotFound(f"{raw} not found", field=field)
    return full_job_id(tenant, raw)


CallHandler = Callable[[Call], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """One operation of the API."""

    method: str
    path: str
    handler: CallHandler
    summary: str
    tag: str
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    auth: AuthMode | None = None
    """Default: ``viewer`` for reads (GET), ``editor`` for every other method."""
    headers: tuple[Header, ...] = ()
    media_type: str = "application/json"
    response_headers: tuple[Header, ...] = ()
    """Headers of the success response."""
    errors: tuple[int, ...] = ()
    """Error statuses particular to this route, documented beside the usual ones."""

    @property
    def needs(self) -> AuthMode:
        """Who may call it (see :data:`AuthMode`)."""
        if self.auth is not None:
            return self.auth
        return "viewer" if self.method == "GET" else "editor"

    @property
    def operation_id(self) -> str:
        return self.handler.__name__


def _is_list(annotation: object) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(_is_list(arg) for arg in typing.get_args(annotation))


def parse_query(request: web.Request, model: type[M]) -> M:
    """Validate the query string; parameters declared as lists may repeat.
    An error names the parameter (``label``), not its n-th value."""
    data: dict[str, object] = {}
    for name in set(request.query.keys()):
        values = request.query.getall(name)
        info = model.model_fields.get(name)
        data[name] = values if info is not None and _is_list(info.annotation) else values[-1]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, _ = validation_detail(exc)
        first = exc.errors(include_url=False)
        parameter = str(first[0]["loc"][0]) if first and first[0]["loc"] else None
        raise InvalidInput(message, field=parameter) from None


async def parse_body(request: web.Request, model: type[M], max_bytes: int) -> tuple[M, int]:
    """Validate a JSON body (see :func:`etcdsched.api.body.read_json`) and
    say how large it was; an empty body counts as ``{}`` so the error
    names the missing field instead of complaining about syntax."""
    raw = await read_json(request, max_bytes)
    try:
        return model.model_validate_json(raw or b"{}"), len(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise MalformedRequest(f"malformed JSON: {first['msg']}") from None
        if not first["loc"] and first["type"] in ("model_type", "model_attributes_type"):
            raise MalformedRequest("the body must be a JSON object") from None
        raise


def bind(route: Route, ctx: ApiContext) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler for ``route``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        principal = None
        if route.needs != "none":
            authorization = request.headers.get("Authorization")
            principal = await ctx.auth.authenticate(authorization, request.remote or "")
            if not principal.can(route.needs):
                needs = route.needs
                raise Forbidden(f"this operation needs a token with the {needs} role or above")
        query = parse_query(request, route.query) if route.query else None
        body, size = None, 0
        if route.body:
            body, size = await parse_body(request, route.body, ctx.max_body_bytes)
        return await route.handler(Call(request, ctx, principal, body, query, size))

    handle.__name__ = route.operation_id
    return handle


def json_model(
    model: BaseModel, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    """``model`` as the answer, without storage-only fields (a model that
    holds job records names them in ``API_EXCLUDE``)."""
    exclude = STORAGE_ONLY if isinstance(model, JobRecord) else getattr(model, "API_EXCLUDE", None)
    return web.Response(
        text=model.model_dump_json(exclude=exclude),
        status=status,
        content_type="application/json",
        headers=headers,
    )
