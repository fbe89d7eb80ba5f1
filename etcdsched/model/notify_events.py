"""Which events a transition produces, whether a subscription wants them,
and what is sent: pure, so every writer of a run's end decides alike.

A run's *final* outcome is an event: an attempt that will be retried is
not (the run goes to ``retry_wait``, not to a terminal state). An event's
id is a hash of (run or slot, attempt, kind, webhook): any writer that
rebuilds the write after a conflict or an unknown outcome makes the same
key and the same id, so one outcome can never become two events.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from etcdsched.model.cronwall import ms_to_utc
from etcdsched.model.notify import EventKind, NotifyRule
from etcdsched.model.notify_records import Delivery, Webhook
from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.model.states import RunState

OUTCOME_EVENTS: dict[RunState, EventKind] = {
    RunState.SUCCEEDED: "run.succeeded",
    RunState.FAILED: "run.failed",
    RunState.TIMED_OUT: "run.timed_out",
    RunState.LOST: "run.lost",
    RunState.INTERRUPTED: "run.lost",
    RunState.SKIPPED: "slot.skipped",
}
"""A terminal run's event. ``interrupted`` (its worker stopped it, no retry
left) is ``run.lost`` like a vanished worker's: the job was stopped from
outside; the body's ``run.state`` tells them apart. ``cancelled`` is
someone's deliberate act and sends nothing."""
FAILURE_STATES = frozenset(
    {RunState.FAILED, RunState.TIMED_OUT, RunState.LOST, RunState.INTERRUPTED}
)
SIGNATURE_HEADER = "X-Etcdsched-Signature"
EVENT_ID_HEADER = "X-Etcdsched-Event-Id"


Subscriptions = dict[str, frozenset[EventKind]]
"""Webhook name -> the events it wants of one job."""


def subscriptions(rules: Iterable[NotifyRule], tenant_hooks: Iterable[Webhook]) -> Subscriptions:
    """What one job's events go where: its own ``notify`` rules, plus every
    tenant webhook with events of its own. One webhook gets each event once,
    however many rules name it."""
    wanted: dict[str, frozenset[EventKind]] = {}
    for rule in rules:
        wanted[rule.webhook] = wanted.get(rule.webhook, frozenset()) | rule.events
    for hook in tenant_hooks:
        if hook.events:
            wanted[hook.name] = wanted.get(hook.name, frozenset()) | hook.events
    return wanted


def event_id(subject: str, attempt: int, kind: str, webhook: str) -> str:
    """Stable id of one event for one webhook (32 hex digits)."""
    data = f"{subject}\n{attempt}\n{kind}\n{webhook}".encode()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _iso(ms: int | None) -> str | None:
    return None if ms is None else ms_to_utc(ms).isoformat(timespec="milliseconds")


def run_body(run: RunRecord, kind: EventKind, eid: str) -> dict[str, Any]:
    """The JSON body of a run's event (docs/webhooks.md, "Payload")."""
    current = run.current
    body: dict[str, Any] = {
        "id": eid,
        "type": kind,
        "occurred_at": _iso(run.updated_ms),
        "tenant": run.tenant,
        "job": {"id": run.job_id, "name": run.job_id.rpartition(":")[2]},
        "run": {
            "id": run.id,
            "kind": run.kind,
            "slot_at": _iso(run.slot_ms),
            "state": run.state.value,
            "attempt": run.attempt,
            "max_attempts": run.spec.retry.max_attempts,
            "reason": run.reason,
            "exit_code": current.exit_code if current else None,
            "started_at": _iso(current.started_ms if current else None),
            "ended_at": _iso(current.ended_ms if current else None),
            "worker": current.worker if current else None,
        },
        "link": f"/v1/runs/{run.id}",
    }
    body["text"] = slack_text(body)
    return body


def slack_text(body: dict[str, Any]) -> str:
    """A one-line summary, so the body can go to a Slack-compatible incoming webhook."""
    run = body.get("run", {})
    what = {
        "run.failed": "failed",
        "run.timed_out": "timed out",
        "run.lost": "was lost",
        "run.succeeded": "succeeded",
        "run.recovered": "recovered (succeeded after failing)",
        "slot.skipped": "skipped a slot",
        "job.paused": "was paused",
    }.get(str(body.get("type")), str(body.get("type")))
    reason = f": {run['reason']}" if run.get("reason") else ""
    attempts = f" after {run['attempt']} attempt(s)" if run.get("attempt") else ""
    return f"etcdsched: job {body['job']['id']} run {run.get('id', '')} {what}{attempts}{reason}"


def run_deliveries(run: RunRecord, tenant_hooks: Iterable[Webhook]) -> list[Delivery]:
    """The deliveries a run that just reached ``run.state`` owes: none unless
    it is terminal with an event some subscription wants. A success also
    owes a ``run.recovered`` *candidate* to webhooks that want that: whether
    the job had failed before is for the sender to read, not the run's
    writer (it would cost every success of such a job a read). A failure of
    a job with ``pause_after_failures`` owes a *pause check* (see
    :func:`pause_check`), subscribed or not."""
    kind = OUTCOME_EVENTS.get(run.state)
    if kind is None:
        return []
    out = [pause_check(run)] if _may_pause(run) else []
    wanted = subscriptions(run.spec.notify, tenant_hooks)
    about = _About(run.id, run.job_id, run.tenant, run.attempt, run.updated_ms)
    kinds: tuple[EventKind, ...] = (kind, "run.recovered") if kind == "run.succeeded" else (kind,)
    for each in kinds:
        out += _fan_out(about, each, wanted, functools.partial(run_body, run, each))
    return out


PAUSE_CHECK = ""
"""The webhook name of a pause check: a record for the sender, never POSTed."""


def _may_pause(run: RunRecord) -> bool:
    return run.spec.pause_after_failures is not None and run.state in FAILURE_STATES


def pause_check(run: RunRecord) -> Delivery:
    """The partition's sender reads the job's last runs and pauses it if
    they are ``pause_after_failures`` failures in a row (the run's writer
    cannot: that is a read, and a worker's report must stay cheap)."""
    about = _About(run.id, run.job_id, run.tenant, run.attempt, run.updated_ms)
    eid = event_id(run.id, run.attempt, "job.paused", PAUSE_CHECK)
    body = {"pause_after_failures": run.spec.pause_after_failures}
    return _delivery(about, "job.paused", PAUSE_CHECK, eid, body)


def failure_streak(finished_newest_first: Iterable[RunRecord], count: int) -> bool:
    """Whether the newest ``count`` finished runs (cancelled and skipped ones
    aside) all failed, timed out or were lost."""
    streak = 0
    for run in finished_newest_first:
        if run.state in (RunState.CANCELLED, RunState.SKIPPED) or not run.state.terminal:
            continue
        if run.state not in FAILURE_STATES:
            return False
        streak += 1
        if streak >= count:
            return True
    return False


def paused_deliveries(
    check: Delivery, rules: Iterable[NotifyRule], tenant_hooks: Iterable[Webhook], now_ms: int
) -> list[Delivery]:
    """``job.paused`` for every webhook that wants it, written by the
    transaction that pauses the job (so at most once per pause)."""
    count = check.body.get("pause_after_failures")
    about = _About(check.run_id, check.job_id, check.tenant, check.attempt, now_ms)

    def body_of(eid: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": eid,
            "type": "job.paused",
            "occurred_at": _iso(now_ms),
            "tenant": check.tenant,
            "job": {"id": check.job_id, "name": check.job_id.rpartition(":")[2]},
            "run": {"id": check.run_id, "attempt": check.attempt, "reason": ""},
            "reason": f"paused by etcdsched after {count} failed runs in a row",
            "link": f"/v1/jobs/{check.job_id}",
        }
        body["text"] = slack_text(body) + f": {body['reason']}"
        return body

    return _fan_out(about, "job.paused", subscriptions(rules, tenant_hooks), body_of)


def skip_deliveries(
    skip: SkipRecord, tenant: str, rules: Iterable[NotifyRule], tenant_hooks: Iterable[Webhook]
) -> list[Delivery]:
    """``slot.skipped`` for a skip record (misfire, overlap, paused, ...);
    its subject is ``<job>@<first slot>``, the id a run of that slot would have."""
    subject = f"{skip.job_id}@{skip.first_slot_ms:014d}"
    about = _About(subject, skip.job_id, tenant, 0, skip.created_ms)
    wanted = subscriptions(rules, tenant_hooks)
    return _fan_out(
        about, "slot.skipped", wanted, lambda eid: skip_body(skip, tenant, subject, eid)
    )


def skip_body(skip: SkipRecord, tenant: str, subject: str, eid: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": eid,
        "type": "slot.skipped",
        "occurred_at": _iso(skip.created_ms),
        "tenant": tenant,
        "job": {"id": skip.job_id, "name": skip.job_id.rpartition(":")[2]},
        "run": {"id": subject, "state": "skipped", "attempt": 0, "reason": skip.reason},
        "skip": {
            "first_slot_at": _iso(skip.first_slot_ms),
            "last_slot_at": _iso(skip.last_slot_ms),
            "count": skip.count,
            "reason": skip.reason,
            "detail": skip.detail,
        },
        "link": f"/v1/jobs/{skip.job_id}",
    }
    body["text"] = slack_text(body)
    return body


@dataclass(frozen=True)
class _About:
    """What an event is about: its subject (a run id, or ``<job>@<slot>``
    for a skipped slot), job, tenant and attempt, and when it happened."""

    subject: str
    job_id: str
    tenant: str
    attempt: int
    at_ms: int


def _fan_out(
    about: _About,
    kind: EventKind,
    wanted: Subscriptions,
    body_of: Callable[[str], dict[str, Any]],
) -> list[Delivery]:
    """One delivery of ``kind`` to each webhook in ``wanted`` that wants it,
    its body made for its event id."""
    out = []
    for webhook, events in sorted(wanted.items()):
        if kind in events:
            eid = event_id(about.subject, about.attempt, kind, webhook)
            out.append(_delivery(about, kind, webhook, eid, body_of(eid)))
    return out


def _delivery(
    about: _About, kind: EventKind, webhook: str, eid: str, body: dict[str, Any]
) -> Delivery:
    return Delivery(
        event_id=eid,
        kind=kind,
        tenant=about.tenant,
        webhook=webhook,
        job_id=about.job_id,
        run_id=about.subject,
        attempt=about.attempt,
        body=body,
        created_ms=about.at_ms,
        next_attempt_ms=about.at_ms,
    )


def is_recovery(previous: RunRecord | None) -> bool:
    """Whether a success after ``previous`` (the job's last finished run
    before it, or None) is a recovery: that run failed, timed out or was lost."""
    return previous is not None and previous.state in FAILURE_STATES


def signature(secret: str, body: bytes, timestamp_s: int) -> str:
    """``X-Etcdsched-Signature``: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of
    "<t>.<body>" keyed with the secret>``."""
    return f"t={timestamp_s},v1={_mac(secret, body, timestamp_s)}"


def _mac(secret: str, body: bytes, timestamp_s: int) -> str:
    return hmac.new(secret.encode(), f"{timestamp_s}.".encode() + body, hashlib.sha256).hexdigest()


def verify_signature(
    secret: str, body: bytes, header: str, now_s: int, tolerance_s: int = 300
) -> bool:
    """What a receiver does (docs/webhooks.md): the MAC matches and the
    timestamp is within ``tolerance_s`` of now (a replayed old request fails).
    A malformed header (no ``t`` or ``v1``, a part without ``=``, a
    non-integer ``t``, non-ASCII text) is a failed check, never an error:
    the header is whatever the sender of the request chose."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        timestamp, mac = int(parts["t"]), parts["v1"].encode("ascii")
    except (KeyError, ValueError):
        return False
    expected = _mac(secret, body, timestamp).encode()
    return abs(now_s - timestamp) <= tolerance_s and hmac.compare_digest(expected, mac)


def retry_delay_ms(attempts: int, initial_ms: int, max_delay_ms: int) -> int:
    """Wait after ``attempts`` failed attempts: initial * 2^(attempts-1), capped."""
    return int(min(max_delay_ms, initial_ms * (1 << min(max(attempts - 1, 0), 30))))


def after_attempt(
    delivery: Delivery,
    now_ms: int,
    *,
    status: int | None,
    error: str,
    initial_ms: int,
    max_delay_ms: int,
    give_up_after_ms: int,
) -> Delivery:
    """``delivery`` after one attempt: delivered on a 2xx, else pending with
    its next attempt computed, or failed once retrying would pass
    ``give_up_after_ms`` since the event."""
    attempts = delivery.attempts + 1
    update: dict[str, Any] = {
        "attempts": attempts,
        "last_status": status,
        "last_error": error,
        "last_attempt_ms": now_ms,
    }
    if status is not None and 200 <= status < 300 and not error:
        update |= {"state": "delivered", "ended_ms": now_ms, "last_error": ""}
        return delivery.model_copy(update=update)
    next_ms = now_ms + retry_delay_ms(attempts, initial_ms, max_delay_ms)
    if next_ms > delivery.created_ms + give_up_after_ms:
        update |= {"state": "failed", "ended_ms": now_ms}
    else:
        update |= {"next_attempt_ms": next_ms}
    return delivery.model_copy(update=update)
