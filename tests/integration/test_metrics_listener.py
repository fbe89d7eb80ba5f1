"""``METRICS_PORT``: any agent serves ``/metrics`` on a port of its own
(docs/operations.md, "Monitoring"), so Prometheus scrapes agents without
the API role; and it answers nothing else."""

from __future__ import annotations

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from etcdsched.runtime.metrics_server import serve_metrics
from etcdsched.store.embedded import free_port


async def test_the_listener_serves_its_registry_and_nothing_else() -> None:
    registry = CollectorRegistry()
    Counter("etcdsched_probe", "A counter only this test has.", registry=registry).inc(3)
    port = free_port()
    runner = await serve_metrics("127.0.0.1", port, registry)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as answer:
                assert answer.status == 200
                assert answer.content_type == "text/plain"
                assert "etcdsched_probe_total 3.0" in await answer.text()
            async with http.get(f"http://127.0.0.1:{port}/v1/jobs") as answer:
                assert answer.status == 404
            async with http.post(f"http://127.0.0.1:{port}/metrics") as answer:
                assert answer.status == 405
    finally:
        await runner.cleanup()
