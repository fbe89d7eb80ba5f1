"""Attacks through job identity (issue 27, attacks 7-9): two tenants may
both have a job ``x`` and nothing of one touches the other; ``depends_on``
and creates leak nothing of another tenant; cursors carry only the
caller's own keys. ``acme`` is the victim, ``globex`` the attacker."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from etcdsched.model.errors import InvalidInput, NotFound
from etcdsched.model.states import RunState
from tests.api.conftest import Api


def hourly(**extra: Any) -> dict[str, Any]:
    every_hour = {"kind": "interval", "every": "1h"}
    return {"trigger": every_hour, "execution": {"argv": ["true"]}, **extra}


async def test_attack_7_a_recreated_name_touches_nothing_of_the_old_tenant(api: Api) -> None:
    async with api.client(api.acme) as victim, api.client(api.globex) as attacker:
        await victim.create_job(hourly(), job_id="x")
        running = await victim.trigger_job("x")
        await victim.delete_job("x", cancel_active=False)  # its run goes on

        mine = await attacker.create_job(hourly(overlap="cancel_previous"), job_id="x")
        assert mine.id == "globex:x" and running.id.startswith("acme:x@")
        await attacker.trigger_job("x", force=True)
        assert (await victim.get_run(running.id)).state is RunState.PENDING  # not cancelled
        with pytest.raises(NotFound):
            await attacker.get_run(running.id)
        with pytest.raises(NotFound):
            await attacker.list_skips("acme:x")
        deleted = await attacker.delete_job("x")
        assert all(rid.startswith("globex:x@") for rid in deleted.active_runs)
        assert (await victim.get_run(running.id)).state is RunState.PENDING


async def test_attack_8_depends_on_and_creates_leak_nothing(api: Api) -> None:
    async with api.client(api.acme) as victim, api.client(api.globex) as attacker:
        await victim.create_job(hourly(), job_id="secret-etl")
        # the same name is free for another tenant: no 409 says it exists
        assert (await attacker.create_job(hourly(), job_id="secret-etl")).id == "globex:secret-etl"
        for upstream in ("acme:secret-etl", "missing-job"):
            with pytest.raises(InvalidInput) as refused:
                await attacker.create_job(hourly(depends_on=[upstream]))
            assert refused.value.field == "spec.depends_on[0]"
        # and another tenant's job reads exactly like a missing one
        with pytest.raises(NotFound) as foreign:
            await attacker.get_job("acme:secret-etl")
        with pytest.raises(NotFound) as missing:
            await attacker.get_job("acme:no-such-job")
        assert foreign.value.code == missing.value.code


async def test_depends_on_cycles_are_refused(api: Api) -> None:
    async with api.client(api.acme) as client:
        await client.create_job(hourly(), job_id="a")
        await client.create_job(hourly(depends_on=["a"]), job_id="b")
        await client.create_job(hourly(depends_on=["b"]), job_id="c")
        with pytest.raises(InvalidInput) as cycle:
            await client.replace_job("a", hourly(depends_on=["c"]))
        assert "cycle" in cycle.value.message
        with pytest.raises(InvalidInput):
            await client.replace_job("a", hourly(depends_on=["a"]))
        job = await client.get_job("c")
        assert job.spec.depends_on == ["acme:b"]  # stored as full ids


async def test_attack_9_cursors_carry_only_the_callers_keys(api: Api) -> None:
    async with api.client(api.admin) as admin:
        for name in ("a1", "a2", "a3"):
            await admin.create_job(hourly(tenant="acme"), job_id=name)
            await admin.create_job(hourly(tenant="globex"), job_id=name)
    async with api.client(api.acme) as client:
        cursor, seen = None, []
        while True:
            page = await client.list_jobs(cursor=cursor, limit=1)
            seen += [job.id for job in page.items]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
            decoded = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
            assert "globex" not in decoded and "globex" not in cursor
    assert seen == ["acme:a1", "acme:a2", "acme:a3"]
    status, body, _ = await api.call("GET", "/v1/jobs?cursor=%%%", api.acme)
    assert status == 422 and body["error"]["field"] == "cursor"
