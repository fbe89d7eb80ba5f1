"""A run's log for the browser: followed live as server-sent events, and
downloaded whole.

The follow reads through the same functions as ``GET /v1/runs/{id}/log``
(:func:`~etcdsched.api.logs.read_log`, :func:`~etcdsched.api.logs.attempt_over`):
it ends when the log is complete or the run says the attempt is over (a
vanished worker never completes its log), after draining what was
written. It counts against the tenant's follow limit like the API's.

Events: ``chunk`` (``{"text": ...}``, its id ``<attempt>:<offset>``, the
attempt followed and the byte offset just after the text sent), ``attempt``
(which attempt is being followed) and ``end`` (``{"state": ...}``: the
browser closes the stream). A comment line every few seconds of silence
keeps proxies from closing it.

A reconnecting ``EventSource`` sends the last id back as ``Last-Event-ID``:
the follow resumes *that* attempt at that offset, even when a newer attempt
has begun meanwhile (a stream following "the current attempt" would
otherwise apply one attempt's offset to another's log). A chunk carries
whole characters only: the bytes of a character split by a read stay in the
decoder, and the id's offset stops before them, so a resumed stream reads
them again instead of losing them.

The download is a snapshot: the bytes the log held when it began, so it
ends even while the attempt goes on writing.
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
from etcdsched.api.ui.render import SECURITY_HEADERS
from etcdsched.api.ui.session import View, page
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import RunRecord
from etcdsched.runtime.quoting import quoted

log = logging.getLogger(__name__)
CHUNK_BYTES = 64 * 1024
DOWNLOAD_BYTES = 1 << 20
HEARTBEAT_SECONDS = 10.0
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")
_EVENT_ID = re.compile(r"([1-9][0-9]{0,8}):([0-9]{1,15})")


def _event(name: str, data: object, event_id: str | None = None) -> bytes:
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data)}")
    return ("\n".join(lines) + "\n\n").encode()


def _attempt_asked(view: View, run: RunRecord) -> int | None:
    raw = view.request.query.get("attempt", "")
    return int(raw) if raw.isdigit() and 1 <= int(raw) <= run.attempt else None


def _start(view: View, run: RunRecord) -> tuple[int | None, int]:
    """The attempt to follow and the offset to start from. A reconnect
    (``Last-Event-ID: <attempt>:<offset>``) resumes the attempt it was
    following, where its last event ended; otherwise the attempt asked for
    (or the current one, once there is one) from its start. An id naming
    an attempt the run does not have, or another than ``?attempt=``, is
    ignored."""
    asked = _attempt_asked(view, run)
    resumed = _EVENT_ID.fullmatch(view.request.headers.get("Last-Event-ID", ""))
    if resumed is not None:
        attempt, offset = int(resumed[1]), int(resumed[2])
        if attempt <= run.attempt and asked in (None, attempt):
            return attempt, offset
    return asked, 0


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


class _Follow:
    """One follow: the run as last read, the attempt, where the next read
    starts (``read_offset``) and where the text sent so far ends
    (``offset``: before the bytes the decoder holds)."""

    def __init__(self, view: View, run: RunRecord, attempt: int | None, offset: int) -> None:
        self.view = view
        self.services: ApiServices = view.ctx.services
        self.run = run
        self.attempt = attempt
        self.offset = offset
        self.read_offset = offset
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

    async def send(self, resp: web.StreamResponse, data: bytes, final: bool = False) -> None:
        """The whole characters of ``data`` (and of what the decoder held)
        as a chunk; ``final``: the log ended, a split character left is
        sent as U+FFFD."""
        self.read_offset += len(data)
        text = self.decoder.decode(data, final=final)
        held, _ = self.decoder.getstate()
        self.offset = self.read_offset - len(held)
        if text:
            await resp.write(_event("chunk", {"text": text}, f"{self.attempt}:{self.offset}"))
            self.quiet = 0.0

    async def stream(self, resp: web.StreamResponse) -> None:
        if not await self.wait_for_attempt(resp):
            return
        assert self.attempt is not None
        over = attempt_over(self.run, self.attempt)
        while _connected(self.view.request):
            chunk = await read_log(
                self.services, self.run, self.attempt, self.read_offset, CHUNK_BYTES
            )
            if chunk.data:
                await self.send(resp, chunk.data)
                continue
            if chunk.complete or over:
                await self.send(resp, b"", final=True)
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
        follow = _Follow(view, run, *_start(view, run))
        try:
            await follow.stream(resp)
            await resp.write(_event("end", {"state": str(follow.run.state)}))
            await resp.write_eof()
        except (ConnectionResetError, EtcdschedError) as exc:
            # the headers are sent: an error can only end the stream early
            log.info("log events of %s ended early: %s", quoted(run.id), quoted(exc))
        return resp


async def _written_end(services: ApiServices, run: RunRecord, attempt: int) -> int:
    """How many bytes the attempt's log holds now. The log stores have no
    size call, so one-byte reads find it: doubling past the end, then
    halving back (about 2 log2(size) reads: 60 for a gigabyte)."""

    async def holds(offset: int) -> bool:
        return bool((await read_log(services, run, attempt, offset, 1)).data)

    if not await holds(0):
        return 0
    low, high = 1, 2  # low <= size < high, once the doubling stops
    while await holds(high - 1):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if await holds(middle - 1):
            low = middle
        else:
            high = middle
    return low


@page
async def log_download(view: View) -> web.StreamResponse:
    """One attempt's log as a file: the bytes it held when the download
    began. A log still being written is not followed (the live log does
    that), so every download ends, and it holds no follow slot."""
    view.require(routes_runs.run_log)
    run = (await routes_runs.visible_run(view.call(), view.call().run_id())).value
    attempt = _attempt_asked(view, run) or run.attempt
    services = view.ctx.services
    end = await _written_end(services, run, attempt)
    name = _UNSAFE_NAME.sub("_", f"{run.id}.attempt-{attempt}") + ".log"
    resp = web.StreamResponse(
        headers={
            **SECURITY_HEADERS,
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{name}"',
        }
    )
    await resp.prepare(view.request)
    offset = 0
    try:
        while offset < end:
            limit = min(DOWNLOAD_BYTES, end - offset)
            chunk = await read_log(services, run, attempt, offset, limit)
            if not chunk.data:  # deleted meanwhile (retention)
                break
            await resp.write(chunk.data)
            offset = chunk.next_offset
        await resp.write_eof()
    except (ConnectionResetError, EtcdschedError) as exc:
        log.info("log download of %s ended early: %s", quoted(run.id), quoted(exc))
    return resp
