"""One webhook POST, made safely (docs/webhooks.md, "Safety").

The URL's scheme is checked, the host is resolved by us and every address
it resolves to is vetted before a connection is made (an IP literal is
vetted directly: aiohttp does not resolve those), the request has a total
timeout, a redirect is a failed attempt (never followed), and at most
:data:`MAX_RESPONSE_BYTES` of the answer are read.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from etcdsched.model.notify_events import EVENT_ID_HEADER, SIGNATURE_HEADER, signature
from etcdsched.model.notify_records import Delivery, Webhook
from etcdsched.model.notify_safety import address_refusal, redacted_url, target_refusal

MAX_RESPONSE_BYTES = 4096
USER_AGENT = "etcdsched-webhook/1"


class AddressRefused(OSError):
    """The host resolved to an address the webhook may not reach."""


class VettingResolver(AbstractResolver):
    """Resolves like aiohttp's default resolver, then refuses the whole
    answer if any address is one the webhook may not reach (checking only
    the first would let a name with a public and a private address through
    on a retry)."""

    def __init__(self, allow_private: bool) -> None:
        self._inner = DefaultResolver()
        self._allow_private = allow_private

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = await self._inner.resolve(host, port, family)
        for answer in answers:
            why = address_refusal(answer["host"], allow_private=self._allow_private)
            if why is not None:
                raise AddressRefused(f"refused: {host} resolves to {why}")
        return answers

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True)
class AttemptResult:
    """How one POST went: the status (None if no answer) and what went wrong."""

    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300 and not self.error


def body_bytes(delivery: Delivery, link_base: str) -> bytes:
    """The exact bytes sent (and signed): compact, keys sorted."""
    body: dict[str, Any] = dict(delivery.body)
    if link_base and isinstance(body.get("link"), str):
        body["link"] = link_base.rstrip("/") + body["link"]
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


class WebhookSender:
    """Sends deliveries; one HTTP client per kind of allowance, made on first use."""

    def __init__(self, timeout_s: float, link_base: str = "") -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.link_base = link_base
        self._sessions: dict[bool, aiohttp.ClientSession] = {}

    def _session(self, allow_private: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(allow_private)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(
                resolver=VettingResolver(allow_private), use_dns_cache=False, limit=64
            )
            session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, auto_decompress=False
            )
            self._sessions[allow_private] = session
        return session

    async def send(self, hook: Webhook, delivery: Delivery, now_s: int) -> AttemptResult:
        """POST ``delivery`` to ``hook``; never raises for what the receiver
        or the network did (that is the attempt's result)."""
        why = target_refusal(hook.url, allow_http=hook.allow_http, allow_private=hook.allow_private)
        if why is not None:
            return AttemptResult(None, f"refused: {why}")
        data = body_bytes(delivery, self.link_base)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            SIGNATURE_HEADER: signature(hook.secret, data, now_s),
            EVENT_ID_HEADER: delivery.event_id,
            "Idempotency-Key": delivery.event_id,
            "X-Etcdsched-Event": delivery.kind,
        }
        try:
            return await self._post(hook, data, headers)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return AttemptResult(None, _describe(exc).replace(hook.url, redacted_url(hook.url)))

    async def _post(self, hook: Webhook, data: bytes, headers: dict[str, str]) -> AttemptResult:
        session = self._session(hook.allow_private)
        async with session.post(
            hook.url, data=data, headers=headers, allow_redirects=False
        ) as response:
            await response.content.read(MAX_RESPONSE_BYTES)  # at most this much, then close
            status = response.status
            if 300 <= status < 400:
                where = response.headers.get("Location", "")[:200]
                return AttemptResult(status, f"redirect refused (HTTP {status} to {where!r})")
            if not 200 <= status < 300:
                return AttemptResult(status, f"HTTP {status}")
            return AttemptResult(status)

    async def close(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def _describe(exc: BaseException) -> str:
    """A short, secret-free description of a failed attempt."""
    if isinstance(exc, TimeoutError | asyncio.TimeoutError):
        return "timed out"
    cause = exc
    while cause.__cause__ is not None and not isinstance(cause, AddressRefused):
        cause = cause.__cause__
    text = str(cause) or type(cause).__name__
    return text[:300]
