"""A real webhook receiver on 127.0.0.1 that records every POST.

It answers from a script of statuses (then 200), and can hold the first
request without answering until released (the sender is killed meanwhile).
The e2e tests run it in the test's event loop; the fault harness runs it
on a thread of its own (:meth:`WebhookReceiver.start_thread`) and reads the
record as JSON lines.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiohttp import web

from etcdsched.model.notify_events import EVENT_ID_HEADER, SIGNATURE_HEADER


@dataclass(frozen=True)
class Received:
    event_id: str
    idempotency_key: str
    signature: str
    kind: str
    body: bytes
    at: float

    @property
    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.body)
        return data


@dataclass
class WebhookReceiver:
    statuses: list[int] = field(default_factory=list)
    """Answered in order to the first requests; 200 after them."""
    hold_first: bool = False
    """Keep the first request unanswered until :attr:`release` is set."""
    record_path: Path | None = None
    """Also append each request as a JSON line here (the fault harness)."""
    received: list[Received] = field(default_factory=list)
    port: int = 0
    _runner: web.AppRunner | None = None
    _release: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def start(self) -> WebhookReceiver:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()

    def release(self) -> None:
        if self._release is not None:
            self._release.set()

    def event_ids(self) -> list[str]:
        return [r.event_id for r in self.received]

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        got = Received(
            event_id=request.headers.get(EVENT_ID_HEADER, ""),
            idempotency_key=request.headers.get("Idempotency-Key", ""),
            signature=request.headers.get(SIGNATURE_HEADER, ""),
            kind=request.headers.get("X-Etcdsched-Event", ""),
            body=body,
            at=time.time(),
        )
        index = len(self.received)
        self.received.append(got)
        if self.record_path is not None:
            with self.record_path.open("a") as out:
                line = {
                    "event_id": got.event_id,
                    "kind": got.kind,
                    "at": got.at,
                    "body": got.json,
                    "signature": got.signature,
                }
                out.write(json.dumps(line) + "\n")
        if index == 0 and self.hold_first and self._release is not None:
            await self._release.wait()
        status = self.statuses[index] if index < len(self.statuses) else 200
        return web.Response(status=status, text="ok" if status < 300 else "no")

    def start_thread(self) -> None:
        """Serve on a thread with its own loop (for a harness whose own
        loop blocks); returns once the port is known."""
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def serve() -> None:
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=serve, name="webhook-receiver", daemon=True)
        self._loop = loop
        self._thread.start()
        ready.wait(10)

    def stop_thread(self) -> None:
        """Stop what :meth:`start_thread` started."""
        if self._loop is None or self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = self._thread = None


@pytest_asyncio.fixture(loop_scope="session")
async def receiver() -> AsyncIterator[WebhookReceiver]:
    """A fresh receiver per test (pytest plugin: tests/conftest.py)."""
    got = await WebhookReceiver().start()
    try:
        yield got
    finally:
        await got.stop()
