"""The jobs of a fault-injection run. Every job runs the test job script with
``--beat`` and appends to one ledger file, which the checker trusts.

Kinds: ``quick`` (0.1-0.5 s), ``long`` (3-5 s), ``failing`` (exit 1, two
retries), ``hanging`` (sleeps 30 s against a 1 s timeout) — all recurring
on 1-2 s intervals with mixed misfire and overlap policies — and ``at``
one-offs at future instants. Every job retries (initial delay 0), so an
attempt lost with its worker is rerun and its rerun delay can be measured.
Every job subscribes to webhook events (:data:`WEBHOOK`).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from etcdsched.model.spec import JobSpec
from tests.support.ledgerfile import JOBSCRIPT, job_argv

MIX = ("quick", "long", "quick", "failing", "quick", "hanging", "quick", "long", "failing")
OVERLAPS = {
    "quick": ("allow", "skip", "queue_one", "cancel_previous"),
    "failing": ("allow", "skip", "queue_one", "cancel_previous"),
    "long": ("skip", "queue_one", "cancel_previous"),
    "hanging": ("skip", "queue_one"),
    "at": ("allow",),
}
SLEEP = {
    "quick": (0.1, 0.5),
    "long": (3.0, 5.0),
    "failing": (0.1, 0.3),
    "hanging": (30.0, 30.0),
    "at": (0.2, 2.0),
}
TIMEOUT_S = {"quick": 5, "long": 8, "failing": 5, "hanging": 1, "at": 5}
ATTEMPTS = {"quick": 3, "long": 3, "failing": 3, "hanging": 2, "at": 3}
WEBHOOK = "harness"
"""Every job names the harness's webhook for its skipped slots; the tenant's
webhook itself wants the run outcomes (tests/faults/webhook_check.py)."""


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    kind: str
    spec: JobSpec


class Workload:
    def __init__(
        self, ledger: Path, rng: random.Random, runner: tuple[str, str] | None = None
    ) -> None:
        self.ledger = ledger.resolve()  # agents run elsewhere: the path must be absolute
        self.rng = rng
        self.one_offs = 0
        self.runner = runner or (sys.executable, JOBSCRIPT)

    def recurring(self, count: int) -> list[JobPlan]:
        plans = []
        for i in range(count):
            kind = MIX[i % len(MIX)]
            every = self.rng.choice(["1s", "1500ms", "2s"]) if kind == "quick" else "2s"
            trigger = {"kind": "interval", "every": every}
            overlap = self.rng.choice(OVERLAPS[kind])
            job_id = f"default:{kind}-{i:02d}"  # full ids: the harness calls the job service
            plans.append(JobPlan(job_id, kind, self.spec(kind, trigger, overlap)))
        return plans

    def one_off(self, now_ms: int) -> JobPlan:
        """An ``at`` job 1-8 s in the future."""
        self.one_offs += 1
        at_ms = now_ms + self.rng.randint(1000, 8000)
        at = datetime.fromtimestamp(at_ms / 1000, UTC).isoformat(timespec="milliseconds")
        spec = self.spec("at", {"kind": "at", "at": at}, "allow")
        return JobPlan(f"default:at-{self.one_offs:05d}", "at", spec)

    def argv(self, kind: str) -> list[str]:
        low, high = SLEEP[kind]
        sleep = round(self.rng.uniform(low, high), 2)
        code = 1 if kind == "failing" else 0
        return job_argv(self.ledger, sleep, code, "--beat", runner=self.runner)

    def spec(self, kind: str, trigger: dict[str, Any], overlap: str) -> JobSpec:
        return JobSpec.model_validate(
            {
                "trigger": trigger,
                "execution": {"argv": self.argv(kind)},
                "timeout": f"{TIMEOUT_S[kind]}s",
                "kill_grace": "500ms",
                "overlap": overlap,
                "misfire": {
                    "policy": self.rng.choice(["skip", "run_once", "run_all"]),
                    "grace": self.rng.choice(["500ms", "1s"]),
                    "max_catch_up": 3,
                },
                "retry": {"max_attempts": ATTEMPTS[kind], "initial_delay": "0s", "jitter": 0},
                "notify": [{"webhook": WEBHOOK, "events": ["slot.skipped"]}],
            }
        )

    def updated(self, plan: JobPlan, current: JobSpec) -> JobSpec:
        """The same trigger and policies with a new sleep (argv) and a timeout
        of the kind's default or one second more."""
        data = current.model_dump(mode="json")
        data["execution"] = {"argv": self.argv(plan.kind)}
        data["timeout"] = f"{TIMEOUT_S[plan.kind] + self.rng.choice([0, 1])}s"
        return JobSpec.model_validate(data)
