"""Webhook checks of a fault-injection run (docs/webhooks.md): what a real
receiver on loopback got, against the outcomes etcd recorded.

The harness subscribes every job of the workload: the tenant's webhook
``harness`` wants the run outcomes (:data:`TENANT_EVENTS`), and each job's
own ``notify`` rule names the same webhook for ``slot.skipped``
(:data:`JOB_EVENTS`), so both ways of subscribing are exercised and one
webhook gets each event once. The rules:

* ``webhook_missing`` — an outcome a subscription matches whose event id
  the receiver never got (an event lost);
* ``webhook_unexpected`` — the receiver got an event id that no recorded
  outcome explains (an event for an outcome that did not happen, or a
  second, different event for one outcome);
* ``webhook_mismatch`` — one event id received with two different bodies.

Receiving one event id more than once is allowed (a sender that died after
the POST and before recording it, a retry): counted as ``repeats``.
Skip records of resumed jobs (reason ``paused``) send nothing yet and are
not expected (docs/webhooks.md, "Not yet").
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from etcdsched.model.notify_events import OUTCOME_EVENTS, event_id
from etcdsched.model.records import RunRecord, SkipRecord
from tests.faults.checker import Violation
from tests.faults.workload import WEBHOOK as HOOK

TENANT_EVENTS = ("run.failed", "run.timed_out", "run.lost", "run.succeeded")
JOB_EVENTS = ("slot.skipped",)
SKIP_REASONS_SENT = ("misfire", "overlap")


@dataclass(frozen=True)
class WebhookReport:
    expected: int
    delivered: int
    posts: int
    repeats: int
    violations: list[Violation]

    def summary(self) -> str:
        return (
            f"webhooks: {self.expected} events expected, {self.delivered} delivered,"
            f" {self.posts} POSTs ({self.repeats} repeats of an event),"
            f" {len(self.violations)} violation(s)"
        )


def expected_events(runs: Iterable[RunRecord], skips: Iterable[SkipRecord]) -> dict[str, str]:
    """Event id -> the outcome it stands for, for every subscribed outcome."""
    wanted = set(TENANT_EVENTS) | set(JOB_EVENTS)
    expected: dict[str, str] = {}
    for run in runs:
        kind = OUTCOME_EVENTS.get(run.state)
        if kind is not None and kind in wanted:
            eid = event_id(run.id, run.attempt, kind, HOOK)
            expected[eid] = f"{kind} of {run.id} (attempt {run.attempt})"
    for skip in skips:
        if skip.reason in SKIP_REASONS_SENT and "slot.skipped" in wanted:
            subject = f"{skip.job_id}@{skip.first_slot_ms:014d}"
            expected[event_id(subject, 0, "slot.skipped", HOOK)] = f"slot.skipped {subject}"
    return expected


def check_webhooks(
    runs: Iterable[RunRecord], skips: Iterable[SkipRecord], received: list[Mapping[str, Any]]
) -> WebhookReport:
    """``received``: one mapping per POST, ``event_id`` and ``body``."""
    expected = expected_events(runs, skips)
    bodies: dict[str, set[str]] = {}
    for post in received:
        bodies.setdefault(str(post["event_id"]), set()).add(repr(sorted(post["body"].items())))
    violations = [
        Violation("webhook_missing", what.split(" of ")[-1].split(" (")[0], detail=what)
        for eid, what in sorted(expected.items(), key=lambda item: item[1])
        if eid not in bodies
    ]
    for eid, seen in sorted(bodies.items()):
        first = next(p for p in received if p["event_id"] == eid)
        where = str(first["body"].get("run", {}).get("id", ""))
        if eid not in expected:
            detail = f"event {eid} ({first['body'].get('type')}) for no recorded outcome"
            violations.append(
                Violation("webhook_unexpected", where.partition("@")[0], where, detail)
            )
        if len(seen) > 1:
            detail = f"event {eid} received with {len(seen)} different bodies"
            violations.append(Violation("webhook_mismatch", where.partition("@")[0], where, detail))
    posts = Counter(str(p["event_id"]) for p in received)
    return WebhookReport(
        expected=len(expected),
        delivered=len(set(expected) & set(posts)),
        posts=len(received),
        repeats=sum(count - 1 for count in posts.values()),
        violations=violations,
    )


def read_received(path: Path) -> list[dict[str, Any]]:
    """The receiver's record (one JSON line per POST; a torn last line is skipped)."""
    if not path.exists():
        return []
    posts = []
    for line in path.read_text().splitlines():
        try:
            posts.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return posts
