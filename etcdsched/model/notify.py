"""Webhook subscriptions as a job spec names them (``spec.notify``).

Kept apart from the records and the event logic (:mod:`etcdsched.model.notify_records`,
:mod:`etcdsched.model.notify_events`) because the job spec needs these
types and the records need the spec: the words at the bottom, no cycle.

A job never carries a URL or a secret: a ``notify`` rule names one of its
tenant's webhooks (``webhooks/<tenant>/<name>``, managed through
``/v1/tenants/{t}/webhooks``), which holds the URL and the write-only
signing secret, and says which events of this job go there.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

EventKind = Literal[
    "run.failed",
    "run.timed_out",
    "run.lost",
    "run.succeeded",
    "run.recovered",
    "slot.skipped",
    "job.paused",
]
"""What a subscription may ask for (docs/webhooks.md, "Events")."""
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)
WEBHOOK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
MAX_NOTIFY_RULES = 8


class NotifyRule(BaseModel):
    """One subscription of a job: these events go to the tenant's webhook
    ``webhook`` (its URL and secret stay out of the spec, which viewers read)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    webhook: str = Field(pattern=WEBHOOK_NAME_PATTERN, description="A webhook of the tenant.")
    events: frozenset[EventKind] = Field(min_length=1, description="The events wanted.")
