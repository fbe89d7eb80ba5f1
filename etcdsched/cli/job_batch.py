"""``etcdsched job create -f FILE`` when the file holds many jobs (read by
``yaml_io.read_documents``): sending them through ``POST /v1/jobs:batch``
in chunks, and telling what became of each.

A file holds many jobs when it is a list, a mapping with ``items``, or a
YAML stream of several documents; each job is what a one-job file holds
(``{id?, spec}`` or a bare spec) plus an optional ``idempotency_key``.
Anything else about an item (a missing spec, a bad field) is left for the
API to name, so one bad job is one failed item, not a refused file.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import click

from etcdsched.api.schemas import MAX_BATCH, ErrorDetail, JobBatchResult
from etcdsched.cli import support as out
from etcdsched.client import Client

MAX_CHUNK_BYTES = 512 * 1024
"""JSON bytes of one request's items: half the API's default body limit
(``max_body_bytes``, 1 MiB), which refuses a larger request whole."""


def many_jobs(documents: list[Any]) -> list[Any] | None:
    """The jobs of a file that holds many, or None for a one-job file (or
    an empty one, which the one-job path refuses)."""
    if len(documents) > 1:
        return documents
    if not documents:
        return None
    only = documents[0]
    if isinstance(only, list):
        return only
    if isinstance(only, dict) and set(only) == {"items"}:
        items = only["items"]
        if not isinstance(items, list):
            raise click.BadParameter("'items' must be a list of jobs", param_hint="--file")
        return items
    return None


def batch_item(document: Any, index: int, flags: dict[str, Any], key: str | None) -> Any:
    """One job of a many-job file as a batch item, with the command line's
    flags applied to its spec (they override the file, as for one job).
    ``--idempotency-key K`` gives the item at ``index`` the key ``K/index``
    unless it has its own, so running the same file again is safe."""
    if not isinstance(document, dict):
        return document
    item = dict(document) if "spec" in document else {"spec": document}
    if isinstance(item["spec"], dict):
        item["spec"] = out.apply_flags(dict(item["spec"]), flags)
    if key and "idempotency_key" not in item:
        item["idempotency_key"] = f"{key}/{index}"
    return item


def chunks(items: list[Any]) -> Iterator[tuple[int, list[Any]]]:
    """``(offset, items)`` of each request: at most ``MAX_BATCH`` items and
    about ``MAX_CHUNK_BYTES`` of JSON (one larger item goes alone)."""
    start, size = 0, 0
    for index, item in enumerate(items):
        weight = len(json.dumps(item, default=str)) + 1
        if index > start and (index - start >= MAX_BATCH or size + weight > MAX_CHUNK_BYTES):
            yield start, items[start:index]
            start, size = index, 0
        size += weight
    if start < len(items):
        yield start, items[start:]


@dataclass
class Tally:
    """What became of the items so far, each failure by its index in the file."""

    created: int = 0
    existed: int = 0
    failures: list[JobBatchResult] = field(default_factory=list)
    results: list[JobBatchResult] = field(default_factory=list)

    def add(self, offset: int, results: list[JobBatchResult]) -> None:
        for result in results:
            result = _renumbered(result, offset)
            self.results.append(result)
            if result.status == 201:
                self.created += 1
            elif result.status == 200:
                self.existed += 1
            else:
                self.failures.append(result)


def _renumbered(result: JobBatchResult, offset: int) -> JobBatchResult:
    """A chunk's result with its index (and the ``items[i]`` its error
    names) counted from the start of the file."""
    if offset == 0:
        return result
    index = result.index + offset
    error = result.error
    if error is not None:
        local, whole = f"items[{result.index}]", f"items[{index}]"
        error = ErrorDetail(
            code=error.code,
            message=error.message.replace(local, whole),
            field=error.field.replace(local, whole) if error.field else None,
        )
    return result.model_copy(update={"index": index, "error": error})


class Progress:
    """``done/total`` and the rate on one stderr line, redrawn as chunks
    return; silent unless stderr is a terminal (a log wants no ``\\r``)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.shown = self.stream.isatty()
        self.started = time.monotonic()
        self.done = 0

    def advance(self, count: int) -> None:
        self.done += count
        if not self.shown:
            return
        elapsed = max(time.monotonic() - self.started, 1e-6)
        width = 30
        filled = width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (width - filled)
        line = f"\r[{bar}] {self.done}/{self.total} jobs  {self.done / elapsed:,.0f}/s"
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


async def send_all(client: Client, items: list[Any], progress: Progress, tally: Tally) -> None:
    """Every item through the batch endpoint, one chunk after another, into
    ``tally`` (which keeps what was done when a request fails). The answers
    carry ids, not job records: the summary needs no more."""
    try:
        for offset, chunk in chunks(items):
            tally.add(offset, await client.create_jobs(chunk, with_jobs=False))
            progress.advance(len(chunk))
    finally:
        progress.close()


def report(output: str, tally: Tally) -> None:
    """The summary and each failure (``-o json``: every result)."""
    if output == "json":
        body = {
            "created": tally.created,
            "existed": tally.existed,
            "failed": len(tally.failures),
            "results": [r.model_dump(mode="json", exclude={"job"}) for r in tally.results],
        }
        click.echo(json.dumps(body, indent=2))
        return
    for failure in tally.failures:
        error = failure.error
        assert error is not None, "a failed item carries its error"
        where = f" (field: {error.field})" if error.field else ""
        click.echo(f"items[{failure.index}]: {error.code}: {error.message}{where}")
    click.echo(
        f"created: {tally.created}, already existed (idempotency key): {tally.existed},"
        f" failed: {len(tally.failures)}"
    )
