"""``/v1/tenants/{t}/webhooks`` and ``/v1/runs/{id}/deliveries`` over HTTP:
roles and tenants as the rest of the API, the secret write-only, the
admin-only allowances, and bad input named by field."""

from __future__ import annotations

from typing import Any

from etcdsched.api.auth import create_token
from etcdsched.model.notify_events import run_deliveries
from etcdsched.model.spec import JobSpec
from etcdsched.model.states import RunState
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Ops
from etcdsched.store.webhooks import WebhookStore
from tests.api.conftest import Api

SECRET = "a-long-enough-secret"
HOOK = "/v1/tenants/acme/webhooks/ops"


def body(**extra: Any) -> dict[str, Any]:
    return {
        "url": "https://hooks.example.com/etcdsched",
        "events": ["run.failed"],
        "secret": SECRET,
        **extra,
    }


async def test_an_editor_manages_its_tenants_webhooks_and_no_answer_shows_the_secret(
    api: Api,
) -> None:
    status, made, _ = await api.call("PUT", HOOK, api.acme, json=body())
    assert status == 200 and made["url"].startswith("https://") and "secret" not in made
    assert made["events"] == ["run.failed"] and not made["allow_http"]
    for path in (HOOK, "/v1/tenants/acme/webhooks"):
        status, text, _ = await api.call("GET", path, api.acme)
        assert status == 200 and SECRET not in str(text)
    viewer = await create_token(
        api.services.store, api.services.keys, tenant="acme", role="viewer", name="v", now_ms=1
    )
    status, listed, _ = await api.call("GET", "/v1/tenants/acme/webhooks", viewer.secret)
    assert status == 200 and [h["name"] for h in listed["items"]] == ["ops"]
    assert listed["items"][0]["url"] == "https://hooks.example.com/..."  # the path may be a key
    assert (await api.call("PUT", HOOK, viewer.secret, json=body()))[0] == 403
    # replacing without a secret keeps the stored one
    status, _, _ = await api.call("PUT", HOOK, api.acme, json=body(secret=None, events=[]))
    stored = await WebhookStore(api.services.store, api.services.keys).get("acme", "ops")
    assert status == 200 and stored.value.secret == SECRET and not stored.value.events
    assert (await api.call("DELETE", HOOK, api.acme))[0] == 204
    assert (await api.call("DELETE", HOOK, api.acme))[0] == 404
    assert (await api.call("GET", HOOK, api.acme))[0] == 404


async def test_another_tenants_webhooks_are_not_found(api: Api) -> None:
    assert (await api.call("PUT", HOOK, api.acme, json=body()))[0] == 200
    for method, path in (("GET", HOOK), ("GET", "/v1/tenants/acme/webhooks"), ("DELETE", HOOK)):
        status, answer, _ = await api.call(method, path, api.globex)
        assert status == 404 and answer["error"]["field"] == "tenant", answer
    status, _, _ = await api.call("PUT", HOOK, api.globex, json=body())
    assert status == 404
    assert (await api.call("GET", HOOK, api.admin))[0] == 200


async def test_bad_webhooks_are_refused_naming_the_field(api: Api) -> None:
    cases = [
        (body(url="http://hooks.example.com/"), 422, "url"),
        (body(url="https://127.0.0.1/x"), 422, "url"),
        (body(url="https://169.254.169.254/latest/meta-data"), 422, "url"),
        (body(url="ftp://x/"), 422, "url"),
        (body(secret="short"), 422, "secret"),
        (body(events=["run.exploded"]), 422, "events"),
        (body(secret=None), 422, "secret"),
        (body(allow_http=True), 403, None),
    ]
    for sent, status, field in cases:
        got, answer, _ = await api.call("PUT", "/v1/tenants/acme/webhooks/new", api.acme, json=sent)
        assert got == status, (sent, answer)
        if field:
            assert answer["error"]["field"].startswith(field), (sent, answer)
    got, answer, _ = await api.call(
        "PUT", "/v1/tenants/acme/webhooks/Bad Name", api.acme, json=body()
    )
    assert (got, answer["error"]["field"]) == (422, "name")


async def test_an_admin_allowance_holds_for_its_url_only(api: Api) -> None:
    local = body(url="http://127.0.0.1:9/hook")
    status, made, _ = await api.call(
        "PUT", HOOK, api.admin, json={**local, "allow_http": True, "allow_private": True}
    )
    assert status == 200 and made["allow_http"] and made["allow_private"]
    status, kept, _ = await api.call("PUT", HOOK, api.acme, json={**local, "events": []})
    assert status == 200 and kept["allow_http"] and kept["allow_private"]
    moved = {**local, "url": "http://127.0.0.1:10/other"}
    status, answer, _ = await api.call("PUT", HOOK, api.acme, json=moved)
    assert (status, answer["error"]["field"]) == (422, "url")


async def test_a_target_refused_even_to_an_admin_is_a_422_never_a_500(api: Api) -> None:
    """A name yarl cannot decode, a number the client would dial without
    resolving, and the metadata address (which allow_private no longer
    opens) are each refused naming the field."""
    allowed = {"allow_http": True, "allow_private": True}
    for url in (
        "https://xn--/",
        "https://127.1/x",
        "https://2130706433/x",
        "https://0177.0.0.1/x",
        "https://127.0.0.1./x",
        "https://169.254.169.254/latest/meta-data",
        "https://[fd00:ec2::254]/latest",
        "https://100.100.100.200/",
    ):
        got, answer, _ = await api.call("PUT", HOOK, api.admin, json={**body(url=url), **allowed})
        assert (got, answer["error"]["field"]) == (422, "url"), (url, answer)
    got, answer, _ = await api.call("PUT", HOOK, api.acme, json=body(url="https://100.64.0.1/"))
    assert (got, answer["error"]["field"]) == (422, "url"), answer


async def test_a_runs_deliveries_are_listed_for_its_tenant_only(api: Api, keys: Keys) -> None:
    spec = {
        "trigger": {"kind": "interval", "every": "1h"},
        "execution": {"argv": ["true"]},
        "notify": [{"webhook": "ops", "events": ["run.failed"]}],
    }
    status, job, _ = await api.call(
        "POST", "/v1/jobs", api.acme, json={"id": "hooked", "spec": spec}
    )
    assert status == 201, job
    run = await api.services.jobs.trigger(job["id"])
    failed = run.model_copy(
        update={
            "state": RunState.FAILED,
            "spec": JobSpec.model_validate({**spec, "tenant": "acme"}),
        }
    )
    (delivery,) = run_deliveries(failed, [])
    key = keys.delivery(run.id, delivery.event_id)
    await api.services.store.txn(
        [], [Ops.put(key, delivery.model_copy(update={"state": "delivered"}))]
    )
    status, listed, _ = await api.call("GET", f"/v1/runs/{run.id}/deliveries", api.acme)
    assert status == 200, listed
    (item,) = listed["items"]
    assert (item["event_id"], item["state"], item["kind"]) == (
        delivery.event_id,
        "delivered",
        "run.failed",
    )
    assert (await api.call("GET", f"/v1/runs/{run.id}/deliveries", api.globex))[0] == 404
    # the dashboard's run page shows it too, in the run's record
    async with api.http.get(
        f"{api.url}/ui/runs/{run.id}", headers={"Cookie": f"etcdsched_ui={api.acme}"}
    ) as page:
        html = await page.text()
    assert page.status == 200
    assert "Webhook deliveries" in html and delivery.event_id in html, html


async def test_the_cli_manages_webhooks_and_shows_a_runs_deliveries(api: Api) -> None:
    from tests.api.test_cli import cli

    made = await cli(
        api, "webhook", "create", "pager", "--tenant", "acme", "--url",
        "https://hooks.example.com/p", "--event", "run.failed", "--secret-file", "-",
        token=api.acme, stdin=SECRET + "\n",
    )  # fmt: skip
    assert made.exit_code == 0 and "acme/pager" in made.output, made.output
    stored = await WebhookStore(api.services.store, api.services.keys).get("acme", "pager")
    assert stored.value.secret == SECRET
    listed = await cli(api, "webhook", "ls", "--tenant", "acme", token=api.acme)
    assert "pager" in listed.output and "run.failed" in listed.output
    assert SECRET not in listed.output
    refused = await cli(
        api, "webhook", "create", "x", "--tenant", "acme", "--url", "http://h.example/",
        "--secret-file", "-", token=api.acme, stdin=SECRET,
    )  # fmt: skip
    assert refused.exit_code == 1 and "field: url" in refused.output
    job = {"trigger": {"kind": "interval", "every": "1h"}, "execution": {"argv": ["true"]}}
    status, made_job, _ = await api.call(  # a job of acme
        "POST", "/v1/jobs", api.acme, json={"id": "clihook", "spec": job}
    )
    assert status == 201, made_job
    run = await api.services.jobs.trigger(made_job["id"])
    shown = await cli(api, "run", "deliveries", run.id, token=api.acme)
    assert shown.exit_code == 0 and "WEBHOOK" in shown.output, shown.output
    gone = await cli(api, "webhook", "delete", "pager", "--tenant", "acme", token=api.acme)
    assert gone.exit_code == 0
