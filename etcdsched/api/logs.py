"""Reading and following run logs through the :class:`LogReader` seam.

Following polls the log *and* the run record: the stream ends when the log
says it is complete, or when the run says the attempt is no longer executing
(a worker that vanished never completes its log). Bytes written before that
are drained first, so a follower sees the whole log.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from etcdsched.api.routing import Call, Header
from etcdsched.api.schemas import LogQuery
from etcdsched.api.services import ApiServices
from etcdsched.model.errors import EtcdschedError, NotFound
from etcdsched.model.records import RunRecord
from etcdsched.model.states import EXECUTING
from etcdsched.runtime.quoting import quoted

log = logging.getLogger(__name__)
FOLLOW_POLL = 0.2


@dataclass(frozen=True)
class _Headers:
    next_offset: str = "X-Log-Next-Offset"
    complete: str = "X-Log-Complete"
    attempt: str = "X-Log-Attempt"


LOG_HEADERS = _Headers()
RESPONSE_HEADERS = (
    Header(
        LOG_HEADERS.next_offset,
        "The offset of the next read (absent with follow=true).",
        {"type": "integer", "minimum": 0},
    ),
    Header(
        LOG_HEADERS.complete,
        "true once no more bytes will come (absent with follow=true).",
        {"type": "string", "enum": ["true", "false"]},
    ),
    Header(
        LOG_HEADERS.attempt,
        "The attempt read, 0 before the first (absent with follow=true).",
        {"type": "integer", "minimum": 0},
    ),
)
"""Documented, and not required: a followed log is a stream begun before
anything about its end is known."""


@dataclass(frozen=True)
class Chunk:
    data: bytes
    next_offset: int
    complete: bool
    attempt: int


def attempt_over(run: RunRecord, attempt: int) -> bool:
    """No more output can come for ``attempt`` of ``run``."""
    return run.attempt != attempt or run.state not in EXECUTING


async def read_log(
    services: ApiServices, run: RunRecord, attempt: int | None, offset: int, limit: int
) -> Chunk:
    """One chunk; a run that never started, or whose log is not there yet,
    reads as empty (complete once the attempt is over)."""
    wanted = attempt if attempt is not None else run.attempt
    if wanted == 0 or wanted > run.attempt:
        return Chunk(b"", offset, run.state.terminal, wanted)
    try:
        chunk = await services.logs.read(run.id, wanted, offset, limit)
    except NotFound:
        return Chunk(b"", offset, attempt_over(run, wanted), wanted)
    return Chunk(chunk.data, chunk.next_offset, chunk.complete, chunk.attempt)


async def _wait_for_attempt(call: Call, run: RunRecord) -> tuple[RunRecord, int | None]:
    """For a run that has not started: poll until it does (or ends)."""
    services = call.services
    while run.attempt == 0 and not run.state.terminal and _connected(call.request):
        await services.clock.sleep(FOLLOW_POLL)
        run = (await services.jobs.runs.load(services.store, run.id)).value
    return run, (run.attempt or None)


def _connected(request: web.Request) -> bool:
    transport = request.transport
    return transport is not None and not transport.is_closing()


async def _stream(call: Call, resp: web.StreamResponse, run: RunRecord, query: LogQuery) -> None:
    services = call.services
    attempt = query.attempt
    if attempt is None:
        run, attempt = await _wait_for_attempt(call, run)
        if attempt is None:
            return
    offset, over = query.offset, attempt_over(run, attempt)
    while _connected(call.request):
        chunk = await read_log(services, run, attempt, offset, query.limit)
        if chunk.data:
            await resp.write(chunk.data)
            offset = chunk.next_offset
            continue
        if chunk.complete or over:
            return
        await services.clock.sleep(FOLLOW_POLL)
        run = (await services.jobs.runs.load(services.store, run.id)).value
        over = attempt_over(run, attempt)


async def follow_log(call: Call, run: RunRecord, query: LogQuery) -> web.StreamResponse:
    """Chunked ``text/plain`` stream of one attempt's log while it executes.

    Once the headers are sent an error cannot become a JSON body any more:
    it is logged and the stream ends early (the client sees a short log)."""
    with call.ctx.follows.hold(run.tenant):
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        resp.enable_chunked_encoding()
        await resp.prepare(call.request)
        try:
            await _stream(call, resp, run, query)
        except (ConnectionResetError, EtcdschedError) as exc:
            log.info("log follow of %s ended early: %s", quoted(run.id), quoted(exc))
            return resp
        await resp.write_eof()
        return resp
