"""Who a job runs as, in which directory, with which environment.

Jobs are other people's code. A worker started as root runs each job as an
unprivileged user chosen by its tenant (``worker_run_as``: tenant -> user,
``"*"`` for every other tenant, ``nobody`` when unset), in a fresh scratch
directory of its attempt owned by that user (mode 0700), with an
environment built from an allow-list plus the job's own ``env`` and the
``ETCDSCHED_*`` run identity: nothing of the agent's environment, its
working directory or its files reaches the job unless listed. A job of one
tenant then cannot read the agent's files (data directory 0700, logs 0600),
the agent's ``/proc/<pid>/environ`` (another user's), or a job of another
tenant mapped to another user.

A worker that is not root cannot switch users: its jobs run as itself, and
it says so at start (single-user mode: tenants share its privileges).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from etcdsched.config import Config
from etcdsched.model.records import RunRecord
from etcdsched.model.spec import CommandExecution

log = logging.getLogger(__name__)

ANY_TENANT = "*"
DEFAULT_USER = "nobody"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRATCH_MODE = 0o700


@dataclass(frozen=True)
class JobUser:
    """A user a job runs as: a name for ``USER``/``LOGNAME``, the ids to switch to."""

    name: str
    uid: int
    gid: int


def resolve_user(spec: str) -> JobUser:
    """A user name, or a numeric uid (with no passwd entry needed: its group is
    its passwd group if it has one, else the same number)."""
    if spec.isdigit():
        uid = int(spec)
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:
            return JobUser(spec, uid, uid)
        return JobUser(entry.pw_name, uid, entry.pw_gid)
    try:
        entry = pwd.getpwnam(spec)
    except KeyError:
        raise ValueError(f"worker_run_as: no such user {spec!r}") from None
    return JobUser(entry.pw_name, entry.pw_uid, entry.pw_gid)


class RunAs:
    """The tenant -> user map of one worker, resolved once at start so a
    missing user fails the agent, not every job."""

    def __init__(self, mapping: dict[str, str], *, can_switch: bool | None = None) -> None:
        self.can_switch = os.geteuid() == 0 if can_switch is None else can_switch
        wanted = {ANY_TENANT: DEFAULT_USER, **mapping}
        self._users = {tenant: resolve_user(user) for tenant, user in wanted.items()}
        self.setpriv = shutil.which("setpriv", path=DEFAULT_PATH) or ""
        """What switches a job's user (util-linux, on every Debian/Ubuntu/Fedora)."""
        if self.can_switch and not self.setpriv:
            raise ValueError("setpriv (util-linux) is needed to run jobs as other users")

    def describe(self) -> str:
        """One line for the agent's start: whom jobs run as."""
        if not self.can_switch:
            me = pwd.getpwuid(os.geteuid()).pw_name
            return (
                f"this worker is not root: jobs run as {me}, and tenants share this"
                " worker's privileges (single-user mode)"
            )
        users = ", ".join(f"{tenant} -> {user.name}" for tenant, user in self._users.items())
        root = " (WARNING: some tenants' jobs run as root)" if self.runs_root_jobs() else ""
        return f"jobs run as: {users}{root}"

    def runs_root_jobs(self) -> bool:
        return self.can_switch and any(user.uid == 0 for user in self._users.values())

    def user_for(self, tenant: str) -> JobUser | None:
        """Whom a job of ``tenant`` runs as; None when this worker cannot switch."""
        if not self.can_switch:
            return None
        user = self._users.get(tenant, self._users[ANY_TENANT])
        return None if user.uid == os.geteuid() else user  # as the agent: nothing to switch


@dataclass(frozen=True)
class JobEnvironment:
    """The variables a job starts with besides its own ``env``."""

    allow: tuple[str, ...] = ("LANG", "LC_ALL", "TZ")
    """Names copied from the worker's environment when it has them."""
    path: str = DEFAULT_PATH

    def base(self, user: JobUser | None, scratch: Path) -> dict[str, str]:
        env = {"PATH": self.path, "HOME": str(scratch), "TMPDIR": str(scratch)}
        env.update({name: os.environ[name] for name in self.allow if name in os.environ})
        if user is not None:
            env.update(USER=user.name, LOGNAME=user.name)
        return env


def default_scratch_root() -> Path:
    """Under the system's temporary directory, where every user can reach
    it: a data directory inside a home directory (0700) would not be."""
    return Path(tempfile.gettempdir()) / f"etcdsched-scratch-{os.geteuid()}"


class ScratchDirs:
    """Per-attempt working directories under one root (0711, owned by the
    agent): each attempt's own is 0700 and owned by the job's user, and is
    removed when the attempt ends."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or default_scratch_root()).absolute()
        self._root_made = False

    def prepare_root(self) -> None:
        """Create the root, or check that the one there is ours and no link
        (a shared temporary directory is anyone's to pre-create a name in)."""
        self.root.mkdir(parents=True, exist_ok=True)
        info = self.root.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"scratch_dir {self.root} is a link or belongs to another user")
        self.root.chmod(0o711)  # others may enter their own dir, not list the root
        self._root_made = True

    def make(self, run_id: str, attempt: int, user: JobUser | None) -> Path:
        if not self._root_made:
            self.prepare_root()
        path = self.root / f"{run_id.replace('/', '_')}.{attempt}"
        try:
            path.mkdir(mode=SCRATCH_MODE)
        except FileExistsError:  # an earlier incarnation's leftovers
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(mode=SCRATCH_MODE)
        if user is not None:
            os.chown(path, user.uid, user.gid)
        return path

    def remove(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class JobPlace:
    """Where and as whom one attempt's process starts."""

    user: JobUser | None
    """None: as the agent's own user (a worker that is not root)."""
    cwd: Path
    env: dict[str, str]
    """The base environment (the job's ``env`` and identity go on top)."""
    scratch: Path
    """Removed when the attempt ends."""


class Sandbox:
    """The containment every attempt of one worker gets; see the module doc."""

    def __init__(self, run_as: RunAs, environment: JobEnvironment, scratch: ScratchDirs) -> None:
        self.run_as = run_as
        self.environment = environment
        self.scratch = scratch

    @classmethod
    def from_config(cls, config: Config) -> Sandbox:
        environment = JobEnvironment(tuple(config.job_env_allow), config.job_path)
        return cls(RunAs(config.worker_run_as), environment, ScratchDirs(config.scratch_dir))

    def place(self, run: RunRecord, attempt: int) -> JobPlace:
        user = self.run_as.user_for(run.tenant)
        scratch = self.scratch.make(run.id, attempt, user)
        execution = run.spec.execution
        own_cwd = execution.cwd if isinstance(execution, CommandExecution) else None
        cwd = Path(own_cwd) if own_cwd else scratch
        return JobPlace(user, cwd, self.environment.base(user, scratch), scratch)
