"""The LogStore contract, against both stores: the directory and the object
store (S3LogStore on a real SeaweedFS). Then what only the object store has
to show: reads across chunks, a live follow from another host within the
flush delay, a writer killed -9, and a delete that leaves no object behind.

An S3 writer's bytes reach readers within ``FLUSH_SECONDS``, not at once:
contract tests call ``settle`` (an explicit upload) where the directory
store needs nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from etcdsched.logs.bucket import S3Options
from etcdsched.logs.s3 import S3LogStore
from etcdsched.logs.s3_writer import CHUNK_BYTES, FLUSH_SECONDS, S3LogWriter
from etcdsched.logs.store import READ_LIMIT, DirLogStore, LogStore, LogWriter
from etcdsched.model.errors import InvalidInput, NotFound
from tests.support.eventually import assert_eventually
from tests.support.seaweed import SeaweedS3

RUN = "job-1@01767225600000"
OTHER_RUN = "job-1@01767225660000"


@dataclass
class Harness:
    """One store under test, and how to look behind it."""

    store: LogStore
    kind: str
    archived: Callable[[str], Awaitable[list[str]]]
    leftovers: Callable[[str], Awaitable[list[str]]]
    """Every file or object left of a run (given its id)."""

    async def settle(self, writer: LogWriter) -> None:
        if isinstance(writer, S3LogWriter):
            await writer.flush()

    async def close(self, writer: LogWriter) -> None:
        await writer.aclose()


def dir_harness(root: Path, archive_keep_bytes: int) -> Harness:
    store = DirLogStore(root, archive_keep_bytes=archive_keep_bytes)

    async def archived(job_id: str) -> list[str]:
        path = root / job_id / "archive.jsonl"
        return path.read_text().splitlines() if path.exists() else []

    async def leftovers(run_id: str) -> list[str]:
        job, _, seq = run_id.partition("@")
        run_dir = root / job / seq
        return sorted(str(path) for path in run_dir.rglob("*")) if run_dir.exists() else []

    return Harness(store, "dir", archived, leftovers)


def s3_harness(store: S3LogStore) -> Harness:
    async def archived(job_id: str) -> list[str]:
        lines: list[str] = []
        for obj in await store.bucket.list_all(f"{store.prefix}{job_id}/archive/"):
            data = await store.bucket.get_range(obj.key, 0, obj.size)
            lines += data.decode().splitlines()
        return lines

    async def leftovers(run_id: str) -> list[str]:
        job, _, seq = run_id.partition("@")
        return [obj.key for obj in await store.bucket.list_all(f"{store.prefix}{job}/{seq}/")]

    return Harness(store, "s3", archived, leftovers)


@pytest_asyncio.fixture(loop_scope="session", params=["dir", "s3"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    keep = 1000  # small, so the archive bound is reached by a test
    if request.param == "dir":
        yield dir_harness(tmp_path / "logs", keep)
        return
    seaweed: SeaweedS3 = request.getfixturevalue("seaweed_s3")
    prefix = request.getfixturevalue("s3_prefix")
    store = S3LogStore(seaweed.bucket, prefix, seaweed.options(), keep)
    try:
        yield s3_harness(store)
    finally:
        await store.aclose()


# -- the contract, both stores -----------------------------------------------------
async def test_read_while_writing_then_after_close(harness: Harness) -> None:
    store = harness.store
    writer = store.open_writer(RUN, 1)
    writer.write(b"one\n")
    await harness.settle(writer)
    chunk = await store.read(RUN, 1)
    assert (chunk.data, chunk.next_offset, chunk.complete, chunk.attempt) == (b"one\n", 4, False, 1)
    writer.write(b"two\n")
    await harness.close(writer)
    chunk = await store.read(RUN, 1, offset=chunk.next_offset)
    assert (chunk.data, chunk.next_offset, chunk.complete) == (b"two\n", 8, True)


async def test_read_pages_with_limit_and_is_complete_only_at_the_end(harness: Harness) -> None:
    store = harness.store
    writer = store.open_writer(RUN, 1)
    writer.write(b"abcdef")
    await harness.close(writer)
    first = await store.read(RUN, 1, limit=4)
    assert (first.data, first.complete) == (b"abcd", False)
    rest = await store.read(RUN, 1, offset=first.next_offset, limit=4)
    assert (rest.data, rest.next_offset, rest.complete) == (b"ef", 6, True)
    past_end = await store.read(RUN, 1, offset=100)
    assert (past_end.data, past_end.next_offset, past_end.complete) == (b"", 100, True)
    with pytest.raises(InvalidInput):
        await store.read(RUN, 1, offset=-1)
    with pytest.raises(InvalidInput):
        await store.read(RUN, 1, limit=0)


async def test_read_defaults_to_the_latest_attempt(harness: Harness) -> None:
    store = harness.store
    for attempt in (1, 3, 2):
        writer = store.open_writer(RUN, attempt)
        writer.write(f"attempt {attempt}\n".encode())
        await harness.close(writer)
    assert await store.attempts(RUN) == [1, 2, 3]
    chunk = await store.read(RUN)
    assert (chunk.attempt, chunk.data) == (3, b"attempt 3\n")


async def test_missing_logs_are_not_found(harness: Harness) -> None:
    store = harness.store
    assert await store.attempts(RUN) == []
    with pytest.raises(NotFound):
        await store.read(RUN)
    await harness.close(store.open_writer(RUN, 1))
    assert (await store.read(RUN, 1)).complete  # an empty log, closed
    with pytest.raises(NotFound):
        await store.read(RUN, 2)
    with pytest.raises(NotFound):
        await store.read(RUN, 2, offset=3 * CHUNK_BYTES)
    with pytest.raises(NotFound):
        async for _ in store.follow("other@01767225600000"):
            pass


async def test_follow_yields_data_as_it_arrives_and_ends_when_complete(
    harness: Harness,
) -> None:
    store = harness.store
    writer = store.open_writer(RUN, 1)
    writer.write(b"a\n")
    await harness.settle(writer)

    async def write(data: bytes) -> None:
        writer.write(data)
        await harness.settle(writer)

    async def nothing() -> None:
        pass

    steps = [lambda: write(b"b\n"), nothing, lambda: write(b"c\n"), lambda: harness.close(writer)]
    waits: list[float] = []

    async def poll(seconds: float) -> None:
        waits.append(seconds)
        await steps.pop(0)()

    received = [data async for data in store.follow(RUN, 1, poll=poll)]
    assert b"".join(received) == b"a\nb\nc\n"
    assert received == [b"a\n", b"b\n", b"c\n"]
    assert len(waits) == 4


async def test_follow_from_an_offset_of_a_finished_log_does_not_wait(harness: Harness) -> None:
    store = harness.store
    writer = store.open_writer(RUN, 1)
    writer.write(b"x" * (READ_LIMIT + 10))
    await harness.close(writer)

    async def poll(seconds: float) -> None:
        raise AssertionError("a finished log is read without waiting")

    received = [data async for data in store.follow(RUN, offset=5, poll=poll)]
    assert sum(len(data) for data in received) == READ_LIMIT + 5


async def test_reopened_writer_appends_and_is_live_again(harness: Harness) -> None:
    store = harness.store
    first = store.open_writer(RUN, 1)
    first.write(b"before\n")
    await harness.close(first)
    second = store.open_writer(RUN, 1)
    second.write(b"after\n")
    await harness.settle(second)
    chunk = await store.read(RUN, 1)
    assert (chunk.data, chunk.complete) == (b"before\nafter\n", False)
    await harness.close(second)
    assert (await store.read(RUN, 1)).complete
    with pytest.raises(ValueError):
        second.write(b"late\n")


async def test_a_lazy_writer_touches_nothing_until_it_writes(harness: Harness) -> None:
    store = harness.store
    silent = store.open_writer(RUN, 1, lazy=True)
    await harness.close(silent)
    assert await harness.leftovers(RUN) == []
    assert await store.attempts(RUN) == []
    with pytest.raises(ValueError):
        silent.write(b"late\n")
    chatty = store.open_writer(RUN, 2, lazy=True)
    chatty.write(b"hello\n")
    await harness.settle(chatty)
    chunk = await store.read(RUN, 2)
    assert (chunk.data, chunk.complete) == (b"hello\n", False)
    await harness.close(chatty)
    assert (await store.read(RUN, 2)).complete


async def test_archive_appends_json_lines(harness: Harness) -> None:
    store = harness.store
    await store.archive("job-1", [json.dumps({"id": 1})])
    await store.archive("job-1", [json.dumps({"id": 2}), json.dumps({"id": 3})])
    assert [json.loads(line)["id"] for line in await harness.archived("job-1")] == [1, 2, 3]
    with pytest.raises(InvalidInput):
        await store.archive("job-1", ['{"a":\n1}'])


async def test_an_archive_is_cut_back_to_its_newest_records(harness: Harness) -> None:
    """Past twice its bound (1000 bytes here) it keeps its newest whole lines,
    at most the bound: 40 lines of 100 bytes leave between 10 and 20."""
    store = harness.store
    for start in range(0, 40, 2):
        await store.archive(
            "job-1", [f'{{"id":{i:4d},"pad":"{"x" * 77}"}}' for i in (start, start + 1)]
        )
    ids = [json.loads(line)["id"] for line in await harness.archived("job-1")]
    assert 10 <= len(ids) <= 20
    assert ids == list(range(40 - len(ids), 40))


async def test_delete_removes_every_attempt_but_not_the_archive(harness: Harness) -> None:
    store = harness.store
    for attempt in (1, 2):
        writer = store.open_writer(RUN, attempt)
        writer.write(b"x" * 10)
        await harness.close(writer)
    kept = store.open_writer(OTHER_RUN, 1)
    kept.write(b"kept\n")
    await harness.close(kept)
    await store.archive("job-1", ["{}"])
    await store.delete(RUN)
    await store.delete(RUN)  # already gone: fine
    assert await store.attempts(RUN) == []
    assert await harness.leftovers(RUN) == []
    assert await harness.archived("job-1") == ["{}"]
    assert (await store.read(OTHER_RUN)).data == b"kept\n"


@pytest.mark.parametrize(
    "run_id",
    ["../x@01767225600000", "..@01767225600000", "a/../b@01767225600000", "job@../../etc", "job"],
)
async def test_bad_run_ids_are_refused(harness: Harness, run_id: str) -> None:
    store = harness.store
    with pytest.raises(InvalidInput):
        await store.read(run_id, 1)
    with pytest.raises(InvalidInput):
        store.open_writer(run_id, 1)
    with pytest.raises(InvalidInput):
        await store.delete(run_id)
    with pytest.raises(InvalidInput):
        await store.attempts(run_id)


@pytest.mark.parametrize("attempt", [0, -1, True])
async def test_attempt_numbers_start_at_one(harness: Harness, attempt: int) -> None:
    with pytest.raises(InvalidInput):
        harness.store.open_writer(RUN, attempt)
    with pytest.raises(InvalidInput):
        await harness.store.read(RUN, attempt)


async def test_archive_refuses_bad_job_ids(harness: Harness) -> None:
    for job_id in ["..", ".", "../etc", "a/b", ""]:
        with pytest.raises(InvalidInput):
            await harness.store.archive(job_id, ["{}"])


# -- the object store only -----------------------------------------------------------
def _pattern(size: int) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(size))


async def test_reads_at_any_offset_cross_chunks(s3_logs: S3LogStore) -> None:
    """Small chunks (one per upload) and large ones (a write over CHUNK_BYTES
    is split): every read returns the bytes at its offset, across chunks."""
    body = _pattern(2 * CHUNK_BYTES + 3000)
    writer = s3_logs.open_writer(RUN, 1)
    pieces = [body[:10], body[10:500], body[500:501], body[501:]]
    for piece in pieces:
        writer.write(piece)
        await writer.flush()
    await writer.aclose()
    keys = [obj.key.rpartition("/")[2] for obj in await s3_logs.bucket.list_all(s3_logs.prefix)]
    assert keys[-1] == "complete" and len(keys) == 3 + 3 + 1  # 3 small, 3 split, marker
    for offset in (0, 5, 10, 499, 500, 501, CHUNK_BYTES, CHUNK_BYTES + 600, len(body) - 1):
        for limit in (1, 700, CHUNK_BYTES):
            chunk = await s3_logs.read(RUN, 1, offset, limit)
            assert chunk.data == body[offset : offset + limit], (offset, limit)
            assert chunk.complete == (chunk.next_offset == len(body))
    end = await s3_logs.read(RUN, 1, len(body) + 5 * CHUNK_BYTES)
    assert (end.data, end.complete) == (b"", True)


async def test_a_second_instance_follows_a_live_log_within_the_flush_delay(
    seaweed_s3: SeaweedS3, s3_logs: S3LogStore
) -> None:
    """Another host's store, its own client: no explicit flush anywhere."""
    other = S3LogStore(s3_logs.bucket.name, s3_logs.prefix, seaweed_s3.options())
    writer = s3_logs.open_writer(RUN, 1, lazy=True)
    written: dict[bytes, float] = {}
    seen: dict[bytes, float] = {}

    async def produce() -> None:
        for i in range(12):
            line = f"line {i}\n".encode()
            written[line] = time.monotonic()
            writer.write(line)
            await asyncio.sleep(0.3)
        await writer.aclose()

    async def consume() -> None:
        async for data in other.follow(RUN, 1):
            for line in data.splitlines(keepends=True):
                seen[line] = time.monotonic()

    try:
        producer = asyncio.create_task(produce())
        with pytest.raises(NotFound):  # nothing uploaded yet
            await other.read(RUN, 1)
        await assert_eventually(lambda: other.attempts(RUN), timeout=10)  # the first upload
        await asyncio.wait_for(consume(), timeout=20)
        await producer
    finally:
        await other.aclose()
    assert list(seen) == list(written)
    delays = [seen[line] - written[line] for line in written]
    # the flush delay, then the upload and the reader's next look: about a
    # second on a quiet machine, up to 1.7 s seen on a loaded one
    assert max(delays) < FLUSH_SECONDS + 3.0, delays
    assert len({round(at, 1) for at in seen.values()}) >= 2, "arrived in several chunks"


_KILLED_WRITER = """
import asyncio, sys
from etcdsched.logs.bucket import S3Options
from etcdsched.logs.s3 import S3LogStore

async def main():
    endpoint, bucket, prefix, access_file, secret_file = sys.argv[1:6]
    options = S3Options(endpoint_url=endpoint, region="us-east-1",
                        access_key_file=access_file, secret_key_file=secret_file)
    writer = S3LogStore(bucket, prefix, options).open_writer("job-1@01767225600000", 1)
    for i in range(100_000):
        writer.write(b"line %06d\\n" % i)
        await asyncio.sleep(0.01)

asyncio.run(main())
"""


async def test_a_writer_killed_mid_run_leaves_its_uploaded_chunks_readable(
    seaweed_s3: SeaweedS3, s3_logs: S3LogStore, tmp_path: Path
) -> None:
    script = tmp_path / "writer.py"
    script.write_text(_KILLED_WRITER)
    argv = [
        sys.executable,
        str(script),
        seaweed_s3.endpoint_url,
        s3_logs.bucket.name,
        s3_logs.prefix,
    ]
    argv += [str(seaweed_s3.access_key_file), str(seaweed_s3.secret_key_file)]
    process = subprocess.Popen(argv, cwd=Path(__file__).parents[2])

    async def two_uploads() -> None:
        assert process.poll() is None, "the writer died by itself"
        listed = await s3_logs.bucket.list_all(s3_logs.prefix)
        assert len([obj for obj in listed if obj.key[-1].isdigit()]) >= 2

    try:
        await assert_eventually(two_uploads, timeout=30, interval=0.2)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == -signal.SIGKILL
    text = b""
    chunk = await s3_logs.read(RUN, 1)
    while chunk.data:
        text += chunk.data
        chunk = await s3_logs.read(RUN, 1, chunk.next_offset)
    assert not chunk.complete, "a killed writer never completes its log"
    lines = text.decode().splitlines()
    assert len(lines) >= 2 and lines == [f"line {i:06d}" for i in range(len(lines))]


async def test_delete_removes_every_object_of_the_run(s3_logs: S3LogStore) -> None:
    for run_id in (RUN, OTHER_RUN):
        for attempt in (1, 2):
            writer = s3_logs.open_writer(run_id, attempt)
            for _ in range(3):
                writer.write(b"y" * 1000)
                await writer.flush()
            if run_id == RUN or attempt == 1:
                await writer.aclose()
    await s3_logs.delete(RUN)
    keys = [obj.key for obj in await s3_logs.bucket.list_all(s3_logs.prefix)]
    assert keys and all(key.startswith(f"{s3_logs.prefix}job-1/01767225660000/") for key in keys)
    assert not (await s3_logs.read(OTHER_RUN, 2)).complete
    await s3_logs.aclose()  # the writer still open: closed, and its log completed
    assert (await s3_logs.read(OTHER_RUN, 2)).complete


async def test_keys_from_the_standard_environment_variables(
    seaweed_s3: SeaweedS3, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed_s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed_s3.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed_s3.endpoint_url)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    store = S3LogStore(seaweed_s3.bucket, s3_prefix, S3Options())
    try:
        writer = store.open_writer(RUN, 1)
        writer.write(b"from the environment\n")
        await writer.aclose()
        assert (await store.read(RUN, 1)).data == b"from the environment\n"
    finally:
        await store.aclose()
