"""DirLogStore: one file per attempt, read-only once complete, follow with an injected poll,
a bounded archive; and which store a log store URL names. (The contract both stores
meet is tested against both in tests/integration/test_s3_logstore.py.)"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from etcdsched.logs.factory import log_store_from_url
from etcdsched.logs.store import READ_LIMIT, DirLogStore, Poll
from etcdsched.model.errors import InvalidInput, NotFound

RUN = "job-1@01767225600000"


@pytest.fixture
def store(tmp_path: Path) -> DirLogStore:
    return DirLogStore(tmp_path / "logs")


def scripted_poll(steps: list[Callable[[], None]]) -> tuple[list[float], Poll]:
    """A poll that does the next step (a write, a close, nothing) instead of sleeping."""
    waits: list[float] = []

    async def poll(seconds: float) -> None:
        waits.append(seconds)
        steps.pop(0)()

    return waits, poll


def owner_may_write(path: Path) -> bool:
    return bool(path.stat().st_mode & stat.S_IWUSR)


async def test_layout_is_one_file_per_attempt_made_read_only_when_complete(
    store: DirLogStore, tmp_path: Path
) -> None:
    writer = store.open_writer(RUN, 2)
    writer.write(b"hello\n")
    run_dir = tmp_path / "logs" / "job-1" / "01767225600000"
    log = run_dir / "attempt-2.log"
    assert log.read_bytes() == b"hello\n"
    assert owner_may_write(log)
    writer.close()
    writer.close()  # idempotent
    assert not owner_may_write(log)
    assert sorted(path.name for path in run_dir.iterdir()) == ["attempt-2.log"]


async def test_a_log_is_live_whatever_the_umask(store: DirLogStore) -> None:
    previous = os.umask(0o277)
    try:
        writer = store.open_writer(RUN, 1)
        writer.write(b"x\n")
    finally:
        os.umask(previous)
    assert not (await store.read(RUN, 1)).complete
    writer.close()
    assert (await store.read(RUN, 1)).complete


async def test_an_earlier_builds_done_marker_still_completes_a_log(
    store: DirLogStore, tmp_path: Path
) -> None:
    run_dir = tmp_path / "logs" / "job-1" / "01767225600000"
    run_dir.mkdir(parents=True)
    (run_dir / "attempt-1.log").write_bytes(b"old\n")  # writable: as an old writer left it
    assert not (await store.read(RUN, 1)).complete
    (run_dir / "attempt-1.done").touch()
    chunk = await store.read(RUN, 1)
    assert (chunk.data, chunk.complete) == (b"old\n", True)
    reopened = store.open_writer(RUN, 1)  # a new writer: the old marker goes
    reopened.write(b"new\n")
    assert not (run_dir / "attempt-1.done").exists()
    assert not (await store.read(RUN, 1)).complete


async def test_read_while_writing_then_after_close(store: DirLogStore) -> None:
    writer = store.open_writer(RUN, 1)
    writer.write(b"one\n")
    chunk = await store.read(RUN, 1)
    assert (chunk.data, chunk.next_offset, chunk.complete, chunk.attempt) == (b"one\n", 4, False, 1)
    writer.write(b"two\n")
    writer.close()
    chunk = await store.read(RUN, 1, offset=chunk.next_offset)
    assert (chunk.data, chunk.next_offset, chunk.complete) == (b"two\n", 8, True)


async def test_read_pages_with_limit_and_is_complete_only_at_the_end(store: DirLogStore) -> None:
    writer = store.open_writer(RUN, 1)
    writer.write(b"abcdef")
    writer.close()
    first = await store.read(RUN, 1, limit=4)
    assert (first.data, first.complete) == (b"abcd", False)
    rest = await store.read(RUN, 1, offset=first.next_offset, limit=4)
    assert (rest.data, rest.next_offset, rest.complete) == (b"ef", 6, True)
    past_end = await store.read(RUN, 1, offset=100)
    assert (past_end.data, past_end.next_offset, past_end.complete) == (b"", 100, True)


async def test_read_defaults_to_the_latest_attempt(store: DirLogStore) -> None:
    for attempt in (1, 3, 2):
        writer = store.open_writer(RUN, attempt)
        writer.write(f"attempt {attempt}\n".encode())
        writer.close()
    assert await store.attempts(RUN) == [1, 2, 3]
    chunk = await store.read(RUN)
    assert (chunk.attempt, chunk.data) == (3, b"attempt 3\n")


async def test_missing_logs_are_not_found(store: DirLogStore) -> None:
    assert await store.attempts(RUN) == []
    with pytest.raises(NotFound):
        await store.read(RUN)
    store.open_writer(RUN, 1).close()
    with pytest.raises(NotFound):
        await store.read(RUN, 2)
    with pytest.raises(NotFound):
        async for _ in store.follow("other@01767225600000"):
            pass


async def test_follow_yields_data_as_it_arrives_and_ends_when_complete(
    store: DirLogStore,
) -> None:
    writer = store.open_writer(RUN, 1)
    writer.write(b"a\n")
    waits, poll = scripted_poll(
        [lambda: writer.write(b"b\n"), lambda: None, lambda: writer.write(b"c\n"), writer.close]
    )
    received = [data async for data in store.follow(RUN, 1, poll=poll)]
    assert received == [b"a\n", b"b\n", b"c\n"]
    assert waits == [0.1, 0.1, 0.1, 0.1]


async def test_follow_from_an_offset_of_a_finished_log_does_not_wait(store: DirLogStore) -> None:
    writer = store.open_writer(RUN, 1)
    writer.write(b"x" * (READ_LIMIT + 10))
    writer.close()
    waits, poll = scripted_poll([])
    received = [data async for data in store.follow(RUN, offset=5, poll=poll)]
    assert [len(data) for data in received] == [READ_LIMIT, 5]
    assert waits == []


async def test_reopened_writer_appends_and_is_live_again(store: DirLogStore) -> None:
    first = store.open_writer(RUN, 1)
    first.write(b"before\n")
    first.close()
    second = store.open_writer(RUN, 1)
    second.write(b"after\n")
    chunk = await store.read(RUN, 1)
    assert (chunk.data, chunk.complete) == (b"before\nafter\n", False)
    second.close()
    assert (await store.read(RUN, 1)).complete
    with pytest.raises(ValueError):
        second.write(b"late\n")


async def test_reopening_a_complete_log_without_root_makes_it_writable(
    store: DirLogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As any user but root, a read-only file cannot be opened for writing."""
    first = store.open_writer(RUN, 1)
    first.write(b"before\n")
    first.close()
    real_open = os.open

    def open_as_a_user(path: Path, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_WRONLY and not os.stat(path).st_mode & stat.S_IWUSR:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_as_a_user)
    second = store.open_writer(RUN, 1)
    second.write(b"after\n")
    chunk = await store.read(RUN, 1)
    assert (chunk.data, chunk.complete) == (b"before\nafter\n", False)


def test_two_threads_write_whole_lines(store: DirLogStore, tmp_path: Path) -> None:
    writer = store.open_writer(RUN, 1)
    lines = {name: f"{name}{'.' * 5000}\n".encode() for name in ("out", "err")}

    def pump(line: bytes) -> None:
        for _ in range(200):
            writer.write(line)

    threads = [threading.Thread(target=pump, args=(line,)) for line in lines.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    content = (tmp_path / "logs" / "job-1" / "01767225600000" / "attempt-1.log").read_bytes()
    written = content.splitlines(keepends=True)
    assert len(written) == 400
    assert set(written) == set(lines.values())


async def test_archive_appends_json_lines(store: DirLogStore, tmp_path: Path) -> None:
    await store.archive("job-1", [json.dumps({"id": 1})])
    await store.archive("job-1", [json.dumps({"id": 2}), json.dumps({"id": 3})])
    archive = tmp_path / "logs" / "job-1" / "archive.jsonl"
    assert [json.loads(line)["id"] for line in archive.read_text().splitlines()] == [1, 2, 3]
    with pytest.raises(InvalidInput):
        await store.archive("job-1", ['{"a":\n1}'])


async def test_delete_removes_every_attempt_but_not_the_archive(
    store: DirLogStore, tmp_path: Path
) -> None:
    for attempt in (1, 2):
        store.open_writer(RUN, attempt).close()
    await store.archive("job-1", ["{}"])
    await store.delete(RUN)
    await store.delete(RUN)  # already gone: fine
    assert await store.attempts(RUN) == []
    assert (tmp_path / "logs" / "job-1" / "archive.jsonl").exists()


@pytest.mark.parametrize(
    "run_id",
    ["../x@01767225600000", "..@01767225600000", "a/../b@01767225600000", "job@../../etc", "job"],
)
async def test_path_traversal_is_refused(store: DirLogStore, run_id: str) -> None:
    with pytest.raises(InvalidInput):
        await store.read(run_id, 1)
    with pytest.raises(InvalidInput):
        store.open_writer(run_id, 1)
    with pytest.raises(InvalidInput):
        await store.delete(run_id)


@pytest.mark.parametrize("job_id", ["..", ".", "../etc", "a/b", ""])
async def test_archive_refuses_bad_job_ids(store: DirLogStore, job_id: str) -> None:
    with pytest.raises(InvalidInput):
        await store.archive(job_id, ["{}"])


@pytest.mark.parametrize("attempt", [0, -1, True])
def test_attempt_numbers_start_at_one(store: DirLogStore, attempt: int) -> None:
    with pytest.raises(InvalidInput):
        store.open_writer(RUN, attempt)


async def test_a_lazy_writer_touches_nothing_until_it_writes(
    store: DirLogStore, tmp_path: Path
) -> None:
    silent = store.open_writer(RUN, 1, lazy=True)
    silent.close()
    assert silent.closed
    assert not (tmp_path / "logs").exists()  # no directory, file or marker
    assert await store.attempts(RUN) == []
    with pytest.raises(ValueError):
        silent.write(b"late\n")
    chatty = store.open_writer(RUN, 2, lazy=True)
    chatty.write(b"hello\n")
    chunk = await store.read(RUN, 2)
    assert (chunk.data, chunk.complete) == (b"hello\n", False)
    chatty.close()
    assert (await store.read(RUN, 2)).complete


async def test_an_archive_past_twice_its_bound_keeps_its_newest_whole_lines(
    tmp_path: Path,
) -> None:
    store = DirLogStore(tmp_path / "logs", archive_keep_bytes=100)
    lines = [json.dumps({"id": i, "pad": "x" * 20}) for i in range(30)]  # 41-42 bytes a line
    for line in lines:
        await store.archive("job-1", [line])
    archive = tmp_path / "logs" / "job-1" / "archive.jsonl"
    kept = archive.read_text().splitlines()
    assert 2 <= len(kept) <= 4  # cut to at most 100 bytes whenever past 200
    assert kept == lines[-len(kept) :]
    assert not list(archive.parent.glob(".*"))  # the cut's copy was renamed over it


async def test_a_single_line_larger_than_the_bound_is_not_kept_in_part(tmp_path: Path) -> None:
    store = DirLogStore(tmp_path / "logs", archive_keep_bytes=10)
    await store.archive("job-1", [json.dumps({"pad": "y" * 40})])
    assert (tmp_path / "logs" / "job-1" / "archive.jsonl").read_text() == ""


async def test_aclose_of_a_directory_writer_completes_its_log(store: DirLogStore) -> None:
    writer = store.open_writer(RUN, 1)
    writer.write(b"x\n")
    await writer.aclose()
    assert (await store.read(RUN, 1)).complete
    await store.aclose()


# -- which store a URL names -----------------------------------------------------
def test_a_path_or_file_url_is_a_directory_store(tmp_path: Path) -> None:
    default = log_store_from_url("", tmp_path)
    named = log_store_from_url(str(tmp_path / "a"), tmp_path, endpoint_url=None)
    as_url = log_store_from_url(f"file://{tmp_path}/b%20c", tmp_path, region="eu")
    stores = [default, named, as_url]
    assert all(isinstance(store, DirLogStore) for store in stores)
    assert [store.root for store in stores if isinstance(store, DirLogStore)] == [
        tmp_path,
        tmp_path / "a",
        tmp_path / "b c",
    ]


def test_an_s3_url_is_an_object_store_with_its_options(tmp_path: Path) -> None:
    from etcdsched.logs.s3 import S3LogStore

    (tmp_path / "ak").write_text("AK\n")
    (tmp_path / "sk").write_text("SK\n")
    store = log_store_from_url(
        "s3://bucket/some/prefix/",
        tmp_path,
        endpoint_url="http://127.0.0.1:9",
        access_key_file=str(tmp_path / "ak"),
        secret_key_file=str(tmp_path / "sk"),
        region=None,
    )
    assert isinstance(store, S3LogStore)
    assert (store.bucket.name, store.prefix) == ("bucket", "some/prefix/")
    assert store.bucket.options.credentials() == ("AK", "SK")
    bare = log_store_from_url("s3://bucket", tmp_path)
    assert isinstance(bare, S3LogStore) and bare.prefix == ""


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("s3:///prefix", {}),
        ("http://host/logs", {}),
        ("file://elsewhere/logs", {}),
        ("s3://bucket", {"no_such_option": 1}),
        ("s3://bucket", {"access_key_file": "/a"}),  # without its secret
        ("s3://bucket", {"addressing_style": "sideways"}),
    ],
)
def test_bad_log_store_urls_and_options_are_refused(
    tmp_path: Path, url: str, options: dict[str, object]
) -> None:
    with pytest.raises(InvalidInput):
        log_store_from_url(url, tmp_path, **options)
