"""Reading the job-written ledger file (see jobscript.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

JOBSCRIPT = str(Path(__file__).with_name("jobscript.py"))


def job_argv(
    ledger: Path,
    sleep: float = 0.0,
    exit_code: int = 0,
    *extra: str,
    runner: tuple[str, str] = (sys.executable, JOBSCRIPT),
) -> list[str]:
    """``runner``: the interpreter and script (jobs of another user need
    ones that user can reach)."""
    return [
        *runner,
        str(ledger),
        "--sleep",
        str(sleep),
        "--exit",
        str(exit_code),
        *extra,
    ]


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_ledger_tolerant(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Like :func:`read_ledger`, but a torn or garbled line (a writer killed
    mid-write) is counted and skipped instead of failing the whole read."""
    if not path.exists():
        return [], 0
    lines: list[dict[str, Any]] = []
    bad = 0
    for raw in path.read_text(errors="replace").splitlines():
        if not raw.strip():
            continue
        try:
            lines.append(json.loads(raw))
        except ValueError:
            bad += 1
    return lines, bad


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
