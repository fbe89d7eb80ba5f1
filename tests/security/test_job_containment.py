"""Attacks by a job on the control plane and on other tenants' jobs
(issue 27, attacks 1-6), each against a real ``etcdsched up`` started as
root, and each asserting that the job is refused or sees nothing.

Tenant ``b`` is the attacker; tenant ``a`` the victim.
"""

from __future__ import annotations

import base64
import json
import subprocess

import pytest

from etcdsched.store.embedded import etcd_binary
from tests.security.conftest import UID_A, UID_B, Cluster

pytestmark = pytest.mark.slow


def test_jobs_run_as_their_tenants_user_in_a_scratch_dir(cluster: Cluster) -> None:
    for tenant, uid in (("a", UID_A), ("b", UID_B), ("c", 65534)):
        run = cluster.run_job(f"whoami-{tenant}", tenant, 'id -u; id -G; pwd; echo "$HOME"')
        out = cluster.log(run["id"])
        uid_line, groups, cwd, home = out.splitlines()[:4]
        assert uid_line == str(uid), out
        assert "0" not in groups.split()  # none of root's groups either
        assert cwd == home and "etcdsched-scratch" in cwd
        assert not cwd.startswith(str(cluster.tour.workdir))


def test_attack_1_a_job_cannot_read_the_admin_token(cluster: Cluster) -> None:
    token_file = cluster.data_dir / "admin.token"
    run = cluster.run_job("steal-token", "b", f"cat {token_file}; ls {cluster.data_dir}")
    out = cluster.log(run["id"])
    assert cluster.admin_token not in out
    assert "Permission denied" in out
    assert run["state"] == "failed"


def test_attack_2_a_job_cannot_read_another_tenants_log(cluster: Cluster) -> None:
    secret = "victim-log-" + "7f3a9"
    victim = cluster.run_job("log-victim", "a", f"echo {secret[:-5]}''{secret[-5:]}")
    assert secret in cluster.log(victim["id"])  # it is there, for the API
    logs = cluster.data_dir / "logs"
    run = cluster.run_job("read-logs", "b", f"grep -r victim {logs}; find {logs} | head")
    out = cluster.log(run["id"])
    assert secret not in out
    assert "Permission denied" in out


def test_attack_2_a_job_cannot_read_another_tenants_environment(cluster: Cluster) -> None:
    victim = cluster.start_job("env-victim", "a", "sleep 60", env={"API_KEY": "s3cr3t-of-a"})
    try:
        script = (
            "for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; done"
            " | tr '\\0' '\\n' | grep -c s3cr3t-of; true"
        )
        run = cluster.run_job("read-environ", "b", script)
        assert cluster.log(run["id"]).split() == ["0"]
    finally:
        cluster.call("POST", f"/v1/runs/{victim}/cancel")


def test_attack_3_a_job_cannot_read_the_agents_environment(cluster: Cluster) -> None:
    run = cluster.run_job("read-agent", "b", "cat /proc/$PPID/environ; cat /proc/1/environ")
    out = cluster.log(run["id"])
    assert "Permission denied" in out
    assert "ETCDSCHED_" not in out


def test_attack_4_a_job_cannot_write_to_etcd(cluster: Cluster) -> None:
    key = "/etcdsched/tokens/" + "0" * 64
    body = json.dumps(
        {
            "key": base64.b64encode(key.encode()).decode(),
            "value": base64.b64encode(b'{"role": "admin"}').decode(),
        }
    )
    script = f"curl -s -X POST http://{cluster.tour.etcd}/v3/kv/put -d '{body}'"
    run = cluster.run_job("etcd-put", "b", script)
    assert "user name is empty" in cluster.log(run["id"])
    password = (cluster.data_dir / "etcd.password").read_text().strip()
    got = subprocess.run(
        [str(etcd_binary("etcdctl")), "--endpoints", cluster.tour.etcd,
         "--user", f"etcdsched:{password}", "get", key, "--print-value-only"],
        capture_output=True, timeout=30, check=True,
    )  # fmt: skip
    assert got.stdout == b""


def test_attack_5_loader_variables_are_refused_unless_allowed(cluster: Cluster) -> None:
    spec = {
        "tenant": "b",
        "trigger": {"kind": "now"},
        "execution": {"argv": ["true"], "env": {"LD_PRELOAD": "/tmp/evil.so"}},
    }
    status, body = cluster.call("POST", "/v1/jobs", {"id": "preload", "spec": spec})
    assert status == 422, body
    assert body["error"]["field"] == "spec.execution.env"
    assert "LD_PRELOAD" in body["error"]["message"]
    status, _ = cluster.call("PUT", "/v1/tenants/trusted", {"loader_env": True})
    assert status == 200
    execution = {"argv": ["true"], "env": {"PYTHONPATH": "/opt/lib"}}
    allowed = {**spec, "tenant": "trusted", "execution": execution}
    status, body = cluster.call("POST", "/v1/jobs", {"id": "pythonpath", "spec": allowed})
    assert status == 201, body


def test_attack_5_a_jobs_env_is_not_the_agents(cluster: Cluster) -> None:
    run = cluster.run_job("env-seen", "b", "env | sort", env={"PATH": "/usr/bin:/bin"})
    seen = dict(line.split("=", 1) for line in cluster.log(run["id"]).splitlines() if "=" in line)
    assert seen["PATH"] == "/usr/bin:/bin"
    assert not any(name.startswith("ETCDSCHED_") and name not in IDENTITY for name in seen)
    assert "ETCDSCHED_WORKER_RUN_AS" not in seen and "PYTEST_CURRENT_TEST" not in seen


IDENTITY = {
    "ETCDSCHED_JOB_ID",
    "ETCDSCHED_RUN_ID",
    "ETCDSCHED_ATTEMPT",
    "ETCDSCHED_SCHEDULED_AT",
    "ETCDSCHED_SCHEDULED_AT_MS",
    "ETCDSCHED_WORKER_ID",
}


@pytest.mark.parametrize("image", ["--privileged", "-v=/:/host", " alpine", "alpine;id"])
def test_attack_6_a_container_image_cannot_be_a_runtime_flag(cluster: Cluster, image: str) -> None:
    spec = {
        "tenant": "b",
        "trigger": {"kind": "now"},
        "execution": {"kind": "container", "image": image, "args": ["-v=/:/host", "alpine"]},
    }
    status, body = cluster.call("POST", "/v1/jobs", {"spec": spec})
    assert status == 422, body
    assert body["error"]["field"].endswith("image"), body


def test_a_job_cannot_work_in_a_directory_it_may_not_enter(cluster: Cluster) -> None:
    """The job's user enters its cwd, not the agent: a cwd under the data
    directory (0700) is refused instead of opening what lies below it."""
    run = cluster.run_job("sneak", "b", "cat admin.token", cwd=str(cluster.data_dir))
    out = cluster.log(run["id"])
    assert run["state"] == "failed" and run["attempts"][-1]["exit_code"] == 126, run
    assert cluster.admin_token not in out and "can't cd" in out


def test_a_loader_variable_reaches_the_job_only_never_the_switch(cluster: Cluster) -> None:
    """A tenant allowed LD_PRELOAD gets it in its job, not in ``setpriv``
    (root) or the gate: the job's environment is set after the switch. The
    loader complains once for every process started with a missing preload:
    the job's shell and its ``true``, nothing before them."""
    status, _ = cluster.call("PUT", "/v1/tenants/trusted", {"loader_env": True})
    assert status == 200
    missing = "/nonexistent/preload.so"
    run = cluster.run_job("preload", "trusted", "exec true", env={"LD_PRELOAD": missing})
    out = cluster.log(run["id"])
    assert out.count(missing) == 2, out
