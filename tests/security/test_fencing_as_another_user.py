"""The user switch does not weaken fencing: a worker frozen past its lease
has its jobs killed by the watchdog (which runs as the agent, root) even
though they run as another user."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.security.conftest import running_up
from tests.support.eventually import wait_until
from tests.support.procs import alive

pytestmark = pytest.mark.slow


def test_a_frozen_workers_job_running_as_another_user_is_killed() -> None:
    with running_up() as cluster:
        run_id = cluster.start_job("frozen", "a", "echo $$; exec sleep 300")
        pid = int(wait_until(lambda: cluster.log(run_id).split()[0], timeout=10))
        assert os.stat(f"/proc/{pid}").st_uid != 0  # another user's process
        up = cluster.tour.procs[0]
        os.kill(up.pid, signal.SIGSTOP)  # the agent only: its watchdog runs on
        frozen_at = time.monotonic()
        try:
            wait_until(lambda: not alive(pid), timeout=15)
            killed_after = time.monotonic() - frozen_at
        finally:
            os.kill(up.pid, signal.SIGCONT)
        assert killed_after < 2 * 2 + 1  # within the lease (TTL 2 s), with slack
