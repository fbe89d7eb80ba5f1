"""One-off times (issue 29): an ``at`` or ``end_at`` already past is a 422
naming the field and writes nothing, unless the job says ``if_past:
run_now``; an ``at`` within the misfire grace still counts (a client clock
a little ahead meant "now")."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from tests.api.conftest import Api, spec


def _iso(seconds_from_now: float) -> str:
    return datetime.fromtimestamp(time.time() + seconds_from_now, tz=UTC).isoformat()


async def _create(api: Api, trigger: dict[str, object]) -> tuple[int, dict[str, object]]:
    status, body, _ = await api.call(
        "POST", "/v1/jobs", api.admin, json={"spec": spec(trigger=trigger)}
    )
    return status, body


async def _has_a_slot(api: Api, job_id: str) -> None:
    status, job, _ = await api.call("GET", f"/v1/jobs/{job_id}", api.admin)
    assert status == 200 and job["next_slot_ms"] is not None, job


async def test_an_at_in_the_past_is_a_422_naming_it_and_nothing_is_written(api: Api) -> None:
    status, body = await _create(api, {"kind": "at", "at": _iso(-3600)})
    assert status == 422, body
    error = body["error"]
    assert isinstance(error, dict) and error["field"] == "spec.trigger.at"
    assert "in the past" in str(error["message"]) and "run_now" in str(error["message"])
    status, listing, _ = await api.call("GET", "/v1/jobs", api.admin)
    assert status == 200 and listing["items"] == []


async def test_an_end_at_in_the_past_is_a_422_naming_it(api: Api) -> None:
    trigger = {"kind": "interval", "every": "10s", "end_at": _iso(-60)}
    status, body = await _create(api, trigger)
    assert status == 422, body
    assert body["error"]["field"] == "spec.trigger.end_at"  # type: ignore[index]


async def test_if_past_run_now_runs_it_at_once(api: Api) -> None:
    status, body = await _create(api, {"kind": "at", "at": _iso(-3600), "if_past": "run_now"})
    assert status == 201, body
    job = body
    stored_at = datetime.fromisoformat(str(job["spec"]["trigger"]["at"]))  # type: ignore[index]
    assert abs(stored_at.timestamp() - time.time()) < 5
    await _has_a_slot(api, str(job["id"]))


async def test_an_at_a_moment_ago_is_still_now(api: Api) -> None:
    status, body = await _create(api, {"kind": "at", "at": _iso(-2)})
    assert status == 201, body
    await _has_a_slot(api, str(body["id"]))


async def test_replacing_a_trigger_with_an_at_in_the_past_is_a_422(api: Api) -> None:
    status, body = await _create(api, {"kind": "at", "at": _iso(3600)})
    assert status == 201, body
    job_id = str(body["id"])
    past = spec(trigger={"kind": "at", "at": _iso(-3600)})
    path = f"/v1/jobs/{job_id}?force=true"
    status, reply, _ = await api.call("PUT", path, api.admin, json={"spec": past})
    assert status == 422 and reply["error"]["field"] == "spec.trigger.at", reply
    await _has_a_slot(api, job_id)  # unchanged
