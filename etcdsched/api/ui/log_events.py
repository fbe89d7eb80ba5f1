"""A run's log for the browser: followed live as server-sent events, and
downloaded whole.

The follow reads through the same functions as ``GET /v1/runs/{id}/log``
(:func:`~etcdsched.api.logs.read_log`, :func:`~etcdsched.api.logs.attempt_over`):
it ends when the log is complete or the run says the attempt is over (a
vanished worker never completes its log), after draining what was
written. It counts against the tenant's follow limit like the API's.

Events: ``chunk`` (``{"text": ...}``, its id the byte offset after it, so
a reconnecting ``EventSource`` resumes where it stopped through
``Last-Event-ID``), ``attempt`` (which attempt is being followed) and
``end`` (``{"state": ...}``: the browser closes the stream). A comment
line every few seconds of silence keeps proxies from closing it.
"""

from __future__ import annotations

import codecs
import json
import logging
import re

from aiohttp import web

from etcdsched.api import routes_runs
from etcdsched.api.logs import FOLLOW_POLL, attempt_over, read_log
from etcdsched.api.services import ApiServices
from etcdsched.api.ui.session import View, page
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import RunRecord
from etcdsched.runtime.quoting import quoted

log = logging.getLogger(__name__)
CHUNK_BYTES = 64 * 1024
HEARTBEAT_SECONDS = 10.0
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _event(name: str, data: object, event_id: int | None = None) -> bytes:
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data)}")
    return ("\n".join(lines) + "\n\n").encode()


def _attempt_asked(view: View, run: RunRecord) -> int | None:
    raw = view.request.query.get("attempt", "")
    return int(raw) if raw.isdigit() and 1 <= int(raw) <= run.attempt else None


def _resume_offset(view: View) -> int:
    raw = view.request.headers.get("Last-Event-ID", "")
    return int(raw) if raw.isdigit() and len(raw) < 16 else 0


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


class _Follow:
    """One follow: the run as last read, the attempt and the offset."""

    def __init__(self, view: View, run: RunRecord, attempt: int | None, offset: int) -> None:
        self.view = view
        self.services: ApiServices = view.ctx.services
        self.run = run
        self.attempt = attempt
        self.offset = offset
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.quiet = 0.0

    async def reload(self) -> None:
        await self.services.clock.sleep(FOLLOW_POLL)
        self.quiet += FOLLOW_POLL
        self.run = (await self.services.jobs.runs.load(self.services.store, self.run.id)).value

    async def heartbeat(self, resp: web.StreamResponse) -> None:
        if self.quiet >= HEARTBEAT_SECONDS:
            self.quiet = 0.0
            await resp.write(b": still here\n\n")

    async def wait_for_attempt(self, resp: web.StreamResponse) -> bool:
        """For a run that has not started: wait until it does (False: it ended first)."""
        while self.attempt is None:
            if self.run.attempt:
                self.attempt = self.run.attempt
            elif self.run.state.terminal or not _connected(self.view.request):
                return False
            else:
                await self.reload()
                await self.heartbeat(resp)
        await resp.write(_event("attempt", {"attempt": self.attempt}))
        return True

    async def stream(self, resp: web.StreamResponse) -> None:
        if not await self.wait_for_attempt(resp):
            return
        assert self.attempt is not None
        over = attempt_over(self.run, self.attempt)
        while _connected(self.view.request):
            chunk = await read_log(self.services, self.run, self.attempt, self.offset, CHUNK_BYTES)
            if chunk.data:
                self.offset = chunk.next_offset
                text = self.decoder.decode(chunk.data)
                await resp.write(_event("chunk", {"text": text}, self.offset))
                self.quiet = 0.0
                continue
            if chunk.complete or over:
                return
            await self.reload()
            await self.heartbeat(resp)
            over = attempt_over(self.run, self.attempt)


@page
async def log_events(view: View) -> web.StreamResponse:
    view.require(routes_runs.run_log)
    run = (await routes_runs.visible_run(view.call(), view.call().run_id())).value
    with view.ctx.follows.hold(run.tenant):
        resp = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await resp.prepare(view.request)
        follow = _Follow(view, run, _attempt_asked(view, run), _resume_offset(view))
        try:
            await follow.stream(resp)
            tail = follow.decoder.decode(b"", final=True)
            if tail:
                await resp.write(_event("chunk", {"text": tail}, follow.offset))
            await resp.write(_event("end", {"state": str(follow.run.state)}))
            await resp.write_eof()
        except (ConnectionResetError, EtcdschedError) as exc:
            # the headers are sent: an error can only end the stream early
            log.info("log events of %s ended early: %s", quoted(run.id), quoted(exc))
        return resp


@page
async def log_download(view: View) -> web.StreamResponse:
    """One attempt's whole log as a file (as much as is written so far)."""
    view.require(routes_runs.run_log)
    run = (await routes_runs.visible_run(view.call(), view.call().run_id())).value
    attempt = _attempt_asked(view, run) or run.attempt
    name = _UNSAFE_NAME.sub("_", f"{run.id}.attempt-{attempt}") + ".log"
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
        }
    )
    await resp.prepare(view.request)
    offset = 0
    while True:
        chunk = await read_log(view.ctx.services, run, attempt, offset, 1 << 20)
        if not chunk.data:
            break
        await resp.write(chunk.data)
        offset = chunk.next_offset
    await resp.write_eof()
    return resp
