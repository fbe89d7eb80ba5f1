"""A spec snapshot is stored without its defaults and reads back equal;
API-facing dumps keep it whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from etcdsched.model.codec import decode, encode
from etcdsched.model.records import DueEntry, RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.store.runs import RunOrigin, new_run

SPECS: list[dict[str, Any]] = [
    {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}},
    {"trigger": {"kind": "at", "at": "2026-12-03T18:00:00Z"}, "execution": {"argv": ["true"]}},
    {
        "trigger": {"kind": "interval", "every": "90s", "max_runs": 3},
        "execution": {"argv": ["sh", "-c", "echo $X"], "env": {"X": "1"}, "cwd": "/tmp"},
        "timeout": "1m",
        "jitter": "5s",
        "overlap": "skip",
        "labels": {"team": "a"},
        "priority": 7,
    },
    {
        "trigger": {"kind": "cron", "expr": "*/5 * * * *", "tz": "Europe/Paris"},
        "execution": {"kind": "container", "image": "alpine:3", "args": ["echo", "hi"]},
        "retry": {"max_attempts": 4, "initial_delay": "2s", "retry_on": ["lost"]},
        "misfire": {"policy": "run_all", "max_catch_up": 3},
        "starting_deadline": "30s",
        "resources": {"slots": 2, "cpu": 0.5, "memory_mb": 64},
    },
]


def run_of(spec: JobSpec) -> RunRecord:
    return new_run(RunOrigin("job-1", spec, 2), 1_800_000_000_000, 1_799_999_000_000, 64)


@pytest.mark.parametrize("raw", SPECS)
def test_a_stored_snapshot_reads_back_equal(raw: dict[str, Any]) -> None:
    spec = JobSpec.model_validate(raw)
    run = run_of(spec)
    assert decode(encode(run), RunRecord) == run
    entry = DueEntry(
        job_id="job-1", slot_ms=1, job_key_version=1, job_version=2, anchor_ms=0, spec=spec
    )
    assert decode(encode(entry), DueEntry) == entry


def test_the_stored_snapshot_leaves_defaults_out_and_the_api_dump_keeps_them() -> None:
    run = run_of(JobSpec.model_validate(SPECS[1]))
    stored = json.loads(encode(run))["spec"]
    assert stored == {
        "trigger": {"kind": "at", "at": "2026-12-03T18:00:00Z"},
        "execution": {"kind": "command", "argv": ["true"]},
    }
    whole = json.loads(run.model_dump_json())["spec"]
    assert whole["retry"]["max_attempts"] == 1 and whole["trigger"]["kind"] == "at"
    assert len(encode(run)) < 0.6 * len(run.model_dump_json())


def test_the_api_document_shows_a_runs_spec_whole() -> None:
    """The compact stored form is not part of the API: run responses are
    documented with the whole spec, as they are sent."""
    from etcdsched.api.app import ROUTES
    from etcdsched.api.openapi import build_document

    schemas = build_document(ROUTES)["components"]["schemas"]
    for name in ("RunRecord", "RunView", "JobView"):
        assert schemas[name]["properties"]["spec"] == {
            "$ref": "#/components/schemas/JobSpec-Output"
        }, name


def test_a_spec_encoded_again_gives_the_same_bytes_and_a_changed_copy_its_own() -> None:
    spec = JobSpec.model_validate(SPECS[2])
    first = encode(run_of(spec))
    assert encode(run_of(spec)) == first  # the compact form of this spec object, made once
    changed = spec.model_copy(update={"priority": 9})
    stored = json.loads(encode(run_of(changed)))["spec"]
    assert stored["priority"] == 9
    assert json.loads(encode(run_of(spec)))["spec"]["priority"] == 7
