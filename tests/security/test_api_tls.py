"""The API over TLS, and no plaintext API beyond loopback unless asked for."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from etcdsched.api.app import serve_api
from etcdsched.config import Config
from etcdsched.logs.store import DirLogStore
from etcdsched.runtime.clock import SystemClock
from etcdsched.store.embedded import reserve_ports
from etcdsched.store.etcd import EtcdStore
from etcdsched.store.keys import Keys


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "api.crt", tmp_path / "api.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_the_api_serves_tls_and_nothing_in_plaintext(
    store: EtcdStore, keys: Keys, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    [port] = reserve_ports(1)
    config = Config(api_port=port, api_tls_cert=cert, api_tls_key=key)
    logs = DirLogStore(tmp_path / "logs")
    runner = await serve_api(config, store, keys, SystemClock(), 4, logs)
    try:
        trusted = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/healthz", ssl=trusted) as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientError):
                async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    await resp.read()
    finally:
        await runner.cleanup()


async def test_no_plaintext_api_beyond_loopback_unless_asked(
    store: EtcdStore, keys: Keys, tmp_path: Path
) -> None:
    [port] = reserve_ports(1)
    logs = DirLogStore(tmp_path / "logs")
    config = Config(api_host="0.0.0.0", api_port=port)
    with pytest.raises(ValueError, match="TLS"):
        await serve_api(config, store, keys, SystemClock(), 4, logs)
    allowed = config.model_copy(update={"api_allow_plaintext": True})
    runner = await serve_api(allowed, store, keys, SystemClock(), 4, logs)
    await runner.cleanup()
