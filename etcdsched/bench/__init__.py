"""``etcdsched bench``: the benchmark command (docs/design.md, "The packages":
speed is measured by a command, never by a timed unit test).

It starts its own single-member etcd and the agents as real processes, runs
the selected scenarios, writes ``bench-results/<timestamp>.json`` and renders
``docs/benchmarks.md`` with PNG figures. Importing this package is cheap: the
scenario code (and matplotlib) is loaded only when the command runs.

Scenarios (``--scenario``, repeatable, default all): ``raw``, ``throughput``,
``idle-lag``, ``burst``, ``midnight``, ``scan``, ``memory``, ``failover``, ``soak``,
``batch`` (job creation through ``POST /v1/jobs:batch``) and ``ui`` (the
dashboard pages' render time); the last two add a few minutes to a full run.
"""

from __future__ import annotations

SCENARIOS = ("raw", "throughput", "idle-lag", "burst", "midnight", "scan", "memory", "failover",
             "soak", "batch", "ui")  # fmt: skip
