"""Run logs in an S3-compatible object store (docs/operations.md, "Log
store"), for agents on several hosts without a shared volume.

Layout under ``s3://<bucket>/<prefix>``::

    <prefix>/<job_id>/<run_seq>/attempt-<n>/<offset:016d>   a chunk: the log's bytes from offset
    <prefix>/<job_id>/<run_seq>/attempt-<n>/complete        the writer closed (body: the size)
    <prefix>/<job_id>/archive/<ns:020d>-<hex>.jsonl         finished runs pruned from etcd

A chunk is named by the offset of its first byte, zero-padded, so one
listing in key order is the log's index: sizes come with the listing, and a
read at ``offset`` lists from ``offset - CHUNK_BYTES`` (no chunk is larger,
so the one holding ``offset`` is the first listed or after it) and fetches
byte ranges of the chunks it needs. Chunks are never rewritten; the
``complete`` marker sorts after every chunk and is written after the last
one, so a listing that shows it shows every chunk: complete means the
writer closed, as a read-only file does for :class:`~etcdsched.logs.store.DirLogStore`.

The writer (:mod:`etcdsched.logs.s3_writer`) uploads a chunk at most
``FLUSH_SECONDS`` after its first byte was written, or at once when a
``CHUNK_BYTES`` backlog is waiting. A worker killed -9 leaves the chunks it
uploaded readable and no marker: followers stop on the run's state, as they
do for a directory.

An archive gets one object per append (an object store cannot append):
retention appends once per trim of a job, a few objects per job a day.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass

from etcdsched.logs.bucket import Bucket, Listed, S3Options
from etcdsched.logs.s3_writer import CHUNK_BYTES, COMPLETE, S3LogWriter, chunk_key
from etcdsched.logs.store import (
    ARCHIVE_KEEP_BYTES,
    READ_LIMIT,
    LogChunk,
    Poll,
    check_archive_lines,
    check_attempt,
    check_job_id,
    check_run_id,
    check_window,
    follow_by_reading,
)
from etcdsched.model.errors import NotFound

log = logging.getLogger(__name__)
FOLLOW_INTERVAL = 0.5
"""Between looks at a live log: new output arrives in chunks seconds apart."""
MAX_GETS = 16
"""Chunks one read fetches (at once) at most; the caller reads on from ``next_offset``."""
CLOSE_WAIT = 10.0
ARCHIVE_DIR = "archive/"
_ATTEMPT_DIR = "attempt-"


@dataclass(frozen=True)
class _Chunk:
    key: str
    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


@dataclass(frozen=True)
class _View:
    """What one listing of an attempt showed from an offset on."""

    chunks: list[_Chunk]
    marked: bool

    def end(self, offset: int) -> int:
        """The log's size, if marked: no chunk listed means all end before ``offset``."""
        return self.chunks[-1].end if self.chunks else offset


class S3LogStore:
    """A :class:`~etcdsched.logs.store.LogStore` in one bucket; layout in the module doc.

    Writers must be opened on the event loop that runs them (their uploads
    are tasks of that loop); :meth:`aclose` waits for what they still have to
    upload and closes the client.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        options: S3Options | None = None,
        archive_keep_bytes: int = ARCHIVE_KEEP_BYTES,
    ) -> None:
        self.bucket = Bucket(bucket, options or S3Options())
        prefix = prefix.strip("/")
        self.prefix = f"{prefix}/" if prefix else ""
        self.archive_keep_bytes = archive_keep_bytes
        self._uploads: set[asyncio.Task[None]] = set()
        self._writers: weakref.WeakSet[S3LogWriter] = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"S3LogStore(s3://{self.bucket.name}/{self.prefix})"

    def open_writer(self, run_id: str, attempt: int, lazy: bool = False) -> S3LogWriter:
        base = self._attempt_prefix(run_id, attempt)
        writer = S3LogWriter(self.bucket, base, asyncio.get_running_loop(), self._uploads, lazy)
        self._writers.add(writer)
        return writer

    async def read(
        self, run_id: str, attempt: int | None = None, offset: int = 0, limit: int = READ_LIMIT
    ) -> LogChunk:
        limit = check_window(offset, limit)
        if attempt is None:
            attempt = await self._latest_attempt(run_id)
        base = self._attempt_prefix(run_id, attempt)
        view = await self._view(base, offset, attempt)
        data = await self._fetch(view.chunks, offset, limit)
        next_offset = offset + len(data)
        complete = view.marked and next_offset >= view.end(offset)
        return LogChunk(data, next_offset, complete, attempt)

    async def follow(
        self,
        run_id: str,
        attempt: int | None = None,
        offset: int = 0,
        poll: Poll = asyncio.sleep,
    ) -> AsyncIterator[bytes]:
        async for data in follow_by_reading(self.read, run_id, attempt, offset, poll):
            yield data

    async def attempts(self, run_id: str) -> list[int]:
        """The attempt folders of the run that hold an object. Some
        S3-compatible stores (SeaweedFS) go on listing a folder whose
        objects were deleted, so each is looked into (a key, at once)."""
        listing = await self.bucket.page(self._run_prefix(run_id), delimiter="/")
        found: dict[int, str] = {}
        for prefix in listing.prefixes:
            name = prefix.rstrip("/").rpartition("/")[2]
            digits = name.removeprefix(_ATTEMPT_DIR)
            if name.startswith(_ATTEMPT_DIR) and digits.isdigit() and digits[0] != "0":
                found[int(digits)] = prefix
        pages = await asyncio.gather(
            *(self.bucket.page(prefix, max_keys=1) for prefix in found.values())
        )
        return sorted(n for n, page in zip(found, pages, strict=True) if page.objects)

    async def archive(self, job_id: str, lines: list[str]) -> None:
        """One new object per call; then the oldest objects go while the
        archive is over its bound (the rule of ``ARCHIVE_KEEP_BYTES``)."""
        check_archive_lines(lines)
        if not lines:
            return
        folder = f"{self._job_prefix(job_id)}{ARCHIVE_DIR}"
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.jsonl"
        await self.bucket.put(folder + name, "".join(f"{line}\n" for line in lines).encode())
        objects = await self.bucket.list_all(folder)
        total = sum(obj.size for obj in objects)
        if total <= 2 * self.archive_keep_bytes:
            return
        doomed = []
        for obj in objects:  # oldest first: names start with the time
            if total <= self.archive_keep_bytes:
                break
            doomed.append(obj.key)
            total -= obj.size
        await self.bucket.delete(doomed)

    async def delete(self, run_id: str) -> None:
        objects = await self.bucket.list_all(self._run_prefix(run_id))
        if objects:
            await self.bucket.delete([obj.key for obj in objects])

    async def forget_job(self, job_id: str) -> None:
        objects = await self.bucket.list_all(f"{self._job_prefix(job_id)}{ARCHIVE_DIR}")
        if objects:
            await self.bucket.delete([obj.key for obj in objects])

    async def aclose(self) -> None:
        """Close the writers still open (nothing more will be written
        through this store), let them finish their uploads (at most
        ``CLOSE_WAIT``), then drop the rest and release the connections."""
        for writer in list(self._writers):
            writer.close()
        await asyncio.sleep(0)  # let the writers' wake-ups run
        pending = set(self._uploads)
        if pending:
            _, late = await asyncio.wait(pending, timeout=CLOSE_WAIT)
            for task in late:
                log.warning("log upload %s abandoned at shutdown", task.get_name())
                task.cancel()
            if late:
                await asyncio.wait(late)
        await self.bucket.close()

    async def _view(self, base: str, offset: int, attempt: int) -> _View:
        """One listing from the chunk that may hold ``offset``; a second,
        of one key, only to tell "no log" from "read past its end"."""
        start_after = chunk_key(base, offset - CHUNK_BYTES) if offset >= CHUNK_BYTES else ""
        listing = await self.bucket.page(base, start_after=start_after)
        if not listing.objects and (
            not start_after or not (await self.bucket.page(base, max_keys=1)).objects
        ):
            raise NotFound(f"no log for attempt {attempt}", field="attempt")
        chunks = [chunk for obj in listing.objects if (chunk := _chunk(base, obj))]
        marked = any(obj.key == base + COMPLETE for obj in listing.objects)
        return _View(chunks, marked and not listing.truncated)

    async def _fetch(self, chunks: list[_Chunk], offset: int, limit: int) -> bytes:
        """The contiguous bytes from ``offset``: byte ranges of up to
        ``MAX_GETS`` chunks, fetched together."""
        ranges: list[tuple[str, int, int]] = []
        position, stop = offset, offset + limit
        for chunk in chunks:
            if chunk.end <= position:
                continue
            if chunk.start > position or position >= stop or len(ranges) == MAX_GETS:
                break
            end = min(chunk.end, stop)
            ranges.append((chunk.key, position - chunk.start, end - chunk.start))
            position = end
        if not ranges:
            return b""
        pieces = await asyncio.gather(
            *(self.bucket.get_range(key, start, end) for key, start, end in ranges)
        )
        data = bytearray()
        for (_, start, end), piece in zip(ranges, pieces, strict=True):
            data += piece
            if len(piece) != end - start:
                break  # a short answer: stop there, the caller reads on
        return bytes(data)

    async def _latest_attempt(self, run_id: str) -> int:
        numbers = await self.attempts(run_id)
        if not numbers:
            raise NotFound(f"run {run_id} has no log", field="run_id")
        return numbers[-1]

    def _attempt_prefix(self, run_id: str, attempt: int) -> str:
        check_attempt(attempt)
        return f"{self._run_prefix(run_id)}{_ATTEMPT_DIR}{attempt}/"

    def _run_prefix(self, run_id: str) -> str:
        """Ids are checked against their patterns, which forbid ``/``: a
        run's keys can never reach another run's or job's."""
        ref = check_run_id(run_id)
        return f"{self.prefix}{ref.job_id}/{ref.seq}/"

    def _job_prefix(self, job_id: str) -> str:
        return f"{self.prefix}{check_job_id(job_id)}/"


def _chunk(base: str, obj: Listed) -> _Chunk | None:
    name = obj.key[len(base) :]
    return _Chunk(obj.key, int(name), obj.size) if name.isdigit() else None
