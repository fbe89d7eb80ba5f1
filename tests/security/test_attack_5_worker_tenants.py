"""Workers serve the tenants they declare: a selector cannot put a run on
another tenant's dedicated workers (issue 27, attack 5), and an admin
limits which worker labels a tenant's selectors may ask for."""

from __future__ import annotations

from etcdsched.model.records import RunRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from tests.api.conftest import Api
from tests.support.e2e_jobs import wait_runs
from tests.support.services import Services

DEDICATED = {"pool": "tenant-a"}


def ended(runs: list[RunRecord]) -> bool:
    return bool(runs) and runs[0].state.terminal


def job(tenant: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "tenant": tenant,
            "trigger": {"kind": "now"},
            "execution": {"argv": ["true"]},
            "selector": DEDICATED,
        }
    )


async def test_a_selector_cannot_reach_another_tenants_workers(services: Services) -> None:
    services.start_scheduler("s1")
    services.start_worker("a-only", worker_labels=DEDICATED, worker_tenants=["a"])
    intruder = await services.jobs.create(job("b"), "b-job")
    owner = await services.jobs.create(job("a"), "a-job")

    [ran] = await wait_runs(services, owner.id, ended)
    assert ran.state is RunState.SUCCEEDED and ran.attempts[0].worker == "a-only"

    [waiting] = await wait_runs(
        services, intruder.id, lambda runs: bool(runs) and "serves tenant b" in runs[0].reason
    )
    assert waiting.state is RunState.PENDING and not waiting.attempts

    services.start_worker("shared", worker_labels=DEDICATED, worker_tenants=["*"])
    [ran] = await wait_runs(services, intruder.id, ended)
    assert ran.state is RunState.SUCCEEDED and ran.attempts[0].worker == "shared"


async def test_an_admin_limits_the_selectors_a_tenant_may_use(api: Api) -> None:
    async with api.client(api.admin) as admin:
        await admin.set_tenant("acme", {"selectors": {"pool": ["acme", "shared"]}})
    cases = [({"pool": "shared"}, 201), ({"pool": "globex"}, 422), ({"gpu": "a100"}, 422)]
    for selector, status in [*cases, ({}, 201)]:
        spec = {"trigger": {"kind": "now"}, "execution": {"argv": ["true"]}, "selector": selector}
        got, answer, _ = await api.call("POST", "/v1/jobs", api.acme, json={"spec": spec})
        assert got == status, (selector, answer)
        if status == 422:
            assert answer["error"]["field"] == "spec.selector"
