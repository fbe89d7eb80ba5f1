"""How a benchmark run names its machine, its version and its figures: shared
by the page (:mod:`etcdsched.bench.report`) and the plots
(:mod:`etcdsched.bench.plots`), which the page draws only when matplotlib is
installed."""

from __future__ import annotations

from typing import Any

Figures = dict[str, list[tuple[str, str]]]
"""Scenario name -> its figures as (caption, file name) pairs."""


def version_line(ver: dict[str, str]) -> str:
    """etcdsched's version, and the commit when the run recorded one."""
    version, commit = ver.get("etcdsched", "?"), ver.get("commit")
    return f"{version} (commit {commit})" if commit else version


def machine_line(meta: dict[str, Any]) -> str:
    machine = meta.get("machine", {})
    return (
        f"{machine.get('cpus', '?')} CPUs ({machine.get('cpu_model', '?')}), "
        f"{machine.get('memory_gib', '?')} GiB, Linux {machine.get('kernel', '?')}"
    )
