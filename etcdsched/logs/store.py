"""Where run logs live (docs/design.md, "Logs"). etcd holds no log bodies.

A log belongs to one *attempt* of a run: a retry gets a fresh log, so a
reader can tell which execution printed what. :class:`LogStore` is the
interface the worker (writes), the API (reads, follows) and retention
(archives, deletes) use. :class:`DirLogStore` keeps everything under one
directory, which suits ``etcdsched up`` and a shared volume (the object
store is :mod:`etcdsched.logs.s3`)::

    <root>/<job_id>/archive.jsonl                  finished runs pruned from etcd
    <root>/<job_id>/<run_seq>/attempt-<n>.log      raw bytes, stdout and stderr interleaved

A log is *complete* when its file is read-only: the writer takes the owner's
write bit away after its last write (an ``fchmod``, where a marker file cost
a file creation: 0.2 ms of kernel CPU per attempt on our machines). A reader
that sees the file read-only before reading knows no byte will follow. An
attempt whose worker died never completes its log, so whoever follows such a
log must stop on the run record's state, not on the log. Logs written
by earlier builds were complete when ``attempt-<n>.done`` existed beside
them; readers still honour that marker.

An archive is bounded (``ARCHIVE_KEEP_BYTES``): retention appends to it for
as long as a job lives, and before the bound it grew without end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import stat
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from etcdsched.model.errors import InvalidInput, NotFound
from etcdsched.store.keys import KeyError_, RunRef, parse_run_id, validate_job_id

log = logging.getLogger(__name__)
READ_LIMIT = 1 << 20
"""Default and maximum number of bytes one :meth:`LogStore.read` returns."""
FOLLOW_INTERVAL = 0.1
ARCHIVE_NAME = "archive.jsonl"
_ATTEMPT_LOG = re.compile(r"^attempt-([1-9][0-9]{0,8})\.log$")
LIVE_MODE = 0o600
"""A log its writer may still append to (only the agent's user reads logs:
jobs run as other users, see :mod:`etcdsched.worker.sandbox`)."""
COMPLETE_MODE = 0o400
"""A complete log: no write bit for the owner (see :func:`_is_complete`)."""
ROOT_MODE = 0o700
"""The log root: nothing below it is reachable by any other user."""

ARCHIVE_KEEP_BYTES = 8 << 20
"""An archive is cut back to its newest ``ARCHIVE_KEEP_BYTES`` (whole
lines) when it grows past twice that: bounded disk per job, at least the
last several thousand trimmed runs kept, and a cut costs one rewrite per
``ARCHIVE_KEEP_BYTES`` appended."""

Poll = Callable[[float], Awaitable[None]]


def check_run_id(run_id: str) -> RunRef:
    """The run id's parts, or :class:`InvalidInput` (every store checks ids
    the same way: callers pass ids from requests straight through)."""
    try:
        return parse_run_id(run_id)
    except KeyError_ as error:
        raise InvalidInput(str(error), field="run_id") from error


def check_job_id(job_id: str) -> str:
    try:
        return validate_job_id(job_id)
    except KeyError_ as error:
        raise InvalidInput(str(error), field="job_id") from error


def check_attempt(attempt: int) -> int:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise InvalidInput("attempt must be a positive integer", field="attempt")
    return attempt


def check_window(offset: int, limit: int) -> int:
    """The limit a read may use, once offset and limit are checked."""
    if offset < 0:
        raise InvalidInput("offset must not be negative", field="offset")
    if limit < 1:
        raise InvalidInput("limit must be positive", field="limit")
    return min(limit, READ_LIMIT)


def check_archive_lines(lines: list[str]) -> None:
    if any("\n" in line or "\r" in line for line in lines):
        raise InvalidInput("archive lines must not contain newlines", field="lines")


@dataclass(frozen=True)
class LogChunk:
    """A slice of one attempt's log.

    ``next_offset`` is where the next read continues; ``complete`` is true
    when the writer has closed and this chunk reaches the end of the log.
    """

    data: bytes
    next_offset: int
    complete: bool
    attempt: int


Reader = Callable[[str, int | None, int], Awaitable[LogChunk]]
"""A store's ``read(run_id, attempt, offset)``."""


async def follow_by_reading(
    read: Reader, run_id: str, attempt: int | None, offset: int, poll: Poll
) -> AsyncIterator[bytes]:
    """Follow a log with reads alone, as every store does: read from the
    offset, yield what came, stop at a complete log's end, and wait a poll
    interval whenever a read came back short (caught up with the writer)."""
    chunk = await read(run_id, attempt, offset)
    while True:
        if chunk.data:
            yield chunk.data
        if chunk.complete:
            return
        if len(chunk.data) < READ_LIMIT:
            await poll(FOLLOW_INTERVAL)
        chunk = await read(run_id, chunk.attempt, chunk.next_offset)


class LogWriter(Protocol):
    """Appends one attempt's output. Each ``write`` lands whole (the stdout
    and stderr pumps write whole lines), in call order, and is visible to
    readers at once. ``close`` marks the log complete; it is idempotent, and
    a ``write`` after it raises ``ValueError``."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    async def aclose(self) -> None:
        """``close``, then wait until readers on any host see the log
        complete (an object store uploads the rest first). The worker awaits
        this before it reports the attempt, so a follower that stops at the
        run's end has the whole log."""
        ...


class LogStore(Protocol):
    """Log bodies of run attempts, addressed by run id and attempt number.

    Run ids are validated (``<job>@<seq>``); anything else is refused with
    :class:`~etcdsched.model.errors.InvalidInput`, so a caller can pass ids from
    requests straight through.
    """

    def open_writer(self, run_id: str, attempt: int, lazy: bool = False) -> LogWriter:
        """Create (or reopen, appending) the log of ``attempt``; it counts as
        incomplete until the writer is closed. ``lazy``: touch nothing until
        the first write (an attempt that writes nothing leaves no log, which
        readers of the API see as an empty one). The worker opens every log
        lazily: a silent job, as most cron jobs are, then costs no directory
        and no file (their creation was a third of a worker's CPU per run of
        a real process here), and a claimed run holds no file descriptor
        before its job prints."""
        ...

    async def read(
        self, run_id: str, attempt: int | None = None, offset: int = 0, limit: int = READ_LIMIT
    ) -> LogChunk:
        """Up to ``limit`` bytes from ``offset``. ``attempt=None`` reads the
        latest attempt that has a log. Raises ``NotFound`` if there is none."""
        ...

    def follow(
        self,
        run_id: str,
        attempt: int | None = None,
        offset: int = 0,
        poll: Poll = asyncio.sleep,
    ) -> AsyncIterator[bytes]:
        """Yield the log from ``offset`` as it grows, until it is complete.
        ``poll(seconds)`` is awaited between looks when nothing new arrived."""
        ...

    async def attempts(self, run_id: str) -> list[int]:
        """Attempt numbers that have a log, ascending (empty if none)."""
        ...

    async def archive(self, job_id: str, lines: list[str]) -> None:
        """Append JSON lines (one record each, without newlines) to the job's archive."""
        ...

    async def delete(self, run_id: str) -> None:
        """Remove every attempt's log of a run; a run without logs is fine."""
        ...

    async def forget_job(self, job_id: str) -> None:
        """Remove a deleted job's archive (its runs' logs go by :meth:`delete`)."""
        ...

    async def aclose(self) -> None:
        """Finish what writers left to upload (briefly) and release
        connections: the agent awaits this once, at shutdown."""
        ...


class DirLogWriter:
    """Appends to one attempt's file; see :class:`LogWriter`.

    The file is opened unbuffered with ``O_APPEND`` and each write is one
    ``write(2)`` under a lock, so lines of the two pumps never interleave
    inside a line and a follower sees data as soon as it is written.
    Writes block the caller briefly (a local file); they are not awaited.
    """

    def __init__(self, path: Path, old_marker: Path, lazy: bool = False) -> None:
        self._path = path
        self._old_marker = old_marker
        self._lock = threading.Lock()
        self._file: BinaryIO | None = None
        self._closed = False
        if not lazy:
            self._open()

    def _open(self) -> BinaryIO:
        """Create or reopen the log, live (writable) whatever the umask or
        an earlier writer's close left it."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        try:
            fd = os.open(self._path, flags, LIVE_MODE)
        except PermissionError:  # reopened after it was complete (and we are not root)
            os.chmod(self._path, LIVE_MODE)
            fd = os.open(self._path, flags, LIVE_MODE)
        os.fchmod(fd, LIVE_MODE)
        self._old_marker.unlink(missing_ok=True)  # an old writer's marker: live again
        self._file = open(fd, "ab", buffering=0)  # noqa: SIM115 (closed by close())
        return self._file

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        with self._lock:
            if self._closed:
                raise ValueError("log writer is closed")
            file = self._file or self._open()
            while view:
                view = view[file.write(view) :]

    def close(self) -> None:
        """Mark the log complete; a lazy writer that never wrote leaves nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._file is not None:
                try:
                    os.fchmod(self._file.fileno(), COMPLETE_MODE)  # after the last write
                except OSError as error:  # a volume without modes: followers stop on the run
                    log.warning("cannot mark the log %s complete: %s", self._path, error)
                self._file.close()

    async def aclose(self) -> None:
        """A local file is complete the moment it is closed."""
        self.close()


class DirLogStore:
    """A :class:`LogStore` in a local (or shared) directory; layout in the module doc."""

    def __init__(self, root: Path, archive_keep_bytes: int = ARCHIVE_KEEP_BYTES) -> None:
        self.root = Path(root)
        self.archive_keep_bytes = archive_keep_bytes
        self._archive_lock = threading.Lock()

    def make_private(self) -> None:
        """Create the root if needed and close it to every other user: an
        agent calls this once at start, before any job runs."""
        self.root.mkdir(mode=ROOT_MODE, parents=True, exist_ok=True)
        self.root.chmod(ROOT_MODE)

    def open_writer(self, run_id: str, attempt: int, lazy: bool = False) -> DirLogWriter:
        log, old_marker = self._attempt_paths(run_id, attempt)
        return DirLogWriter(log, old_marker, lazy)

    async def read(
        self, run_id: str, attempt: int | None = None, offset: int = 0, limit: int = READ_LIMIT
    ) -> LogChunk:
        limit = check_window(offset, limit)
        if attempt is None:
            attempt = await self._latest_attempt(run_id)
        log, old_marker = self._attempt_paths(run_id, attempt)
        return _read_chunk(log, old_marker, attempt, offset, limit)

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
        run_dir = self._run_dir(run_id)
        try:
            names = os.listdir(run_dir)
        except FileNotFoundError:
            return []
        found = (_ATTEMPT_LOG.match(name) for name in names)
        return sorted(int(match.group(1)) for match in found if match)

    async def archive(self, job_id: str, lines: list[str]) -> None:
        """Append, and cut the archive back when it outgrew its bound (see
        ``ARCHIVE_KEEP_BYTES``). The cut rewrites the file and renames the
        copy over it: a line another host appends to the same file meanwhile
        (two schedulers during a partition hand-over) can be lost, which an
        archive, a best-effort history beside the logs, can afford."""
        check_archive_lines(lines)
        if not lines:
            return
        path = self._job_dir(job_id) / ARCHIVE_NAME
        payload = "".join(f"{line}\n" for line in lines).encode()
        with self._archive_lock:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab", buffering=0) as file:
                file.write(payload)
                size = os.fstat(file.fileno()).st_size
            if size > 2 * self.archive_keep_bytes:
                _cut_archive(path, self.archive_keep_bytes)

    async def delete(self, run_id: str) -> None:
        """The run's directory; the job's too if that left it empty (a
        deleted job's archive went first: nothing of it stays)."""
        run_dir = self._run_dir(run_id)
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # the job has other runs, or an archive
            run_dir.parent.rmdir()

    async def forget_job(self, job_id: str) -> None:
        """The archive goes; the job's directory too once its runs' logs
        have (retention deletes those a grace after each run ended)."""
        job_dir = self._job_dir(job_id)
        (job_dir / ARCHIVE_NAME).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty yet, or gone already
            job_dir.rmdir()

    async def aclose(self) -> None:
        """Nothing is pending: every write reached the file when it was made."""

    async def _latest_attempt(self, run_id: str) -> int:
        numbers = await self.attempts(run_id)
        if not numbers:
            raise NotFound(f"run {run_id} has no log", field="run_id")
        return numbers[-1]

    def _attempt_paths(self, run_id: str, attempt: int) -> tuple[Path, Path]:
        """The attempt's log, and where an earlier build marked it complete."""
        check_attempt(attempt)
        run_dir = self._run_dir(run_id)
        return run_dir / f"attempt-{attempt}.log", run_dir / f"attempt-{attempt}.done"

    def _run_dir(self, run_id: str) -> Path:
        ref = check_run_id(run_id)
        return self._inside_root(ref.job_id, ref.seq)

    def _job_dir(self, job_id: str) -> Path:
        return self._inside_root(check_job_id(job_id))

    def _inside_root(self, *parts: str) -> Path:
        """Belt and braces against path traversal: the id patterns already
        forbid ``/`` and a leading dot; refuse dot segments and anything that
        would normalise outside the root anyway. Lexical, not ``resolve()``:
        the components are checked above and the directories below the root
        are only ever made by us, and resolving cost three path walks per
        attempt (a tenth of a busy worker's CPU)."""
        for part in parts:
            if part in ("", ".", "..") or "/" in part or "\\" in part or "\0" in part:
                raise InvalidInput(f"invalid path component {part!r}", field="run_id")
        path = self.root.joinpath(*parts)
        root = os.path.normpath(self.root)
        if not os.path.normpath(path).startswith(root + os.sep):
            raise InvalidInput("path escapes the log directory", field="run_id")
        return path


def _is_complete(mode: int) -> bool:
    return not mode & stat.S_IWUSR


def _read_chunk(path: Path, old_marker: Path, attempt: int, offset: int, limit: int) -> LogChunk:
    """Learn whether the log is complete *before* reading: if it was, the
    file had stopped growing, so reaching its end means the log is complete.
    The mode and the size come from one ``fstat``; an old writer's marker is
    looked for before it."""
    marked = old_marker.exists()
    try:
        with open(path, "rb") as file:
            status = os.fstat(file.fileno())
            closed = marked or _is_complete(status.st_mode)
            size = status.st_size
            file.seek(offset)
            data = file.read(limit) if offset < size else b""
    except FileNotFoundError:
        raise NotFound(f"no log for attempt {attempt}", field="attempt") from None
    next_offset = offset + len(data)
    return LogChunk(data, next_offset, closed and next_offset >= size, attempt)


def _cut_archive(path: Path, keep_bytes: int) -> None:
    """Keep the newest whole lines that fit in ``keep_bytes``: written to a
    copy renamed over the archive, so a reader sees the old or the new file."""
    data = path.read_bytes()
    tail = data[-keep_bytes:]
    if len(tail) < len(data) and data[-keep_bytes - 1 : -keep_bytes] != b"\n":
        cut = tail.find(b"\n")  # drop the partial first line (all, if it is one line)
        tail = tail[cut + 1 :] if cut >= 0 else b""
    copy = path.with_name(f".{path.name}.cut")
    with open(copy, "wb") as file:
        file.write(tail)
    os.replace(copy, path)
