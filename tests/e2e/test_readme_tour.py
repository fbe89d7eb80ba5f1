"""The README's five-minute tour, end to end, through the CLI and real processes."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etcdsched.store.embedded import etcd_binary
from tests.support.eventually import wait_until
from tests.support.up_process import Tour

pytestmark = pytest.mark.slow


@pytest.fixture
def tour(tmp_path: Path) -> Iterator[Tour]:
    t = Tour(tmp_path)
    yield t
    t.close()


def runs(tour: Tour, job_id: str) -> list[dict[str, Any]]:
    return list(tour.json("job", "runs", job_id)["items"])


def test_readme_tour(tour: Tour) -> None:
    up = tour.spawn("up", "--port", str(tour.api_port))
    wait_until(tour.ready, timeout=60)
    assert (tour.workdir / ".etcdsched" / "admin.token").exists()

    tour.cli(
        "job",
        "create",
        "--id",
        "hello",
        "--every",
        "2s",
        "--",
        "sh",
        "-c",
        "echo hello from $ETCDSCHED_RUN_ID",
    )
    tour.cli(
        "job",
        "create",
        "--id",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--tz",
        "Europe/Berlin",
        "--timeout",
        "1h",
        "--",
        "./backup.sh",
    )
    wait_until(lambda: any(r["state"] == "succeeded" for r in runs(tour, "hello")), timeout=30)
    done = next(r for r in runs(tour, "hello") if r["state"] == "succeeded")
    assert f"hello from {done['id']}" in tour.cli("run", "logs", done["id"])
    assert "succeeded" in tour.cli("run", "get", done["id"])

    tour.cli("job", "create", "--id", "once", "--now", "--", "true")
    wait_until(lambda: len(runs(tour, "once")) == 1, timeout=30)
    assert "succeeded" in tour.cli("run", "wait", runs(tour, "once")[0]["id"], "--timeout", "60")

    tour.cli("job", "create", "--id", "sleepy", "--now", "--", "sleep", "300")
    wait_until(lambda: [r["state"] for r in runs(tour, "sleepy")] == ["running"], timeout=30)
    sleepy = runs(tour, "sleepy")[0]["id"]
    tour.cli("run", "cancel", sleepy)
    wait_until(lambda: runs(tour, "sleepy")[0]["state"] == "cancelled", timeout=30)
    assert "WORKER" in tour.cli("status")

    _kill_a_worker_and_see_the_rerun(tour)

    keys = subprocess.run(
        [
            str(etcd_binary("etcdctl")),
            "--endpoints",
            tour.etcd,
            "--user",
            f"etcdsched:{(tour.workdir / '.etcdsched' / 'etcd.password').read_text().strip()}",
            "get",
            "--prefix",
            "/etcdsched/jobs/",
            "--keys-only",
        ],
        capture_output=True,
        timeout=30,
        check=True,
    ).stdout.decode()
    assert "/etcdsched/jobs/default:hello" in keys  # a job id is <tenant>:<name>

    up.send_signal(signal.SIGINT)
    assert up.wait(60) == 0
    tour.spawn("up", "--port", str(tour.api_port))
    wait_until(tour.ready, timeout=60)
    assert tour.json("job", "get", "hello")["id"] == "default:hello"


def _kill_a_worker_and_see_the_rerun(tour: Tour) -> None:
    demo = {
        "ETCDSCHED_ETCD": tour.etcd,
        "ETCDSCHED_WORKER_LABELS": '{"pool":"demo"}',
        "ETCDSCHED_ETCD_USER": "etcdsched",
        "ETCDSCHED_ETCD_PASSWORD_FILE": ".etcdsched/etcd.password",
        "ETCDSCHED_WORKER_TENANTS": '["*"]',
    }
    workers = {
        name: tour.spawn("agent", "--role", "worker", env={**demo, "ETCDSCHED_MEMBER_ID": name})
        for name in ("demo-a", "demo-b")
    }
    (tour.workdir / "long.yaml").write_text(
        "id: long\n"
        "spec:\n"
        "  trigger: {kind: now}\n"
        '  execution: {argv: [sh, -c, "echo attempt $ETCDSCHED_ATTEMPT; sleep 60"]}\n'
        "  selector: {pool: demo}\n"
        "  retry: {max_attempts: 3, initial_delay: 0s}\n"
    )
    tour.cli("job", "create", "-f", "long.yaml")
    wait_until(
        lambda: runs(tour, "long") and runs(tour, "long")[0]["state"] == "running", timeout=30
    )
    first = runs(tour, "long")[0]
    victim = first["worker"]
    workers[victim].kill()

    def rerun() -> bool:
        run = tour.json("run", "get", first["id"])
        states = [a["state"] for a in run["attempts"]]
        return states == ["lost", "running"] and run["attempts"][1]["worker"] != victim

    wait_until(rerun, timeout=20)
