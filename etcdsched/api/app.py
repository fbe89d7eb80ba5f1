"""The aiohttp application: route table, middlewares, and serving.

Every operation is one :class:`~etcdsched.api.routing.Route` in :data:`ROUTES`;
the same list registers the handlers and builds ``/openapi.json``.
"""

from __future__ import annotations

import ipaddress
import ssl
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from etcdsched.api import (
    routes_cluster,
    routes_job_batch,
    routes_jobs,
    routes_runs,
    routes_tokens,
    routes_webhooks,
)
from etcdsched.api.auth import Authenticator, RateLimiter
from etcdsched.api.errors import error_middleware
from etcdsched.api.openapi import build_document
from etcdsched.api.quotas import Quotas
from etcdsched.api.routing import CONTEXT, ApiContext, FollowSlots, Route, bind
from etcdsched.api.services import ApiServices, LogChunkLike, LogReader
from etcdsched.api.ui import mount as mount_dashboard
from etcdsched.config import Config
from etcdsched.runtime import metrics
from etcdsched.runtime.clock import Clock
from etcdsched.store.jobs import JobService
from etcdsched.store.keys import Keys
from etcdsched.store.kv import Store

__all__ = [
    "ROUTES",
    "ApiServices",
    "LogChunkLike",
    "LogReader",
    "make_app",
    "serve_api",
]

ROUTES: list[Route] = [
    *routes_jobs.ROUTES,
    *routes_job_batch.ROUTES,
    *routes_runs.ROUTES,
    *routes_tokens.ROUTES,
    *routes_cluster.ROUTES,
    *routes_webhooks.ROUTES,
]


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every request by route template (not raw path: bounded labels)."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        metrics.API_REQUESTS.labels(request.method, route, str(status)).inc()
        metrics.API_LATENCY.labels(route).observe(time.perf_counter() - started)


def make_app(services: ApiServices, config: Config) -> web.Application:
    """The API over ``services``; limits (body size) come from ``config``."""
    app = web.Application(
        middlewares=[metrics_middleware, error_middleware],
        client_max_size=config.max_body_bytes,
    )
    auth = Authenticator(services.store, services.keys, services.clock)
    quotas = Quotas(services, auth, RateLimiter(services.clock))
    ctx = ApiContext(
        services=services,
        auth=auth,
        quotas=quotas,
        max_body_bytes=config.max_body_bytes,
        follows=FollowSlots(config.max_follows_per_tenant),
        routes=ROUTES,
        openapi=build_document(ROUTES),
    )
    app[CONTEXT] = ctx
    app.cleanup_ctx.append(auth.watching)
    for route in ROUTES:
        app.router.add_route(route.method, route.path, bind(route, ctx), name=route.operation_id)
    mount_dashboard(app, ctx)
    return app


def api_tls(config: Config) -> ssl.SSLContext | None:
    """The API's TLS context, or None for plain HTTP, which is refused on
    any address beyond loopback unless ``api_allow_plaintext`` says a TLS
    proxy stands in front: bearer tokens must not cross a network in clear."""
    cert, key = config.api_tls_cert, config.api_tls_key
    if cert is not None and key is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context
    if cert is not None or key is not None:
        raise ValueError("api_tls_cert and api_tls_key go together")
    if not _loopback(config.api_host) and not config.api_allow_plaintext:
        raise ValueError(
            f"the API would listen on {config.api_host} without TLS: set ETCDSCHED_API_TLS_CERT"
            " and ETCDSCHED_API_TLS_KEY (or --tls-cert/--tls-key), or"
            " ETCDSCHED_API_ALLOW_PLAINTEXT=true when a TLS proxy stands in front"
        )
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve_api(
    config: Config,
    store: Store,
    keys: Keys,
    clock: Clock,
    partitions: int,
    log_reader: LogReader,
) -> web.AppRunner:
    """Start the API on ``config.api_host:config.api_port``; the caller owns
    the returned runner and calls ``await runner.cleanup()`` to stop it."""
    jobs = JobService(store, keys, clock, partitions)
    services = ApiServices(store, keys, clock, partitions, jobs, log_reader)
    tls = api_tls(config)
    # in-flight requests (a log follow streams for as long as its run) get
    # 2 s at a stop, not aiohttp's 60: an agent stops promptly
    runner = web.AppRunner(make_app(services, config), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, config.api_host, config.api_port, ssl_context=tls)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
