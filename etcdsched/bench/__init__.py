"""``etcdsched bench``: the benchmark command (docs/design.md, "The packages":
speed is measured by a command, never by a timed unit test).

It starts its own single-member etcd and the agents as real processes, runs
the selected scenarios, writes ``bench-results/<timestamp>.json`` and renders
``docs/benchmarks.md`` with PNG figures. Importing this package is cheap: the
scenario code (and matplotlib) is loaded only when the command runs.

Scenarios (``--scenario``, repeatable, default all): ``raw``, ``throughput``,
``idle-lag``, ``burst``, ``midnight``, ``scan``, ``memory``, ``failover``, ``soak``.
"""

from __future__ import annotations

SCENARIOS = ("raw", "throughput", "idle-lag", "burst", "midnight", "scan", "memory", "failover",
             "soak")  # fmt: skip
