"""The pure webhook logic (etcdsched.model.notify*) and the outbox ops an
ending transaction gets (etcdsched.store.outbox): which outcomes make which
events, stable ids, signatures, the retry schedule, and the cost rule (a
run nobody subscribed to gets no extra op)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from etcdsched.model.notify_events import (
    after_attempt,
    event_id,
    is_recovery,
    retry_delay_ms,
    run_deliveries,
    signature,
    skip_deliveries,
    verify_signature,
)
from etcdsched.model.notify_records import Delivery, Webhook
from etcdsched.model.notify_safety import (
    address_refusal,
    literal_address,
    target_refusal,
    url_refusal,
)
from etcdsched.model.records import RunRecord, SkipRecord
from etcdsched.model.spec import JobSpec
from etcdsched.model.statemachine import assign_attempt, finish_attempt, start_attempt
from etcdsched.model.states import RunState
from etcdsched.store.keys import Keys
from etcdsched.store.outbox import Outbox
from etcdsched.store.runs import RunOps, RunOrigin, new_run

T0 = 1_700_000_000_000
KEYS = Keys("/t/")


def job_spec(**extra: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"trigger": {"kind": "now"}, "execution": {"argv": ["x"]}, "tenant": "acme", **extra}
    )


def ended(outcome: str, *, attempts: int = 1, max_attempts: int = 1, **extra: Any) -> RunRecord:
    spec = job_spec(retry={"max_attempts": max_attempts}, **extra)
    run = new_run(RunOrigin("acme:nightly", spec, 1), T0, T0, 8)
    for n in range(attempts):
        run = start_attempt(assign_attempt(run, "w1", T0 + n), T0 + n, pid=1)
        run = finish_attempt(run, outcome, T0 + n + 10, exit_code=1)
        if run.state is RunState.RETRY_WAIT:
            run = run.model_copy(update={"state": RunState.PENDING})
    return run


def hook(name: str = "ops", events: tuple[str, ...] = ()) -> Webhook:
    return Webhook.model_validate(
        {
            "tenant": "acme",
            "name": name,
            "url": "https://h.example/x",
            "events": events,
            "secret": "k",
            "created_ms": T0,
            "updated_ms": T0,
        }
    )


NOTIFY = [{"webhook": "ops", "events": ["run.failed"]}]


def test_a_final_failure_is_one_event_and_a_retried_attempt_none() -> None:
    retried = ended("failed", attempts=1, max_attempts=2, notify=NOTIFY)
    assert retried.state is RunState.PENDING  # (retry_wait, as the test's loop left it)
    assert run_deliveries(retried, []) == []
    final = ended("failed", attempts=2, max_attempts=2, notify=NOTIFY)
    (delivery,) = run_deliveries(final, [])
    assert (delivery.kind, delivery.attempt, delivery.webhook) == ("run.failed", 2, "ops")
    assert delivery.body["run"]["attempt"] == 2 and delivery.body["id"] == delivery.event_id
    assert delivery.event_id == event_id(final.id, 2, "run.failed", "ops")


@pytest.mark.parametrize(
    ("outcome", "kind"),
    [
        ("succeeded", "run.succeeded"),
        ("failed", "run.failed"),
        ("timed_out", "run.timed_out"),
        ("lost", "run.lost"),
        ("interrupted", "run.lost"),
        ("cancelled", None),
    ],
)
def test_each_final_outcome_maps_to_its_event(outcome: str, kind: str | None) -> None:
    every = ["run.succeeded", "run.failed", "run.timed_out", "run.lost"]
    run = ended(outcome, notify=[{"webhook": "ops", "events": every}])
    assert [d.kind for d in run_deliveries(run, [])] == ([kind] if kind else [])


def test_a_success_owes_a_recovered_candidate_only_to_who_wants_it() -> None:
    run = ended("succeeded", notify=[{"webhook": "ops", "events": ["run.recovered"]}])
    assert [d.kind for d in run_deliveries(run, [])] == ["run.recovered"]
    failed = ended("failed", notify=[{"webhook": "ops", "events": ["run.recovered"]}])
    assert run_deliveries(failed, []) == []
    assert is_recovery(failed) and not is_recovery(run) and not is_recovery(None)


def test_tenant_webhooks_add_to_the_jobs_rules_and_one_webhook_gets_an_event_once() -> None:
    run = ended("failed", notify=NOTIFY)
    hooks = [hook("ops", ("run.failed",)), hook("pager", ("run.failed",)), hook("quiet")]
    assert sorted(d.webhook for d in run_deliveries(run, hooks)) == ["ops", "pager"]
    bare = ended("failed")
    assert [d.webhook for d in run_deliveries(bare, hooks)] == ["ops", "pager"]
    assert run_deliveries(bare, [hook("quiet")]) == []


def test_event_ids_are_stable_and_differ_by_every_part() -> None:
    base = event_id("acme:j@00000000000001", 1, "run.failed", "ops")
    assert base == event_id("acme:j@00000000000001", 1, "run.failed", "ops")
    others = {
        event_id("acme:j@00000000000002", 1, "run.failed", "ops"),
        event_id("acme:j@00000000000001", 2, "run.failed", "ops"),
        event_id("acme:j@00000000000001", 1, "run.lost", "ops"),
        event_id("acme:j@00000000000001", 1, "run.failed", "pager"),
    }
    assert base not in others and len(others) == 4 and len(base) == 32


def test_a_skip_record_is_a_slot_skipped_event_with_its_reason() -> None:
    skip = SkipRecord(
        job_id="acme:nightly",
        first_slot_ms=T0,
        last_slot_ms=T0 + 2000,
        count=3,
        reason="misfire",
        created_ms=T0 + 5,
    )
    rules = job_spec(notify=[{"webhook": "ops", "events": ["slot.skipped"]}]).notify
    (delivery,) = skip_deliveries(skip, "acme", rules, [])
    assert delivery.run_id == f"acme:nightly@{T0:014d}"
    assert delivery.body["skip"]["count"] == 3 and delivery.body["run"]["reason"] == "misfire"
    assert skip_deliveries(skip, "acme", job_spec(notify=NOTIFY).notify, []) == []


def test_the_signature_verifies_with_the_secret_only_and_only_while_fresh() -> None:
    body = b'{"id":"x"}'
    header = signature("k", body, 1000)
    assert header.startswith("t=1000,v1=")
    assert verify_signature("k", body, header, 1100)
    assert not verify_signature("other", body, header, 1100)
    assert not verify_signature("k", body + b" ", header, 1100)
    assert not verify_signature("k", body, header, 1000 + 301)
    assert not verify_signature("k", body, "v1=abc", 1000)


def test_retries_back_off_then_give_up_after_the_configured_time() -> None:
    assert [retry_delay_ms(n, 100, 1000) for n in (1, 2, 3, 4, 5)] == [100, 200, 400, 800, 1000]
    (d,) = run_deliveries(ended("failed", notify=NOTIFY), [])
    limits = {"initial_ms": 100, "max_delay_ms": 1000, "give_up_after_ms": 500}
    once = after_attempt(d, d.created_ms + 1, status=500, error="HTTP 500", **limits)
    assert (once.state, once.attempts, once.next_attempt_ms) == ("pending", 1, d.created_ms + 101)
    late = after_attempt(once, d.created_ms + 450, status=None, error="timed out", **limits)
    assert late.state == "failed" and late.last_error == "timed out" and late.ended_ms
    ok = after_attempt(once, d.created_ms + 120, status=204, error="", **limits)
    assert (ok.state, ok.attempts, ok.last_status) == ("delivered", 2, 204)


def test_a_run_nobody_subscribed_to_costs_its_ending_no_extra_op() -> None:
    hooks = {"acme": [hook("quiet")]}
    runs = RunOps(KEYS, Outbox(KEYS, lambda tenant: hooks.get(tenant, [])))
    plain = ended("failed", notify=[{"webhook": "ops", "events": ["run.succeeded"]}])
    assert len(runs.settle(plain)) == len(RunOps(KEYS).settle(ended("failed")))
    subscribed = ended("failed", notify=NOTIFY)
    extra = runs.settle(subscribed)[len(runs.settle(plain)) :]
    (put,) = extra
    assert put.kind == "put" and put.key.startswith(KEYS.outbox_prefix(subscribed.partition))
    pp, subject, eid = KEYS.parse_outbox(put.key)
    assert (pp, subject) == (subscribed.partition, subscribed.id) and len(eid) == 32


def test_notify_rules_are_validated_at_the_edge() -> None:
    with pytest.raises(ValidationError):
        job_spec(notify=[{"webhook": "ops", "events": ["run.exploded"]}])
    with pytest.raises(ValidationError):
        job_spec(notify=[{"webhook": "ops", "events": []}])
    with pytest.raises(ValidationError):
        job_spec(notify=[{"webhook": "Bad Name", "events": ["run.failed"]}])
    with pytest.raises(ValidationError):
        job_spec(notify=[{"webhook": "ops", "events": ["run.failed"], "url": "https://x"}])


@pytest.mark.parametrize(
    ("url", "allow_http", "refused"),
    [
        ("https://hooks.example.com/x", False, False),
        ("http://hooks.example.com/x", False, True),
        ("http://hooks.example.com/x", True, False),
        ("ftp://hooks.example.com/x", True, True),
        ("https://user:pw@hooks.example.com/x", False, True),
        ("https:///nohost", False, True),
        ("https://h.example:99999/", False, True),
    ],
)
def test_urls(url: str, allow_http: bool, refused: bool) -> None:
    assert (url_refusal(url, allow_http=allow_http) is not None) is refused


@pytest.mark.parametrize(
    ("address", "refused", "even_allowed"),
    [
        ("93.184.216.34", False, False),
        ("2606:2800:220:1:248:1893:25c8:1946", False, False),
        ("127.0.0.1", True, False),
        ("10.1.2.3", True, False),
        ("192.168.0.1", True, False),
        ("::1", True, False),
        ("::ffff:127.0.0.1", True, False),
        ("0.0.0.0", True, False),
        ("224.0.0.1", True, False),
        ("100.64.0.1", True, False),  # shared (CGNAT) space
        ("192.0.0.1", True, False),
        ("192.88.99.1", True, False),  # 6to4 relay anycast
        ("fec0::1", True, False),  # site-local
        ("2002:7f00:1::1", True, False),  # 6to4 of 127.0.0.1
        ("2002:808:808::1", False, False),  # 6to4 of 8.8.8.8
        ("64:ff9b::7f00:1", True, False),  # NAT64 of 127.0.0.1
        ("169.254.169.254", True, True),
        ("169.254.1.1", True, True),
        ("fe80::1", True, True),
        ("fd00:ec2::254", True, True),
        ("100.100.100.200", True, True),  # Alibaba Cloud metadata
        ("::ffff:169.254.169.254", True, True),
        ("2002:a9fe:a9fe::1", True, True),  # 6to4 of the metadata address
        ("64:ff9b::a9fe:a9fe", True, True),  # NAT64 of it
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True, False),  # Teredo
    ],
)
def test_addresses(address: str, refused: bool, even_allowed: bool) -> None:
    assert (address_refusal(address, allow_private=False) is not None) is refused
    assert (address_refusal(address, allow_private=True) is not None) is even_allowed


@pytest.mark.parametrize(
    "url",
    [
        "https://127.1/",
        "https://2130706433/",
        "https://0177.0.0.1/",
        "https://127.0.0.1./",
        "https://0x7f.1/",
        "https://hooks.example.123/",
        "https://xn--/",
    ],
)
def test_hosts_an_http_client_or_resolver_reads_as_other_addresses_are_refused(url: str) -> None:
    why = target_refusal(url, allow_http=True, allow_private=True)
    assert why is not None and (why.startswith("not a URL") or "standard form" in why), why
    assert url_refusal(url, allow_http=True) is not None


def test_ordinary_hosts_and_literals_pass() -> None:
    for url in ("https://hooks.example.com/x", "https://1.example/", "https://[2606:4700::1]/"):
        assert target_refusal(url, allow_http=False, allow_private=False) is None, url
    assert target_refusal("http://127.0.0.1:9/", allow_http=True, allow_private=True) is None


@pytest.mark.parametrize(
    "header",
    ["", "t=1", "v1=ab", "t=1,v1", "t=x,v1=ab", "t=1,v1=\u00e9", "t=\u00e9,v1=ab", "garbage"],
)
def test_a_malformed_signature_header_fails_verification_without_raising(header: str) -> None:
    body, now = b"{}", 1_700_000_000
    assert verify_signature("k", body, header, now) is False
    good = signature("k", body, now)
    assert verify_signature("k", body, good, now) and verify_signature(
        "k", body, good + ",x=1", now
    )


def test_literal_hosts() -> None:
    assert literal_address("[::1]") == "::1" and literal_address("127.0.0.1") == "127.0.0.1"
    assert literal_address("hooks.example.com") is None


def test_a_delivery_round_trips_through_its_record() -> None:
    (d,) = run_deliveries(ended("failed", notify=NOTIFY), [])
    assert Delivery.model_validate_json(d.model_dump_json()) == d


def test_the_verification_example_in_the_docs_accepts_what_the_sender_signs() -> None:
    import re
    import time
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "webhooks.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(example.strip().splitlines()) <= 10
    scope: dict[str, Any] = {}
    exec(example, scope)  # (our own documentation)
    body, now = b'{"id":"e"}', int(time.time())
    assert scope["verify"]("k", body, signature("k", body, now))
    assert not scope["verify"]("k", body + b"x", signature("k", body, now))
    assert not scope["verify"]("k", body, signature("k", body, now - 600))
    for malformed in ("", "t=1", "v1=ab", "t=1,v1", f"t={now},v1=\u00e9", "t=x,v1=ab"):
        assert scope["verify"]("k", body, malformed) is False, malformed


def test_a_failure_of_a_job_that_pauses_owes_a_pause_check_subscribed_or_not() -> None:
    from etcdsched.model.notify_events import PAUSE_CHECK, failure_streak, paused_deliveries

    run = ended("failed", pause_after_failures=3)
    (check,) = run_deliveries(run, [])
    assert (check.kind, check.webhook, check.body) == (
        "job.paused",
        PAUSE_CHECK,
        {"pause_after_failures": 3},
    )
    assert run_deliveries(ended("succeeded", pause_after_failures=3), []) == []
    assert RunOps(KEYS).settle(ended("failed"))[-1].kind == "delete"  # no setting: no check
    rules = job_spec(notify=[{"webhook": "ops", "events": ["job.paused"]}]).notify
    (event,) = paused_deliveries(check, rules, [hook("quiet")], T0 + 9)
    assert event.event_id == event_id(run.id, run.attempt, "job.paused", "ops")
    assert "3 failed runs in a row" in event.body["reason"]
    assert paused_deliveries(check, [], [], T0) == []
    failed, ok = ended("failed"), ended("succeeded")
    cancelled = ended("cancelled")
    assert failure_streak([failed, cancelled, failed], 2)
    assert not failure_streak([failed, ok, failed], 2)
    assert not failure_streak([failed], 2)


def test_a_url_is_shown_without_its_path_and_query_where_it_may_be_a_credential() -> None:
    from etcdsched.model.notify_safety import redacted_url

    assert (
        redacted_url("https://hooks.slack.com/services/T0/B0/XYZ") == "https://hooks.slack.com/..."
    )
    assert redacted_url("https://h.example:8443/?token=1") == "https://h.example:8443/..."
    assert redacted_url("http://[::1]:9/") == "http://[::1]:9/"
    assert redacted_url("https://h.example:99999/x") == "(an invalid URL)"
