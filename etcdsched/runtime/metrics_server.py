"""``/metrics`` on a port of its own, for agents without the API role.

Prometheus scrapes every process it alerts on: a scheduler's partitions
and a worker's fencing live in that process's metrics, and only an agent
with the ``api`` role serves them on the API port. ``METRICS_PORT`` gives
any agent a plain-HTTP listener with just ``/metrics`` (no tokens cross it,
and it answers nothing else), as Prometheus exporters do.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from etcdsched.runtime.metrics import REGISTRY


def metrics_app(registry: CollectorRegistry = REGISTRY) -> web.Application:
    """An application answering ``GET /metrics`` with ``registry``."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def serve_metrics(
    host: str, port: int, registry: CollectorRegistry = REGISTRY
) -> web.AppRunner:
    """Listen on ``host:port``; the caller stops it with ``runner.cleanup()``."""
    runner = web.AppRunner(metrics_app(registry), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
