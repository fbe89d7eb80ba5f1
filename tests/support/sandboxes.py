"""Sandboxes for tests that start real jobs in-process.

The suite's jobs write files in pytest's private temporary directories, so
they run as the test's own user; tests/security runs them as other users.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from etcdsched.worker.sandbox import JobEnvironment, RunAs, Sandbox, ScratchDirs


def as_this_user(scratch: Path | None = None, allow: tuple[str, ...] = ()) -> Sandbox:
    """Jobs run as this process's user; ``allow`` adds variables they inherit."""
    root = scratch or Path(tempfile.mkdtemp(prefix="etcdsched-scratch-"))
    environment = JobEnvironment(allow=(*JobEnvironment().allow, *allow))
    return Sandbox(RunAs({"*": str(os.geteuid())}), environment, ScratchDirs(root))
