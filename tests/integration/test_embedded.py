"""Real etcd processes: start, health, pause, crash, fail-over and rejoin."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest

from etcdsched.store.embedded import (
    SERVER_ENV,
    SYSTEM_ETCD,
    SYSTEM_MINIMUM,
    EtcdMember,
    EtcdStartError,
    EtcdTuning,
    etcd_binary,
    etcd_server,
    reserve_ports,
    server_version,
    wheel_binary,
)
from etcdsched.store.etcd_cluster import EtcdCluster
from tests.support.eventually import wait_until

FAST = EtcdTuning(unsafe_no_fsync=True)


def test_client_tools_come_from_the_wheel() -> None:
    for name in ("etcdctl", "etcdutl"):
        path = etcd_binary(name)
        assert path.parent.name == "etcdbin"
        assert os.access(path, os.X_OK)


def test_the_server_is_debians_when_installed_else_the_wheels(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/adr/0023-etcd-server.md: Debian's etcd-server 3.4.23+ first."""
    monkeypatch.delenv(SERVER_ENV, raising=False)
    server = etcd_server()
    if SYSTEM_ETCD.is_file() and server_version(SYSTEM_ETCD) >= SYSTEM_MINIMUM:
        assert server == SYSTEM_ETCD
    else:
        assert server == wheel_binary("etcd")
    assert os.access(server, os.X_OK)
    named = tmp_path / "my-etcd"
    monkeypatch.setenv(SERVER_ENV, str(named))
    assert etcd_server() == named, "the environment names the server to run"


def test_session_etcd_answers_health(etcd_endpoints: list[str]) -> None:
    with urllib.request.urlopen(f"http://{etcd_endpoints[0]}/health", timeout=2) as response:
        assert json.load(response)["health"] == "true"


def test_single_member_serves_pauses_and_resumes(tmp_path: Path) -> None:
    with EtcdCluster(tmp_path, size=1, tuning=FAST) as cluster:
        member = cluster.member(0)
        assert member.healthy()
        assert cluster.leader_index() == 0
        assert member.status()["version"] == ".".join(map(str, server_version(etcd_server())))
        etcdctl = [str(etcd_binary("etcdctl")), "--endpoints", member.endpoint]
        subprocess.run([*etcdctl, "put", "/k", "v"], check=True, capture_output=True)
        got = subprocess.run([*etcdctl, "get", "/k", "--print-value-only"], check=True,
                             capture_output=True, text=True)  # fmt: skip
        assert got.stdout.strip() == "v"

        member.pause()
        assert member.alive and not member.healthy(timeout=0.2)
        member.resume()
        wait_until(member.healthy, timeout=5)
    assert not member.alive


def test_member_that_cannot_bind_reports_its_log(tmp_path: Path) -> None:
    client_port, peer_port = reserve_ports(2)
    with socket.create_server(("127.0.0.1", client_port)):
        member = EtcdMember("busy", tmp_path / "busy.etcd", client_port, peer_port, tuning=FAST)
        member.start()
        with pytest.raises(EtcdStartError, match="address already in use"):
            member.wait_ready(timeout=10)
    assert not member.alive


def test_cluster_survives_leader_crash(healthy_cluster3: EtcdCluster) -> None:
    cluster = healthy_cluster3
    old = cluster.wait_for_leader()
    cluster.member(old).kill()
    assert not cluster.member(old).alive

    new = cluster.wait_for_leader(timeout=10, other_than=old)
    survivors = [m for i, m in enumerate(cluster) if i != old]
    for member in survivors:
        wait_until(member.healthy, timeout=10, message=f"{member.name} healthy")

    cluster.member(old).restart()
    cluster.wait_healthy(timeout=10)
    assert cluster.leader_index() in {new, *range(len(cluster.members))}
    assert all(m.alive and m.healthy() for m in cluster)


def test_replaced_member_rejoins_empty_and_catches_up(healthy_cluster3: EtcdCluster) -> None:
    """The way the fault harness restarts a killed member (etcd 3.5.1 can
    restart a member killed under load with writes missing)."""
    cluster = healthy_cluster3
    leader = cluster.wait_for_leader()
    victim = (leader + 1) % len(cluster.members)
    cluster.member(victim).kill()

    cluster.replace_member(victim, timeout=20)

    member = cluster.member(victim)
    assert member.alive and member.healthy()
    assert len(list((member.data_dir / "member").iterdir())) > 0, "it has data again"

    def same_revision() -> bool:
        revisions = {m.status()["header"]["revision"] for m in cluster}
        return len(revisions) == 1

    wait_until(same_revision, timeout=10, message="every member at the same revision")


def test_periodic_compaction_flags_reach_etcd(tmp_path: Path) -> None:
    """``compact_every`` (what ``etcdsched up`` and the benchmark use, ADR
    0015) makes etcd 3.5.1 compact its history on its own: an old revision
    soon reads as compacted."""
    tuning = EtcdTuning(unsafe_no_fsync=True, compact_every="1s")
    assert "--auto-compaction-mode periodic --auto-compaction-retention 1s" in " ".join(
        tuning.flags()
    )
    with EtcdCluster(tmp_path, size=1, tuning=tuning) as cluster:
        etcdctl = [str(etcd_binary("etcdctl")), "--endpoints", cluster.member(0).endpoint]
        for value in ("1", "2"):
            subprocess.run([*etcdctl, "put", "/k", value], check=True, capture_output=True)

        def first_revision_compacted() -> bool:
            subprocess.run([*etcdctl, "put", "/k", "3"], check=True, capture_output=True)
            old = subprocess.run([*etcdctl, "get", "/k", "--rev", "2"], capture_output=True,
                                 text=True)  # fmt: skip
            return "compacted" in old.stderr

        wait_until(first_revision_compacted, timeout=15)
