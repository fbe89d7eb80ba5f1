"""The run page: where the run is in the state machine, every attempt to
the millisecond, why it waits, and its log (followed live by
:mod:`etcdsched.api.ui.log_events`); a cancel button for editors.

The run is read with the JSON route's ``visible_run`` (404 for another
tenant's run), its explanation with the same ``pending_reason`` and
``nearby_skips``, its webhook deliveries as ``GET /v1/runs/{id}/deliveries``
reads them, and the cancel is the API's cancel, role check included.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from etcdsched.api import routes_runs
from etcdsched.api.schemas import CancelBody
from etcdsched.api.ui.ledger import SKIP_REASONS, run_href
from etcdsched.api.ui.session import View, action, page, see_other
from etcdsched.model.records import Attempt, RunRecord
from etcdsched.model.states import TRANSITIONS, RunState
from etcdsched.store.outbox import run_deliveries_stored

MAX_REASON = 512


@dataclass(frozen=True)
class Step:
    """One stop on a run's way: pending, assigned, running, its end."""

    name: str
    status: str
    """``done``, ``current``, ``todo``, or ``passed-by`` (a run that ended
    before it got there: cancelled or skipped while pending)."""


def steps(run: RunRecord) -> list[Step]:
    """The run's position on the main path of the state machine
    (design.md, "Run states"); a run waiting for a retry is back at the
    start, its end shows its terminal state."""
    position = {
        RunState.PENDING: 0,
        RunState.RETRY_WAIT: 0,
        RunState.ASSIGNED: 1,
        RunState.RUNNING: 2,
    }.get(run.state, 3)
    first = "retry_wait" if run.state is RunState.RETRY_WAIT else "pending"
    last = str(run.state) if run.state.terminal else "ended"
    names = [first, "assigned", "running", last]
    reached = [True, bool(run.attempts), any(a.started_ms for a in run.attempts), True]

    def status(i: int) -> str:
        if i == position:
            return "current"
        if i > position:
            return "todo"
        return "done" if reached[i] else "passed-by"

    return [Step(name, status(i)) for i, name in enumerate(names)]


def attempt_ms(attempt: Attempt) -> int | None:
    """How long the attempt ran, once it has started and ended."""
    if attempt.started_ms is None or attempt.ended_ms is None:
        return None
    return attempt.ended_ms - attempt.started_ms


def _log_attempt(view: View, run: RunRecord) -> int:
    raw = view.request.query.get("attempt", "")
    if raw.isdigit() and 1 <= int(raw) <= run.attempt:
        return int(raw)
    return run.attempt


@page
async def run_page(view: View) -> web.StreamResponse:
    view.require(routes_runs.get_run)
    rid = view.call().run_id()
    run = (await routes_runs.visible_run(view.call(), rid)).value
    services = view.ctx.services
    reason = await routes_runs.pending_reason(services, run)
    skips = await routes_runs.nearby_skips(services, run)
    attempt = _log_attempt(view, run)
    deliveries = await run_deliveries_stored(services.store, services.keys, run.partition, run.id)
    return view.page(
        "run.html",
        run=run,
        steps=steps(run),
        next_states=sorted(TRANSITIONS[run.state]),
        pending_reason=reason,
        skips=skips,
        skip_reasons=SKIP_REASONS,
        deliveries=deliveries,
        attempt_ms=attempt_ms,
        log_attempt=attempt,
        can_cancel=not run.state.terminal and view.who_may(routes_runs.cancel),
        here=run_href(run.id),
    )


@action
async def cancel_run(view: View) -> web.StreamResponse:
    view.require(routes_runs.cancel)
    form = await view.request.post()
    reason = str(form.get("reason", "")).strip()[:MAX_REASON]
    body = CancelBody(reason=reason or f"cancelled by {view.who.name} (dashboard)")
    call = view.call(body=body)
    await routes_runs.cancel(call)
    return see_other(run_href(call.run_id()))
