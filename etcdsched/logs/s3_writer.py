"""The writer of one attempt's log in an object store (layout in
:mod:`etcdsched.logs.s3`).

An object store has no append, and one request per line would cost more
than the job. So :meth:`S3LogWriter.write` (synchronous: the worker's pumps
call it) only buffers, and an asyncio task uploads the buffer as chunk
objects: ``FLUSH_SECONDS`` after the oldest byte not yet sent arrived, or at
once when ``CHUNK_BYTES`` are waiting, whichever is first. A reader on
another host therefore sees output at most about ``FLUSH_SECONDS`` (plus
one upload) late, and a worker killed -9 loses at most that much: what was
uploaded stays readable.

A failed upload keeps its bytes at the front of the buffer and is retried
with backoff, so chunks never leave a gap. While the store refuses, the
buffer grows up to ``MAX_BUFFERED``; output beyond that is dropped and a
note saying how much is written in its place (a job must not stall or die
because its log store is down).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from etcdsched.logs.bucket import Bucket
from etcdsched.model.errors import EtcdschedError

log = logging.getLogger(__name__)
CHUNK_BYTES = 1 << 20
"""The largest chunk object, and the backlog that is uploaded without waiting."""
FLUSH_SECONDS = 2.0
"""The longest a written byte waits before its upload begins."""
MAX_BUFFERED = 16 << 20
DROPPED_NOTE = b"\n[etcdsched: %d bytes of output dropped: the log store did not take them]\n"
ACLOSE_WAIT = 5.0
"""How long :meth:`S3LogWriter.aclose` waits for the last upload (the
worker's report waits on it); the upload goes on in the background."""
CLOSE_DEADLINE = 60.0
"""How long a closed writer keeps retrying before it gives up (the log
then stays incomplete, as a killed worker's does)."""
RETRY_MAX = 5.0
OFFSET_WIDTH = 16
COMPLETE = "complete"
"""The marker object's name: it sorts after every chunk name (digits)."""


def chunk_key(base: str, offset: int) -> str:
    """The chunk that starts at byte ``offset``: zero-padded so key order is offset order."""
    return f"{base}{offset:0{OFFSET_WIDTH}d}"


class S3LogWriter:
    """See :class:`~etcdsched.logs.store.LogWriter`; writes land within
    ``FLUSH_SECONDS``, not at once. Thread-safe: a write from another thread
    wakes the uploader through the loop."""

    def __init__(
        self,
        bucket: Bucket,
        base: str,
        loop: asyncio.AbstractEventLoop,
        tasks: set[asyncio.Task[None]],
        lazy: bool = False,
    ) -> None:
        self._bucket = bucket
        self._base = base
        self._loop = loop
        self._tasks = tasks
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._since: float | None = None
        """``loop.time()`` when the oldest byte not yet uploaded arrived."""
        self._dropped = 0
        self._closed = False
        self._offset: int | None = None
        """The end of what is uploaded; ``None`` until the first upload looked."""
        self._wake = asyncio.Event()
        self._uploading = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        if not lazy:
            self._kick()

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._closed:
                raise ValueError("log writer is closed")
            if len(self._buffer) >= MAX_BUFFERED:
                self._dropped += len(data)
                return
            first = self._since is None
            if first:
                self._since = self._loop.time()
            self._buffer += data
            urgent = len(self._buffer) >= CHUNK_BYTES
        if first or urgent:
            self._signal()

    def close(self) -> None:
        """Mark the log complete once the buffer is uploaded (in the
        background: await :meth:`aclose` to wait for it). A lazy writer
        that never wrote leaves nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._task is not None or self._since is not None
        if started:
            self._signal()

    async def aclose(self) -> None:
        """Close and wait (at most ``ACLOSE_WAIT``) until the log is complete."""
        self.close()
        await asyncio.sleep(0)  # a wake from another thread is in the loop's queue
        task = self._task
        if task is not None:
            await asyncio.wait({task}, timeout=ACLOSE_WAIT)

    async def flush(self) -> None:
        """Upload what is buffered now (tests, and readers that must see it)."""
        async with self._uploading:
            await self._upload()

    def _signal(self) -> None:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._kick()
        else:
            self._loop.call_soon_threadsafe(self._kick)

    def _kick(self) -> None:
        """Start the uploader if needed and wake it (on the loop's thread)."""
        if self._task is None:
            self._task = self._loop.create_task(self._run(), name=f"log upload {self._base}")
            self._tasks.add(self._task)
            self._task.add_done_callback(self._tasks.discard)
        self._wake.set()

    async def _run(self) -> None:
        """Upload when due until closed and drained, then mark complete."""
        failures = 0
        give_up_at: float | None = None
        while True:
            await self._due()
            try:
                async with self._uploading:
                    await self._upload()
                    if self._closed and not self._buffer:
                        await self._bucket.put(self._base + COMPLETE, str(self._offset).encode())
                        return
                failures = 0
            except EtcdschedError as error:  # unreachable, refused, or an unreadable key file
                failures += 1
                now = self._loop.time()
                if self._closed:
                    give_up_at = give_up_at or now + CLOSE_DEADLINE
                    if now >= give_up_at:
                        log.warning("log %s left incomplete: %s", self._base, error)
                        return
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("log %s: upload failed (%d times): %s", self._base, failures, error)
                await asyncio.sleep(min(RETRY_MAX, 0.25 * 2**failures))

    async def _due(self) -> None:
        """Return when an upload is due: closed, a chunk's worth waiting, or
        the oldest waiting byte is ``FLUSH_SECONDS`` old."""
        while True:
            self._wake.clear()  # before looking: a write after the look sets it again
            with self._lock:
                since, closed, size = self._since, self._closed, len(self._buffer)
            if closed or size >= CHUNK_BYTES:
                return
            timeout = None if since is None else since + FLUSH_SECONDS - self._loop.time()
            if timeout is not None and timeout <= 0:
                return
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                return

    async def _upload(self) -> None:
        """Send the buffer as chunks of at most ``CHUNK_BYTES``, in order.
        Whatever was not sent goes back to the front of the buffer."""
        if self._offset is None:
            self._offset = await self._resume()
        with self._lock:
            data, since = bytes(self._buffer), self._since
            self._buffer.clear()
            self._since = None
            if self._dropped:
                data += DROPPED_NOTE % self._dropped
                self._dropped = 0
        sent = 0
        try:
            while sent < len(data):
                piece = data[sent : sent + CHUNK_BYTES]
                await self._bucket.put(chunk_key(self._base, self._offset), piece)
                self._offset += len(piece)
                sent += len(piece)
        finally:
            if sent < len(data):
                with self._lock:
                    self._buffer[:0] = data[sent:]
                    self._since = since

    async def _resume(self) -> int:
        """Where this writer appends: after the chunks an earlier writer of
        the attempt left. Its marker goes: the log is live again."""
        end = 0
        marker = None
        for obj in await self._bucket.list_all(self._base):
            name = obj.key[len(self._base) :]
            if name.isdigit():
                end = max(end, int(name) + obj.size)
            elif name == COMPLETE:
                marker = obj.key
        if marker is not None:
            await self._bucket.delete([marker])
        return end
