"""Finished runs beyond keep_last leave etcd and are archived beside the logs."""

from __future__ import annotations

import json

from etcdsched.model.spec import JobSpec
from tests.support.eventually import assert_eventually
from tests.support.services import Services


async def test_history_is_trimmed_and_archived(services: Services) -> None:
    services.start_scheduler("s1")
    services.start_worker("w1")
    spec = JobSpec.model_validate(
        {
            "trigger": {"kind": "interval", "every": "1s"},
            "execution": {"argv": ["true"]},
            "retention": {"keep_last": 3},
        }
    )
    job = await services.jobs.create(spec, "short-memory")
    archive = services.logs.root / job.id / "archive.jsonl"

    async def trimmed() -> None:
        assert archive.exists()
        archived = [json.loads(line)["id"] for line in archive.read_text().splitlines()]
        assert len(archived) >= 2
        runs = await services.runs_of(job.id)
        assert len(runs) <= 4, [r.id for r in runs]
        assert not {r.id for r in runs} & set(archived)

    await assert_eventually(trimmed, timeout=30)
