"""docker/compose.yaml brought up for real with pytest-docker (issue 30): a
job created through the API with the bootstrap token runs on the sample
app's sidecar worker (chosen by its selector), reaches the app on
localhost, and its log is read back from the object store through the API.

Needs a Docker engine with Compose v2. Without one (CI here, and any
machine without Docker) the whole module is skipped at collection, with
the reason, before any fixture runs: the skip mark is decided by
``docker_unavailable()`` at import, and a skipped test never sets up its
fixtures, so pytest-docker's ``docker_services`` (which would run ``docker
compose up``) is never invoked. Installing pytest-docker alone only adds
fixtures nobody else asks for.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from etcdsched.client import LogRead, SyncClient
from etcdsched.model.records import RunRecord
from tests.support.eventually import wait_until

DOCKER = Path(__file__).resolve().parents[2] / "docker"
API_PORT = "18080"  # published on 127.0.0.1 only (ETCDSCHED_API_PUBLISH_PORT)
UP_TIMEOUT = 600.0  # the first `up` builds the agent image
JOB_TIMEOUT = 120.0
T = TypeVar("T")


def docker_unavailable() -> str | None:
    """Why the deployment cannot be brought up here, or None if it can.
    Asked once, at collection; each probe is bounded so a hung daemon
    socket skips rather than stalls the suite."""
    if shutil.which("docker") is None:
        return "no docker CLI on PATH"
    for probe, why in (
        (["docker", "info"], "no Docker engine reachable (`docker info` failed)"),
        (["docker", "compose", "version"], "no Docker Compose v2 (`docker compose`)"),
    ):
        try:
            result = subprocess.run(probe, capture_output=True, timeout=30, check=False)
        except subprocess.TimeoutExpired:
            return f"{why}: timed out"
        if result.returncode != 0:
            return why
    return None


UNAVAILABLE = docker_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"deploy test: {UNAVAILABLE}")


# -- pytest-docker's configuration fixtures (overrides of its defaults) ------


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(DOCKER / "compose.yaml")


@pytest.fixture(scope="session")
def docker_setup(monkeypatch_session: pytest.MonkeyPatch) -> list[str]:
    """Secrets first (the file refuses to start without them), then ``up``
    detached: one-off steps exit, which ``up --wait`` would take for failure;
    readiness is waited for below, on the API itself."""
    subprocess.run(["sh", str(DOCKER / "make-secrets.sh")], check=True, timeout=60)
    monkeypatch_session.setenv("ETCDSCHED_API_PUBLISH_PORT", API_PORT)
    return ["up --build --detach"]


@pytest.fixture(scope="session")
def docker_cleanup() -> list[str]:
    return ["down --volumes --timeout 60"]


@pytest.fixture(scope="session")
def monkeypatch_session() -> Iterator[pytest.MonkeyPatch]:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


# -- the deployment -----------------------------------------------------------


def compose(command: str, file: str, project: str, *args: str) -> str:
    """One ``docker compose`` call on pytest-docker's project."""
    argv = [*command.split(), "-f", file, "-p", project, *args]
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=120).stdout


def eventually(probe: Callable[[], T | None], timeout: float, what: str) -> T:
    """``probe()``'s first result that is not None; errors count as not yet."""

    def ready() -> T:
        try:
            value = probe()
        except Exception as error:  # a service still starting: not yet
            raise AssertionError(f"{what}: {error!r}") from error
        assert value is not None, f"{what}: not yet"
        return value

    return wait_until(ready, timeout, interval=2.0, message=what)


@pytest.fixture(scope="session")
def api(
    docker_services: Any,
    docker_compose_command: str,
    docker_compose_file: str,
    docker_compose_project_name: str,
) -> SyncClient:
    """A client of the deployment's API with the first admin token, read
    from the bootstrap step's volume (it is printed nowhere)."""

    def token() -> str | None:
        out = compose(docker_compose_command, docker_compose_file, docker_compose_project_name,
                      "run", "--rm", "--no-deps", "--entrypoint", "cat", "bootstrap",
                      "/bootstrap/admin.token")  # fmt: skip
        return out.strip() or None

    client = SyncClient(f"http://127.0.0.1:{API_PORT}", eventually(token, UP_TIMEOUT, "a token"))
    eventually(lambda: client.call(lambda c: c.ready()), UP_TIMEOUT, "the API")
    return client


# -- the test -------------------------------------------------------------------

# Prints what the sample app serves on its loopback-only port: reachable
# only from inside the app's network namespace, that is, from its sidecar.
FETCH = (
    "import urllib.request as u;"
    " print(u.urlopen('http://127.0.0.1:8000/hello.txt').read().decode(), end='')"
)
JOB = {
    "trigger": {"kind": "now"},
    "selector": {"app": "sample"},
    "execution": {"argv": ["python3", "-c", FETCH]},
}


def sidecar_id(api: SyncClient) -> str | None:
    workers = api.call(lambda c: c.cluster()).workers
    chosen = [w.id for w in workers if w.labels == JOB["selector"]]
    return chosen[0] if chosen else None


def finished_run(api: SyncClient, job_id: str) -> RunRecord | None:
    runs = api.call(lambda c: c.list_runs(job_id)).items
    return runs[0] if runs and runs[0].state.terminal else None


def test_a_job_runs_on_the_sidecar_and_its_log_comes_from_the_object_store(
    api: SyncClient,
) -> None:
    sidecar = eventually(lambda: sidecar_id(api), UP_TIMEOUT, "the sidecar worker")
    job = api.call(lambda c: c.create_job(JOB, "deploy-smoke"))
    run = eventually(lambda: finished_run(api, job.id), JOB_TIMEOUT, "the run to end")
    assert run.state.value == "succeeded", run
    assert run.attempts[-1].worker == sidecar, "the selector did not pick the sidecar"

    def complete_log() -> LogRead | None:
        read = api.call(lambda c: c.read_log(run.id))
        return read if read.complete else None

    log = eventually(complete_log, JOB_TIMEOUT, "the log to be complete in the object store")
    assert log.data.decode() == "hello from sample-app\n"
