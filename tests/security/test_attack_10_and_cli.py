"""Attack 10 (the cluster view) and the CLI's credentials (issue 27): a
tenant token sees no hostnames, pids or labels of the fleet, and a token
found in the current directory never travels to a configured remote API."""

from __future__ import annotations

from pathlib import Path

import pytest

from etcdsched.cli.support import resolve_connection
from etcdsched.model.errors import Forbidden
from tests.api.conftest import Api


async def test_attack_10_the_cluster_view_is_the_admins(api: Api) -> None:
    for token in (api.acme, api.globex):
        status, body, _ = await api.call("GET", "/v1/cluster", token)
        assert status == 403, body
        assert "hostname" not in str(body) and "pid" not in str(body)
    async with api.client(api.acme) as client:
        with pytest.raises(Forbidden):
            await client.cluster()
    async with api.client(api.admin) as admin:
        assert (await admin.cluster()).partitions > 0
    async with api.client(api.acme) as client:  # what a tenant may know: its own queue
        await client.create_job(
            {"trigger": {"kind": "interval", "every": "1h"}, "execution": {"argv": ["true"]}},
            job_id="queued",
        )
        await client.trigger_job("queued")  # no scheduler here: nothing takes it off the queue
        assert (await client.get_tenant("acme")).queue_depth == 1


def _pair(url: str | None, token: str | None) -> tuple[str, str | None]:
    conn = resolve_connection(url, token)
    return conn.url, conn.token


def test_connection_settings_come_whole_from_the_first_place_that_has_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flag/env, then the config file, then ./.etcdsched/admin.token only when
    no URL was configured: a local token never goes to a configured remote API."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert _pair(None, None) == ("http://127.0.0.1:8080", None)
    assert "looked at" in resolve_connection(None, None).source
    (tmp_path / ".etcdsched").mkdir()
    (tmp_path / ".etcdsched" / "admin.token").write_text("local\n")
    assert _pair(None, None) == ("http://127.0.0.1:8080", "local")
    (tmp_path / "cfg" / "etcdsched").mkdir(parents=True)
    (tmp_path / "cfg" / "etcdsched" / "config.yaml").write_text("url: http://h:1\ntoken: t1\n")
    assert _pair(None, None) == ("http://h:1", "t1")  # the config file beats the local token
    (tmp_path / "cfg" / "etcdsched" / "config.yaml").write_text("url: http://h:1\n")
    assert _pair(None, None) == ("http://h:1", None)  # never the local token with its URL
    assert _pair("http://x:2", "flag") == ("http://x:2", "flag")
    assert _pair(None, "flag") == ("http://127.0.0.1:8080", "flag")
