"""The stored records of webhooks and their deliveries (docs/webhooks.md).

A :class:`Webhook` (``webhooks/<tenant>/<name>``) is a destination: its
URL, its signing secret (write-only: no API answer carries it), the events
every job of the tenant sends there, and what an admin allowed it. A
:class:`Delivery` is one event on its way to one webhook: written pending
to the outbox (``outbox/<pp>/<run>/<event id>``) by the transaction that
ended the run, rewritten by the partition's sender after each attempt, and
moved to ``deliveries/<job>/<seq>/<event id>`` once delivered or given up.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from etcdsched.model.notify import WEBHOOK_NAME_PATTERN, EventKind
from etcdsched.model.records import Record

DeliveryState = Literal["pending", "delivered", "failed", "not_applicable"]
"""``not_applicable``: a ``run.recovered`` candidate whose previous run had
not failed (the sender decides; nothing is sent)."""
SECRET_FIELDS = {"secret"}
"""Fields of a :class:`Webhook` that no API answer carries."""


class Webhook(Record):
    """A tenant's webhook. ``events`` non-empty subscribes every job of the
    tenant; a job's ``spec.notify`` can name it for more."""

    tenant: str
    name: str = Field(pattern=WEBHOOK_NAME_PATTERN)
    url: str
    events: frozenset[EventKind] = frozenset()
    secret: str = ""
    allow_http: bool = False
    """Admin-set: a plain ``http://`` URL may be used."""
    allow_private: bool = False
    """Admin-set: the URL may resolve to loopback, private, link-local or
    metadata addresses (a receiver on the same host or network)."""
    created_ms: int
    updated_ms: int


class Delivery(Record):
    """One event for one webhook, and how sending it went."""

    event_id: str
    kind: EventKind
    tenant: str
    webhook: str
    job_id: str
    run_id: str
    """The run the event is about (for ``slot.skipped`` of a skip record,
    ``<job>@<first slot>``, which names no run)."""
    attempt: int
    body: dict[str, Any]
    """The JSON body, fixed when the event was made: every retry sends the
    same bytes (the signature's timestamp is per attempt)."""
    state: DeliveryState = "pending"
    created_ms: int
    next_attempt_ms: int
    attempts: int = 0
    last_status: int | None = None
    last_error: str = ""
    last_attempt_ms: int | None = None
    ended_ms: int | None = None
