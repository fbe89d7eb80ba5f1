"""Bearer tokens, tenants and per-tenant submission rates.

A token is a random secret shown to its owner once; etcd keeps only its
SHA-256 (``tokens/<sha256>`` -> :class:`TokenRecord`), so a copy of etcd does
not hand out credentials. A token either belongs to a tenant (sees and
changes only that tenant's jobs and runs; anything else is reported as not
found, so tenants cannot probe each other's ids) or is an admin token (sees
everything, manages tokens and tenants).

Lookups are cached in-process for :data:`CACHE_SECONDS`: a token or tenant
limit changed through another API instance takes up to that long to apply
here. Unknown tokens are never cached, so a new token works at once.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from etcdsched.model.errors import Conflict, QuotaExceeded, Unauthorized
from etcdsched.model.records import Record
from etcdsched.model.spec import TENANT_PATTERN
from etcdsched.runtime.clock import Clock, SystemClock
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Cmp, Ops, Store

Role = Literal["admin", "tenant"]
CACHE_SECONDS = 2.0
SECRET_PREFIX = "esk_"


class TokenRecord(Record):
    """Value of ``tokens/<sha256(secret)>``."""

    tenant: str = Field(pattern=TENANT_PATTERN)
    role: Role
    name: str
    created_ms: int = 0


class TenantLimits(BaseModel):
    """A tenant's quotas; ``null`` means unlimited."""

    model_config = ConfigDict(extra="forbid")

    max_jobs: int | None = Field(None, ge=0, description="Jobs the tenant may have.")
    max_active_runs: int | None = Field(
        None, ge=0, description="Non-terminal runs, checked on trigger and backfill."
    )
    submissions_per_second: float | None = Field(
        None, gt=0, description="Job creations, triggers and backfills per second (per API)."
    )
    loader_env: bool = Field(
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

    def sees(self, tenant: str) -> bool:
        return self.is_admin or tenant == self.tenant


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


async def create_token(
    store: Store, keys: Keys, *, tenant: str, role: Role, name: str, now_ms: int
) -> str:
    """Store a new token's hash and return the secret (shown once).
    Compare: the hash key is absent (a collision of 256 random bits would
    otherwise overwrite another token)."""
    record = TokenRecord(tenant=tenant, role=role, name=name, created_ms=now_ms)
    secret = new_secret()
    key = keys.token(hash_token(secret))
    result = await store.txn([Cmp.absent(key)], [Ops.put(key, record)])
    if not result.succeeded:
        raise Conflict("token collision; try again")
    return secret


async def create_admin_token(store: Store, keys: Keys, *, name: str = "admin") -> str:
    """An admin token for ``etcdsched up``'s first start; returns the secret."""
    now = SystemClock().now_ms()
    return await create_token(store, keys, tenant="default", role="admin", name=name, now_ms=now)


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
    """Resolves bearer tokens and tenant records, with a short cache."""

    def __init__(self, store: Store, keys: Keys, clock: Clock, ttl: float = CACHE_SECONDS) -> None:
        self._store = store
        self._keys = keys
        self._cache = _TtlCache(clock, ttl)

    async def authenticate(self, authorization: str | None) -> Principal:
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise Unauthorized("missing bearer token (Authorization: Bearer <token>)")
        key = self._keys.token(hash_token(secret.strip()))
        cached = self._cache.get(key)
        if isinstance(cached, Principal):
            return cached
        kv = await self._store.get(key)
        if kv is None:
            raise Unauthorized("unknown or revoked token")
        record = kv.decode(TokenRecord).value
        principal = Principal(name=record.name, tenant=record.tenant, role=record.role)
        self._cache.put(key, principal)
        return principal

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

    def take(self, tenant: str, rate: float) -> None:
        capacity = max(1.0, rate)
        now = self._clock.monotonic()
        tokens, last = self._buckets.get(tenant, (capacity, now))
        tokens = min(capacity, tokens + (now - last) * rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            wait = (1.0 - tokens) / rate
            raise QuotaExceeded(
                f"tenant {tenant} is over {rate:g} submissions per second",
                retry_after=float(max(1, math.ceil(wait))),
            )
        self._buckets[tenant] = (tokens - 1.0, now)
