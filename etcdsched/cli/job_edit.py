"""``etcdsched job edit ID``: change a job's spec in an editor, as
``kubectl edit`` does.

The spec is read with its version, written as YAML to a scratch file,
opened in ``$VISUAL``/``$EDITOR`` (default ``vi``), and saved with
``If-Match`` of the version read: a change made by someone else meanwhile
is never overwritten unseen. Whatever keeps the save from happening (the
job changed, the YAML does not parse, the API refuses the spec) keeps the
edited text in its file and prints its path, so the work is not lost;
``--from PATH`` starts the next edit from it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

import aiohttp
import click

from etcdsched.cli import support as out
from etcdsched.cli import yaml_io
from etcdsched.cli.context import Cli, pass_cli
from etcdsched.client import Client
from etcdsched.model.errors import EtcdschedError
from etcdsched.model.records import JobRecord
from etcdsched.model.spec import JobSpec

CANCELLED = "edit cancelled, no changes"


class KeptEdit(click.ClickException):
    """A save that did not happen: the reason, then where the edit is kept."""

    def __init__(self, reason: str, path: Path, job_id: str) -> None:
        super().__init__(reason)
        self.path = path
        self.job_id = job_id

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(self.format_message(), err=True, file=file)
        again = (
            f"etcdsched job edit {shlex.quote(self.job_id)} --from {shlex.quote(str(self.path))}"
        )
        click.echo(f"your edit is kept in {self.path}; to try again: {again}", err=True, file=file)


def is_stale(exc: EtcdschedError) -> bool:
    """The save's ``If-Match`` no longer matched: 412, or the 409
    ``conflict`` naming the version that an API before 412 answers."""
    status = getattr(exc, "http_status", None)
    return status == 412 or (exc.code == "conflict" and exc.field in ("version", "If-Match"))


def stale_message(job_id: str, version: int) -> str:
    return f"error: job {job_id} changed since it was read (version {version}); nothing was saved"


def spec_data(spec: JobSpec) -> dict[str, Any]:
    """The whole spec as JSON data, each trigger's and execution's ``kind``
    first (it says which of the other keys apply)."""
    data = spec.model_dump(mode="json")
    for part in ("trigger", "execution"):
        inner = data[part]
        data[part] = {"kind": inner.pop("kind"), **inner}
    return data


def save_spec(cli: Cli, job_id: str, spec: dict[str, Any], version: int) -> JobRecord:
    """PUT ``spec`` only if the job is still at ``version``."""

    async def put(client: Client) -> JobRecord:
        return await client.replace_job(job_id, spec, if_version=version)

    return cli.call(put)


def _header(job_id: str, version: int, start_from: Path | None) -> str:
    lines = [
        f"# The spec of job {job_id} (version {version}). Lines starting with '#' are ignored.",
        "# Save and quit to apply it; an unchanged or empty file cancels the edit.",
        f"# It is saved only if the job is still at version {version}.",
    ]
    if start_from is not None:
        lines.append(
            f"# Started from {start_from}: saved, it replaces the whole spec, so a change"
            " made since it was written is undone unless it is made here too."
        )
    return "".join(line + "\n" for line in lines)


def _without_header(text: str) -> str:
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "".join(lines)


def _scratch_file(job_id: str, text: str) -> Path:
    safe = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in job_id)
    fd, name = tempfile.mkstemp(prefix=f"etcdsched-edit-{safe}-", suffix=".yaml")
    with os.fdopen(fd, "w") as file:
        file.write(text)
    return Path(name)


def run_editor(path: Path) -> None:
    """``$VISUAL``, else ``$EDITOR``, else ``vi``, split as a shell would
    (``code --wait`` works), on ``path``; a failing editor cancels the edit."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    try:
        status = subprocess.run([*shlex.split(editor), str(path)], check=False).returncode
    except (OSError, ValueError) as exc:
        path.unlink(missing_ok=True)
        raise yaml_io.CliFailure(f"cannot start the editor {editor!r}: {exc}") from None
    if status != 0:
        path.unlink(missing_ok=True)
        raise yaml_io.CliFailure(
            f"the editor {editor!r} exited with status {status}; edit cancelled"
        )


def read_edit(path: Path, job_id: str) -> dict[str, Any] | None:
    """The edited spec; None for an empty file."""
    try:
        documents = yaml_io.read_documents(path.read_text(), str(path))
    except yaml_io.YamlSyntaxError as exc:
        raise KeptEdit(exc.format_message(), path, job_id) from None
    if not documents:
        return None
    if len(documents) > 1 or not isinstance(documents[0], dict):
        raise KeptEdit(f"{path}: the file must hold one spec (a mapping)", path, job_id)
    return documents[0]


@click.command("edit")
@click.argument("job_id")
@click.option(
    "--from",
    "start_from",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Start from this file (one a failed edit kept) instead of the current spec.",
)
@pass_cli
def job_edit(cli: Cli, job_id: str, start_from: Path | None) -> None:
    """Edit a job's spec in $VISUAL or $EDITOR (default vi), then save it.

    It is saved only if nobody changed the job since it was read; if the
    save fails, the edit is kept in a file whose path is printed."""
    view = cli.call(lambda c: c.get_job(job_id))
    current = spec_data(view.spec)
    body = _without_header(start_from.read_text()) if start_from else yaml_io.dump(current)
    path = _scratch_file(view.id, _header(view.id, view.version, start_from) + body)
    run_editor(path)
    edited = read_edit(path, job_id)
    if edited is None or edited == current:
        path.unlink()
        click.echo(CANCELLED)
        return
    try:
        job = save_spec(cli, job_id, edited, view.version)
    except EtcdschedError as exc:
        if is_stale(exc):
            raise KeptEdit(stale_message(view.id, view.version), path, job_id) from None
        where = f" (field: {exc.field})" if exc.field else ""
        raise KeptEdit(f"error: {exc.code}: {exc.message}{where}", path, job_id) from None
    except aiohttp.ClientError as exc:
        raise KeptEdit(f"error: cannot reach the API: {exc}", path, job_id) from None
    path.unlink()
    out.emit(cli.output, job, f"{job.id} saved: version {job.version}")
