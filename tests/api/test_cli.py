"""The CLI against the live in-process API. The CLI runs its own event loop,
so each invocation runs in a thread while the API serves on the test loop."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from click.testing import CliRunner, Result

from etcdsched.cli.main import main
from etcdsched.cli.support import first_slot_ms, when, when_ms
from etcdsched.model.states import RunState
from tests.api.conftest import Api


async def cli(api: Api, *args: str, token: str | None = None, stdin: str | None = None) -> Result:
    env = {"ETCDSCHED_URL": api.url, "ETCDSCHED_TOKEN": token or api.admin}
    runner = CliRunner()
    return await asyncio.to_thread(runner.invoke, main, list(args), input=stdin, env=env)


async def test_job_lifecycle(api: Api) -> None:
    result = await cli(
        api, "job", "create", "--id", "cj", "--cron", "*/5 * * * *", "--tz", "Europe/Berlin",
        "--timeout", "10m", "--retries", "2", "--label", "team=red", "--", "echo", "-n", "hi",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "cj" in result.output and "Europe/Berlin" in result.output
    job = await api.services.jobs.get("default:cj")
    assert job.spec.execution.argv == ["echo", "-n", "hi"]  # type: ignore[union-attr]
    assert job.spec.retry.max_attempts == 3 and job.spec.labels == {"team": "red"}

    listing = await cli(api, "job", "ls", "--label", "team=red")
    assert listing.exit_code == 0 and "cj" in listing.output and "TRIGGER" in listing.output
    as_json = await cli(api, "-o", "json", "job", "get", "cj")
    assert json.loads(as_json.output)["id"] == "default:cj"
    assert (await cli(api, "job", "pause", "cj")).exit_code == 0
    assert (await api.services.jobs.get("default:cj")).state == "paused"
    assert (await cli(api, "job", "resume", "cj")).exit_code == 0

    triggered = await cli(api, "job", "trigger", "cj")
    run_id = triggered.output.strip()
    assert triggered.exit_code == 0 and run_id.startswith("default:cj@")
    runs = await cli(api, "job", "runs", "cj")
    assert run_id in runs.output and "pending" in runs.output
    shown = await cli(api, "run", "get", run_id)
    assert "no live worker" in shown.output
    cancelled = await cli(api, "run", "cancel", run_id)
    assert cancelled.exit_code == 0 and "cancelled" in cancelled.output
    assert (await cli(api, "job", "skips", "cj")).exit_code == 0
    assert (await cli(api, "job", "rm", "cj")).exit_code == 0
    missing = await cli(api, "job", "get", "cj")
    assert missing.exit_code == 1 and "not_found" in missing.output


async def test_job_create_from_file(api: Api, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "id: from-file\nspec:\n  trigger: {kind: interval, every: 30s}\n"
        "  execution: {argv: [sleep, '1']}\n"
    )
    result = await cli(api, "job", "create", "-f", str(path), "--tenant", "acme")
    assert result.exit_code == 0, result.output
    job = await api.services.jobs.get("acme:from-file")
    assert job.spec.tenant == "acme"


MANY_JOBS = """\
id: m-1
spec: {trigger: {kind: interval, every: 30s}, execution: {argv: ["true"]}}
---
id: m-2
spec: {trigger: {kind: interval, every: 0s}, execution: {argv: ["true"]}}
---
trigger: {kind: cron, expr: "0 * * * *"}
execution: {argv: ["true"]}
"""


async def test_job_create_from_a_file_of_many_jobs(api: Api, tmp_path: Path) -> None:
    path = tmp_path / "many.yaml"
    path.write_text(MANY_JOBS)
    args = ("job", "create", "-f", str(path), "--tenant", "acme", "--idempotency-key", "k")
    result = await cli(api, *args)
    assert result.exit_code == 1, result.output
    assert "items[1]: invalid_input: items[1].spec.trigger.interval.every" in result.output
    assert "created: 2, already existed (idempotency key): 0, failed: 1" in result.output
    assert (await api.services.jobs.get("acme:m-1")).spec.tenant == "acme"
    again = await cli(api, *args)  # each job's key is k/<index>: a rerun is a replay
    assert again.exit_code == 1
    assert "created: 0, already existed (idempotency key): 2, failed: 1" in again.output
    async with api.client(api.admin) as client:
        assert len((await client.list_jobs(tenant="acme")).items) == 2


async def test_job_create_many_from_stdin(api: Api) -> None:
    jobs = [
        {"id": f"s-{i}", "spec": {"trigger": {"kind": "interval", "every": "1h"}}} for i in range(3)
    ]
    stdin = json.dumps({"items": jobs})
    result = await cli(api, "-o", "json", "job", "create", "-f", "-", "--", "echo", stdin=stdin)
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    assert (body["created"], body["failed"]) == (3, 0)
    assert [r["id"] for r in body["results"]] == [f"default:s-{i}" for i in range(3)]
    assert (await api.services.jobs.get("default:s-2")).spec.execution.argv == ["echo"]  # type: ignore[union-attr]
    refused = await cli(api, "job", "create", "-f", "-", "--id", "x", stdin=stdin)
    assert refused.exit_code == 2 and "--id names one job" in refused.output


async def test_invalid_input_names_the_field(api: Api) -> None:
    result = await cli(api, "job", "create", "--every", "0s", "--", "true")
    assert result.exit_code == 1
    assert "spec.trigger.interval.every" in result.output
    usage = await cli(api, "job", "create", "--every", "1m", "--cron", "* * * * *", "--", "x")
    assert usage.exit_code == 2


async def test_logs_status_and_tokens(api: Api) -> None:
    async with api.client(api.admin) as client:
        await client.create_job(
            {"trigger": {"kind": "interval", "every": "1h"}, "execution": {"argv": ["x"]}},
            job_id="lg",
        )
        run = await client.trigger_job("lg")
    logs = await cli(api, "run", "logs", run.id)
    assert logs.exit_code == 0 and logs.output == ""
    state = await cli(api, "status")
    assert state.exit_code == 0 and "queue depth: 1" in state.output
    assert "GPU" in state.output and "TENANTS" in state.output  # every capacity dimension
    made = await cli(api, "token", "create", "--tenant", "acme", "--name", "bot")
    secret = made.output.strip()
    assert made.exit_code == 0 and secret.startswith("esk_")
    mine = await cli(api, "job", "ls", token=secret)
    assert mine.exit_code == 0 and "lg" not in mine.output
    denied = await cli(api, "run", "cancel", run.id, token=secret)
    assert denied.exit_code == 1 and "not_found" in denied.output
    assert (await api.services.jobs.runs.load(api.services.store, run.id)).value.state is (
        RunState.PENDING
    )
    limited = await cli(api, "tenant", "set", "acme", "--max-jobs", "3")
    assert limited.exit_code == 0 and "max_jobs" in limited.output


async def test_job_create_shows_the_first_slot_of_an_interval_job(api: Api) -> None:
    """An interval's first slot is its creation instant (issue 29: it used
    to print only the next slot, which, once the first had fired, was the
    second)."""
    result = await cli(api, "job", "create", "--id", "every10", "--every", "10s", "--", "true")
    assert result.exit_code == 0, result.output
    job = await api.services.jobs.get("default:every10")
    assert "first slot" in result.output, result.output
    assert first_slot_ms(job) == job.created_ms
    assert when(job.created_ms) in result.output


async def test_backfill_takes_rfc3339_with_z_or_an_offset(api: Api) -> None:
    made = await cli(api, "job", "create", "--id", "bf", "--cron", "0 * * * *", "--", "true")
    assert made.exit_code == 0, made.output
    for start, end in (("2026-01-01T00:00:00Z", "2026-01-01T02:30:00Z"),
                       ("2026-01-01T00:00:00+00:00", "2026-01-01T02:30:00+00:00")):  # fmt: skip
        result = await cli(api, "job", "backfill", "bf", "--start", start, "--end", end)
        assert result.exit_code == 0, result.output
    bad = await cli(api, "job", "backfill", "bf", "--start", "yesterday", "--end", "today")
    assert bad.exit_code == 2 and "RFC 3339" in bad.output


async def test_output_option_works_anywhere_before_the_command(api: Api) -> None:
    made = await cli(api, "job", "create", "--id", "oj", "--every", "1h", "--", "echo", "-o", "x")
    assert made.exit_code == 0, made.output
    job = await api.services.jobs.get("default:oj")
    assert job.spec.execution.argv == ["echo", "-o", "x"]  # type: ignore[union-attr]
    for args in (("job", "get", "oj", "-o", "json"), ("job", "get", "oj", "--output=json")):
        shown = await cli(api, *args)
        assert shown.exit_code == 0 and json.loads(shown.output)["id"] == "default:oj"


async def test_run_get_shows_times_to_the_millisecond_and_json_as_is(api: Api) -> None:
    made = await cli(api, "job", "create", "--id", "rg", "--every", "1h", "--", "true")
    assert made.exit_code == 0, made.output
    run_id = (await cli(api, "job", "trigger", "rg")).output.strip()
    run = (await api.services.jobs.runs.load(api.services.store, run_id)).value
    shown = await cli(api, "run", "get", run_id)
    assert shown.exit_code == 0, shown.output
    assert f"slot:    {when_ms(run.slot_ms)}" in shown.output
    assert re.search(r"\.\d{3}Z", when_ms(run.slot_ms))
    assert "waiting: no live worker" in shown.output
    raw = json.loads((await cli(api, "-o", "json", "run", "get", run_id)).output)
    assert raw["slot_ms"] == run.slot_ms and raw["attempts"] == []


async def test_after_and_depends_on_jobs_from_flags(api: Api) -> None:
    for name in ("extract", "load"):
        created = await cli(api, "job", "create", "--id", name, "--every", "1h", "--", "true")
        assert created.exit_code == 0, created.output
    after = await cli(
        api, "job", "create", "--id", "report", "--after", "extract", "--after", "load",
        "--on", "completion", "--", "true",
    )  # fmt: skip
    assert after.exit_code == 0, after.output
    assert "after default:extract, default:load (on completion)" in after.output
    job = await api.services.jobs.get("default:report")
    assert job.spec.trigger.jobs == ["default:extract", "default:load"]  # type: ignore[union-attr]
    chained = await cli(
        api, "job", "create", "--id", "b", "--every", "1h", "--depends-on", "extract", "--", "true"
    )
    assert chained.exit_code == 0, chained.output
    assert (await api.services.jobs.get("default:b")).spec.depends_on == ["default:extract"]
    misused = await cli(api, "job", "create", "--every", "1h", "--on", "success", "--", "true")
    assert misused.exit_code == 2 and "--on goes with --after" in misused.output
