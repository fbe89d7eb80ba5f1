"""Bearer tokens, their roles, tenants and per-tenant submission rates.

A token is a random secret shown to its owner once; etcd keeps only its
SHA-256 (``tokens/<sha256>`` -> :class:`TokenRecord`), so a copy of etcd does
not hand out credentials. The hash is also the token's public id (to list
and revoke it). Roles, each allowing what the one before it does:

* ``viewer``: reads its tenant's jobs, runs and logs;
* ``editor``: also creates, changes, triggers and cancels them;
* ``tenant-admin``: also manages its tenant's tokens;
* ``admin``: everything, every tenant, the cluster view, tenants' limits.

Every API instance watches ``tokens/``: a token created or revoked through
any instance applies everywhere as soon as the watch delivers it (within a
few milliseconds), and an unknown token costs no etcd read. While the watch
is broken (etcd unreachable), tokens are read from etcd instead. Failed
authentications are limited per client address (429), so guessing tokens
cannot turn into load.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass
from typing import Annotated, Any, Literal, NoReturn

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
    field_validator,
)

from etcdsched.api.errors import retry_after_seconds
from etcdsched.model.errors import Conflict, QuotaExceeded, Unauthorized
from etcdsched.model.records import Record
from etcdsched.model.spec import TENANT_PATTERN
from etcdsched.runtime.clock import Clock, SystemClock
from etcdsched.store.cache import PrefixCache
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Compare, Op, Ops, Store, prefix_end

Role = Literal["viewer", "editor", "tenant-admin", "admin"]
ROLE_RANK: dict[str, int] = {"viewer": 0, "editor": 1, "tenant-admin": 2, "admin": 3}
CACHE_SECONDS = 2.0
SECRET_PREFIX = "esk_"
FAILED_AUTH_PER_SECOND = 5.0
"""Unknown tokens a client address may present per second, after a burst of
:data:`FAILED_AUTH_BURST`."""
FAILED_AUTH_BURST = 20.0
LAST_USED_EVERY_MS = 60_000
"""A token's last-used time is written at most this often."""


def _not_text(value: Any) -> Any:
    """Refuse what pydantic's lax mode would turn into a number: ``"3"``
    (or ``true``) is not 3. ``3.0`` is, as JSON Schema's ``integer`` says."""
    if isinstance(value, str | bool):
        raise ValueError("must be a JSON number, not a string or a boolean")
    return value


JsonInt = Annotated[int, BeforeValidator(_not_text)]
"""An integer of a request body: a JSON number without a fraction."""
Count = Annotated[JsonInt, Field(ge=0), WithJsonSchema({"type": "integer", "minimum": 0})]
"""A limit on how many. Its JSON schema is spelled out: pydantic writes the
bound of a validated, optional integer as ``ge``, which no JSON Schema
tool reads."""


class TokenRecord(Record):
    """Value of ``tokens/<sha256(secret)>``."""

    tenant: str = Field(pattern=TENANT_PATTERN)
    role: Role
    name: str
    created_ms: int = 0
    expires_ms: int | None = None
    last_used_ms: int = 0
    """Written at most every minute per API instance (not on every call)."""

    @field_validator("role", mode="before")
    @classmethod
    def _earlier_roles(cls, role: Any) -> Any:
        """Tokens made before roles had levels said ``tenant``: an editor."""
        return "editor" if role == "tenant" else role


class TenantLimits(BaseModel):
    """A tenant's quotas; ``null`` means unlimited."""

    model_config = ConfigDict(extra="forbid")

    max_jobs: Count | None = Field(None, description="Jobs the tenant may have.")
    max_active_runs: Count | None = Field(
        None, description="Non-terminal runs, checked on trigger and backfill."
    )
    submissions_per_second: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        strict=True,
        description="Job creations, triggers and backfills per second (per API).",
    )
    selectors: dict[str, list[str]] | None = Field(
        None,
        description="Worker labels the tenant's selectors may ask for, and their allowed"
        ' values (e.g. {"pool": ["team-a", "shared"]}); null: any. A job asking for a label'
        " or value not listed is refused (422).",
    )
    loader_env: StrictBool = Field(
        False,
        description="Whether the tenant's jobs may set loader and interpreter variables"
        " (LD_*, PYTHONPATH, BASH_ENV, ...) in their env. Off: such a job is refused (422).",
    )


class TenantRecord(Record):
    """Value of ``tenants/<name>``."""

    name: str = Field(pattern=TENANT_PATTERN)
    limits: TenantLimits = TenantLimits()
    updated_ms: int = 0


@dataclass(frozen=True)
class Principal:
    """Who is calling, from their token."""

    name: str
    tenant: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def can(self, role: Role) -> bool:
        """Whether this caller's role includes ``role``'s rights."""
        return ROLE_RANK[self.role] >= ROLE_RANK[role]

    def sees(self, tenant: str) -> bool:
        return self.is_admin or tenant == self.tenant


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class IssuedToken:
    """A token just stored: its secret (shown once, kept nowhere), its id
    (the secret's SHA-256, which names it) and its record."""

    secret: str
    id: str
    record: TokenRecord


async def _issue(
    store: Store, keys: Keys, record: TokenRecord, also: tuple[Compare, Op] | None = None
) -> IssuedToken | None:
    """Store ``record`` under a new secret's hash, with ``also`` in the same
    transaction; None if a compare failed. Compare: the hash key is absent
    (a collision of 256 random bits would otherwise overwrite a token)."""
    secret = new_secret()
    token_id = hash_token(secret)
    key = keys.token(token_id)
    compares, ops = [Cmp.absent(key)], [Ops.put(key, record)]
    if also is not None:
        compares.append(also[0])
        ops.append(also[1])
    result = await store.txn(compares, ops)
    return IssuedToken(secret, token_id, record) if result.succeeded else None


async def create_token(
    store: Store,
    keys: Keys,
    *,
    tenant: str,
    role: Role,
    name: str,
    now_ms: int,
    expires_ms: int | None = None,
) -> IssuedToken:
    record = TokenRecord(
        tenant=tenant, role=role, name=name, created_ms=now_ms, expires_ms=expires_ms
    )
    issued = await _issue(store, keys, record)
    if issued is None:
        raise Conflict("token collision; try again")
    return issued


async def bootstrap_admin_token(
    store: Store, keys: Keys, now_ms: int, name: str = "bootstrap"
) -> str:
    """The first admin token of a cluster, made once: refused when an admin
    token exists or one was bootstrapped before (even if since revoked:
    then an admin makes the next one). Compare, besides the token's own:
    the bootstrap marker is absent, so two bootstraps at once make one token."""
    prefix = keys.tokens_prefix()
    page = await store.range(prefix, prefix_end(prefix))
    if any(kv.decode(TokenRecord).value.role == "admin" for kv in page.kvs):
        raise Conflict("an admin token exists already: ask its holder for a new one")
    record = TokenRecord(tenant="default", role="admin", name=name, created_ms=now_ms)
    marker = keys.admin_bootstrap()
    once = (Cmp.absent(marker), Ops.put(marker, BootstrapRecord(created_ms=now_ms)))
    issued = await _issue(store, keys, record, once)
    if issued is None:
        raise Conflict("the first admin token was made already (bootstrap runs once)")
    return issued.secret


class BootstrapRecord(Record):
    """Value of ``meta/admin-bootstrap``."""

    created_ms: int


async def create_admin_token(store: Store, keys: Keys, *, name: str = "admin") -> str:
    """``etcdsched up``'s first admin token (its bootstrap, on first start)."""
    return await bootstrap_admin_token(store, keys, SystemClock().now_ms(), name)


async def put_tenant(
    store: Store, keys: Keys, name: str, limits: TenantLimits, now_ms: int
) -> TenantRecord:
    record = TenantRecord(name=name, limits=limits, updated_ms=now_ms)
    await store.txn([], [Ops.put(keys.tenant(name), record)])
    return record


class _TtlCache:
    def __init__(self, clock: Clock, ttl: float) -> None:
        self._clock = clock
        self._ttl = ttl
        self._items: dict[str, tuple[float, object]] = {}

    def get(self, key: str) -> object | None:
        hit = self._items.get(key)
        if hit is None or hit[0] < self._clock.monotonic():
            self._items.pop(key, None)
            return None
        return hit[1]

    def put(self, key: str, value: object) -> None:
        if len(self._items) > 10_000:
            self._items.clear()
        self._items[key] = (self._clock.monotonic() + self._ttl, value)

    def drop(self, key: str) -> None:
        self._items.pop(key, None)


class Authenticator:
    """Resolves bearer tokens (from a watched copy of ``tokens/``) and
    tenant records (with a short cache); see the module doc."""

    def __init__(self, store: Store, keys: Keys, clock: Clock, ttl: float = CACHE_SECONDS) -> None:
        self._store = store
        self._keys = keys
        self._clock = clock
        self._cache = _TtlCache(clock, ttl)
        self.tokens = PrefixCache(store, clock, keys.tokens_prefix())
        self._failures = RateLimiter(clock)
        self.failed_auth_limit = (FAILED_AUTH_PER_SECOND, FAILED_AUTH_BURST)
        """Unknown tokens per second a client address may present, and the
        burst: a test that probes with many (a fuzzer) raises it."""
        self._used: dict[str, int] = {}
        """Token id -> when it was last used here, not yet written."""

    async def watching(self, _app: object = None) -> Any:
        """Keep the token copy current while the API runs (an aiohttp cleanup context)."""
        tasks = [asyncio.create_task(self.tokens.run(), name="tokens")]
        tasks.append(asyncio.create_task(self._write_last_used(), name="tokens-used"))
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def authenticate(self, authorization: str | None, client: str = "") -> Principal:
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        token_id = hash_token(secret.strip())
        record = await self._record(token_id, client)
        now_ms = self._clock.now_ms()
        if record is None or (record.expires_ms is not None and record.expires_ms <= now_ms):
            raise Unauthorized("unknown, expired or revoked token")
        self._used[token_id] = now_ms
        return Principal(record.name, record.tenant, record.role)

    async def _record(self, token_id: str, client: str) -> TokenRecord | None:
        """From the watched copy; a token it lacks (not there, or made a
        moment ago and not yet seen) is read from etcd, but a client address
        whose tokens were unknown more than :data:`FAILED_AUTH_PER_SECOND`
        times a second (after a burst) is refused before any read."""
        key = self._keys.token(token_id)
        kv = self.tokens.items.get(key) if self.tokens.ready.is_set() else None
        if kv is not None:
            return kv.decode(TokenRecord).value
        address = client or "?"
        limit = self.failed_auth_limit
        why = f"too many unknown tokens from {client or 'this client'}"
        self._failures.check(address, *limit, what=why)
        kv = await self._store.get(key)
        if kv is None:
            self._failures.take(address, *limit, what=why)
            return None
        return kv.decode(TokenRecord).value

    async def _write_last_used(self) -> None:
        """Every minute, the last use of each token used here. Compare: the
        token is unchanged since we read it, so a revoked token stays gone."""
        while True:
            await self._clock.sleep(LAST_USED_EVERY_MS / 1000)
            used, self._used = self._used, {}
            for token_id, used_ms in used.items():
                kv = await self._store.get(self._keys.token(token_id))
                if kv is None:
                    continue
                record = kv.decode(TokenRecord).value.model_copy(update={"last_used_ms": used_ms})
                await self._store.txn([Cmp.mod(kv.key, kv.mod_revision)], [Ops.put(kv.key, record)])

    async def tenant(self, name: str) -> TenantRecord | None:
        key = self._keys.tenant(name)
        cached = self._cache.get(key)
        if isinstance(cached, TenantRecord):
            return cached
        kv = await self._store.get(key)
        record = kv.decode(TenantRecord).value if kv else TenantRecord(name=name)
        self._cache.put(key, record)
        return record

    def forget_tenant(self, name: str) -> None:
        self._cache.drop(self._keys.tenant(name))


class RateLimiter:
    """Token buckets per tenant, in this process only: with N API instances
    behind a balancer a tenant may submit up to N times its rate. Each bucket
    holds one second's worth of submissions (at least one)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(
        self,
        tenant: str,
        rate: float,
        burst: float | None = None,
        what: str = "",
        cost: float = 1.0,
    ) -> None:
        """Take ``cost`` (one submission, or a batch's count) from
        ``tenant``'s bucket (any key: a tenant, a client address), or raise
        429 with when to retry (at most an hour). A cost above what the
        bucket holds is taken from a full bucket, leaving it in debt: a
        batch larger than one second's worth is delayed, never refused for
        good, and the rate still holds over time."""
        tokens, now = self._refill(tenant, rate, burst)
        needed = min(cost, _capacity(rate, burst))
        if tokens < needed:
            self._refuse(tenant, rate, tokens, now, what, needed)
        self._buckets[tenant] = (tokens - cost, now)

    def check(self, tenant: str, rate: float, burst: float | None = None, what: str = "") -> None:
        """Raise 429 as :meth:`take` would, without taking anything."""
        tokens, now = self._refill(tenant, rate, burst)
        if tokens < 1.0:
            self._refuse(tenant, rate, tokens, now, what)

    def _refill(self, key: str, rate: float, burst: float | None) -> tuple[float, float]:
        capacity = _capacity(rate, burst)
        now = self._clock.monotonic()
        if len(self._buckets) > 100_000:  # many client addresses: forget the idle ones
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
        tokens, last = self._buckets.get(key, (capacity, now))
        return min(capacity, tokens + (now - last) * rate), now

    def _refuse(
        self, key: str, rate: float, tokens: float, now: float, what: str, needed: float = 1.0
    ) -> NoReturn:
        self._buckets[key] = (tokens, now)
        wait = (needed - tokens) / rate
        raise QuotaExceeded(
            what or f"tenant {key} is over {rate:g} submissions per second",
            retry_after=float(retry_after_seconds(wait)),
        )


def _capacity(rate: float, burst: float | None) -> float:
    """What a bucket holds: one second's worth (or ``burst``), at least one."""
    return max(1.0, burst if burst is not None else rate)
