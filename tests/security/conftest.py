"""One ``etcdsched up`` for the attacks of tests/security, as an operator
deploys it: started as root, tenants ``a`` and ``b`` mapped to their own
users (numeric uids with no passwd entry), every other tenant to nobody.

The working directory is world-traversable on purpose (pytest's own
temporary directories are 0700 and would hide every file from a job, which
would prove nothing about etcdsched's modes).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from etcdsched.model.states import RunState
from tests.api.conftest import api  # noqa: F401  (the in-process API fixture, for attacks on it)
from tests.support.eventually import wait_until
from tests.support.up_process import Tour

UID_A, UID_B = 61001, 61002
RUN_AS = {"a": str(UID_A), "b": str(UID_B), "*": "nobody"}


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("switching users needs root (CI runs as root); this run is not")


class Cluster:
    """The running ``up`` and an admin's HTTP calls to it."""

    def __init__(self, tour: Tour) -> None:
        self.tour = tour
        self.data_dir = tour.workdir / ".etcdsched"
        self.url = f"http://127.0.0.1:{tour.api_port}"

    @property
    def admin_token(self) -> str:
        return (self.data_dir / "admin.token").read_text().strip()

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = None
    ) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token or self.admin_token}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
                status = response.status
        except urllib.error.HTTPError as error:
            raw, status = error.read(), error.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def run_job(self, job_id: str, tenant: str, script: str, **extra: Any) -> dict[str, Any]:
        """Create a ``now`` job running ``sh -c script``; return its ended run."""
        spec = {
            "tenant": tenant,
            "trigger": {"kind": "now"},
            "execution": {"argv": ["sh", "-c", script], **extra},
        }
        status, body = self.call("POST", "/v1/jobs", {"id": job_id, "spec": spec})
        assert status == 201, body
        return wait_until(lambda: self._ended_run(body["id"]), timeout=30)

    def start_job(self, job_id: str, tenant: str, script: str, **extra: Any) -> str:
        spec = {
            "tenant": tenant,
            "trigger": {"kind": "now"},
            "execution": {"argv": ["sh", "-c", script], **extra},
        }
        status, body = self.call("POST", "/v1/jobs", {"id": job_id, "spec": spec})
        assert status == 201, body
        return str(wait_until(lambda: self._run_in(body["id"], "running"), timeout=30)["id"])

    def log(self, run_id: str) -> str:
        request = urllib.request.Request(f"{self.url}/v1/runs/{run_id}/log")
        request.add_header("Authorization", f"Bearer {self.admin_token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return str(response.read().decode(errors="replace"))

    def _ended_run(self, job_id: str) -> dict[str, Any]:
        _, page = self.call("GET", f"/v1/jobs/{job_id}/runs")
        ended = [r for r in page.get("items", []) if r["state"] in TERMINAL]
        assert ended, f"no run of {job_id} has ended yet"
        return dict(ended[0])

    def _run_in(self, job_id: str, state: str) -> dict[str, Any]:
        _, page = self.call("GET", f"/v1/jobs/{job_id}/runs")
        found = [r for r in page.get("items", []) if r["state"] == state]
        assert found, f"no run of {job_id} is {state} yet"
        return dict(found[0])


TERMINAL = {state.value for state in RunState if state.terminal}


@contextlib.contextmanager
def running_up() -> Iterator[Cluster]:
    needs_root()
    workdir = Path(tempfile.mkdtemp(prefix="etcdsched-security-"))
    workdir.chmod(0o755)
    tour = Tour(workdir)
    tour.env["ETCDSCHED_WORKER_RUN_AS"] = json.dumps(RUN_AS)
    tour.env["ETCDSCHED_WORKER_SLOTS"] = "8"
    tour.spawn("up", "--port", str(tour.api_port))
    try:
        wait_until(tour.ready, timeout=60)
        wait_until(lambda: (workdir / ".etcdsched" / "admin.token").exists(), timeout=10)
        yield Cluster(tour)
    finally:
        tour.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    """Shared by the attacks that leave the cluster as they found it."""
    with running_up() as shared:
        yield shared
