"""``etcdsched job edit`` and ``job set`` against the live API (issue 29):
every save carries If-Match of the version read, a concurrent change is
refused and said plainly, and a failed edit keeps the text in a file.

The editor is ``$EDITOR`` set to a small Python script: no terminal."""

from __future__ import annotations

import re
import shlex
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from etcdsched.api.schemas import JobView
from etcdsched.client import Client
from tests.api.conftest import Api, spec
from tests.api.test_cli import cli

KEPT = re.compile(r"your edit is kept in (\S+);")


@pytest.fixture(autouse=True)
def _scratch_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scratch and kept files in the test's directory, and the test's
    ``$EDITOR``, not a ``$VISUAL`` of whoever runs the suite."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("VISUAL", raising=False)


def editor(tmp_path: Path, body: str) -> str:
    """An ``$EDITOR`` that runs ``body`` with the file's text in ``t``, and
    writes ``t`` back."""
    script = tmp_path / f"editor-{abs(hash(body))}.py"
    script.write_text(
        f"import sys\np = sys.argv[1]\nt = open(p).read()\n{body}\nopen(p, 'w').write(t)\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


async def _job(api: Api, job_id: str, **overrides: object) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(spec(**overrides), job_id=job_id)


async def test_edit_saves_the_edited_spec(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _job(api, "ed1")
    monkeypatch.setenv("EDITOR", editor(tmp_path, "t = t.replace('every: 1h', 'every: 2h')"))
    result = await cli(api, "job", "edit", "ed1")
    assert result.exit_code == 0, result.output
    assert "default:ed1 saved: version 2" in result.output
    job = await api.services.jobs.get("default:ed1")
    assert job.version == 2 and job.spec.trigger.every.total_seconds() == 7200  # type: ignore[union-attr]
    assert not list(tmp_path.glob("etcdsched-edit-*"))  # saved: the scratch file is gone


async def test_an_unchanged_file_cancels_the_edit(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _job(api, "ed2")
    monkeypatch.setenv("EDITOR", "true")
    result = await cli(api, "job", "edit", "ed2")
    assert result.exit_code == 0, result.output
    assert "edit cancelled, no changes" in result.output
    assert (await api.services.jobs.get("default:ed2")).version == 1


async def test_visual_wins_over_editor(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    await _job(api, "ed3")
    monkeypatch.setenv("VISUAL", "false")  # an editor that fails cancels the edit
    monkeypatch.setenv("EDITOR", "true")
    result = await cli(api, "job", "edit", "ed3")
    assert result.exit_code == 1
    assert "the editor 'false' exited with status 1; edit cancelled" in result.output


async def test_a_concurrent_change_keeps_the_edit_for_another_try(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The editor itself changes the job meanwhile (``job set``, another
    process), as a colleague would: the save is refused, the edit kept, and
    ``--from`` applies it to the new version."""
    await _job(api, "ed4")
    other = [sys.executable, "-m", "etcdsched", "job", "set", "ed4", "--priority", "7"]
    body = f"import subprocess\nsubprocess.run({other!r}, check=True)\nt = t.replace('1h', '3h')"
    monkeypatch.setenv("EDITOR", editor(tmp_path, body))
    result = await cli(api, "job", "edit", "ed4")
    assert result.exit_code == 1, result.output
    assert "job default:ed4 changed since it was read (version 1); nothing was saved" in (
        result.output
    )
    kept = Path(_kept(result.output))
    assert "every: 3h" in kept.read_text()
    assert (await api.services.jobs.get("default:ed4")).spec.priority == 7

    monkeypatch.setenv("EDITOR", "true")  # save the kept edit as it is
    again = await cli(api, "job", "edit", "ed4", "--from", str(kept))
    assert again.exit_code == 0, again.output
    job = await api.services.jobs.get("default:ed4")
    assert job.version == 3 and job.spec.trigger.every.total_seconds() == 3 * 3600  # type: ignore[union-attr]
    # the kept file held the priority read before the colleague's change:
    # --from applies the whole edit, which the header and the docs say
    assert job.spec.priority == 100


async def test_invalid_yaml_and_a_refused_spec_keep_the_edit(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _job(api, "ed5")
    monkeypatch.setenv("EDITOR", editor(tmp_path, "t = t.replace('every: 1h', 'every: [1h')"))
    broken = await cli(api, "job", "edit", "ed5")
    assert broken.exit_code == 1
    path = _kept(broken.output)
    first = broken.output.splitlines()[0]
    assert re.fullmatch(rf"{re.escape(path)}:\d+:\d+: .+", first), broken.output
    assert "Traceback" not in broken.output and "every: [1h" in Path(path).read_text()

    monkeypatch.setenv("EDITOR", editor(tmp_path, "t = t.replace('every: 1h', 'every: 0s')"))
    refused = await cli(api, "job", "edit", "ed5")
    assert refused.exit_code == 1
    assert "error: invalid_input:" in refused.output and "trigger" in refused.output
    assert "every: 0s" in Path(_kept(refused.output)).read_text()
    assert (await api.services.jobs.get("default:ed5")).version == 1


async def test_job_set_changes_what_its_flags_say(api: Api) -> None:
    await _job(api, "st1", labels={"team": "red", "old": "x"})
    result = await cli(
        api, "job", "set", "st1", "--cron", "0 3 * * *", "--tz", "Europe/Berlin",
        "--timeout", "10m", "--priority", "900", "--retries", "2", "--label", "env=prod",
        "--label", "old-",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "default:st1: version 2, active" in result.output
    job = await api.services.jobs.get("default:st1")
    trigger = job.spec.trigger
    assert (trigger.kind, trigger.expr, trigger.tz) == ("cron", "0 3 * * *", "Europe/Berlin")  # type: ignore[union-attr]
    assert job.spec.priority == 900 and job.spec.retry.max_attempts == 3
    assert job.spec.timeout is not None and job.spec.timeout.total_seconds() == 600
    assert job.spec.labels == {"team": "red", "env": "prod"}

    zone = await cli(api, "job", "set", "st1", "--tz", "Asia/Tokyo", "--timeout", "none")
    assert zone.exit_code == 0, zone.output
    job = await api.services.jobs.get("default:st1")
    assert (job.spec.trigger.expr, job.spec.trigger.tz) == ("0 3 * * *", "Asia/Tokyo")  # type: ignore[union-attr]
    assert job.spec.timeout is None

    paused = await cli(api, "job", "set", "st1", "--every", "5m", "--pause")
    assert paused.exit_code == 0 and "version 4, paused" in paused.output
    resumed = await cli(api, "job", "set", "st1", "--resume", "--catch-up", "run_once")
    assert resumed.exit_code == 0 and "version 4, active" in resumed.output


async def test_job_set_needs_a_change(api: Api) -> None:
    await _job(api, "st2")
    nothing = await cli(api, "job", "set", "st2")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.output
    both = await cli(api, "job", "set", "st2", "--every", "1m", "--cron", "* * * * *")
    assert both.exit_code == 2
    stray = await cli(api, "job", "set", "st2", "--tz", "UTC")
    assert stray.exit_code == 2 and "--tz" in stray.output


async def test_job_set_refuses_a_job_changed_since_it_was_read(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone changes the job between the CLI's read and its save."""
    await _job(api, "st3")
    real: Callable[[Client, str], Awaitable[JobView]] = Client.get_job

    async def read_then_someone_changes_it(self: Client, job_id: str) -> JobView:
        view = await real(self, job_id)
        await self.replace_job(job_id, spec(priority=5), if_version=view.version)
        return view

    monkeypatch.setattr(Client, "get_job", read_then_someone_changes_it)
    result = await cli(api, "job", "set", "st3", "--priority", "9")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "error: job default:st3 changed since it was read (version 1); nothing was saved: try again"
    )
    assert (await api.services.jobs.get("default:st3")).spec.priority == 5


BROKEN_MANY = """\
id: y-1
spec: {trigger: {kind: interval, every: 30s}, execution: {argv: ["true"]}}
---
id: y-2
spec:
  trigger: {kind: interval, every: 30s}
  execution: {argv: ["true"]}
 bad: indent
"""


async def test_a_yaml_syntax_error_is_one_line_with_its_position(api: Api, tmp_path: Path) -> None:
    one = tmp_path / "one.yaml"
    one.write_text("trigger: {kind: interval, every: 30s}\nexecution: argv: [x]\n")
    single = await cli(api, "job", "create", "-f", str(one))
    assert single.exit_code == 1
    assert single.output == f"{one}:2:16: mapping values are not allowed in this context\n"

    many = tmp_path / "many.yaml"
    many.write_text(BROKEN_MANY)
    result = await cli(api, "job", "create", "-f", str(many))
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith(f"{many}:8:2: ")  # counted from the file's start
    piped = await cli(api, "job", "create", "-f", "-", stdin=BROKEN_MANY)
    assert piped.output.startswith("<stdin>:8:2: ")


async def test_run_wait_says_an_unreachable_api_once_then_counts(api: Api) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    down = Api(f"http://127.0.0.1:{port}", api.admin, "", "", api.services, api.logs, api.http)
    result = await cli(down, "run", "wait", "default:x@1", "--timeout", "1.2")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 3, result.output
    assert lines[0].startswith("warning: cannot reach the API, retrying: ")
    assert re.fullmatch(
        re.escape(lines[0]) + r" \(repeated \d+ times in the last \d+ s\)", lines[1]
    )
    assert lines[2].startswith("error: cannot reach the API")


def _kept(output: str) -> str:
    match = KEPT.search(output)
    assert match, output
    return match.group(1).rstrip(";")
