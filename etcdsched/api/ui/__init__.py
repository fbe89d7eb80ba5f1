"""The web dashboard, served by the API process under ``/ui/`` (docs/ui.md).

Server-rendered pages (Jinja2, autoescaped) over the same functions, role
checks and tenant rules as the JSON routes; htmx (a static file, with its
licence, in ``static/``) refreshes parts of pages, and server-sent events
carry a running job's log. No build step and no Node: the templates and
static files are package data. The routes are not API operations, so
they are not in the OpenAPI document.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from etcdsched.api.routing import ApiContext
from etcdsched.api.ui import (
    log_events,
    pages_cluster,
    pages_job,
    pages_jobs,
    pages_login,
    pages_run,
)
from etcdsched.api.ui.recent import RecentMetrics

STATIC = Path(__file__).parent / "static"
_JOB = "/ui/jobs/{job_id}"
_RUN = "/ui/runs/{run_id}"


def mount(app: web.Application, ctx: ApiContext) -> None:
    """Add the dashboard's routes and static files to the API's ``app``."""
    services = ctx.services
    app[pages_cluster.RECENT] = RecentMetrics(services.registry, services.clock)
    router = app.router
    router.add_get("/ui", pages_login.home)
    router.add_get("/ui/", pages_login.home)
    router.add_get("/ui/login", pages_login.login_form)
    router.add_post("/ui/login", pages_login.login)
    router.add_post("/ui/logout", pages_login.logout)
    router.add_get("/ui/jobs", pages_jobs.jobs_page)
    router.add_get(_JOB, pages_job.job_page)
    router.add_post(f"{_JOB}/edit", pages_job.edit_job)
    router.add_post(f"{_JOB}/pause", pages_jobs.pause)
    router.add_post(f"{_JOB}/resume", pages_jobs.resume)
    router.add_post(f"{_JOB}/trigger", pages_jobs.trigger)
    router.add_get(_RUN, pages_run.run_page)
    router.add_post(f"{_RUN}/cancel", pages_run.cancel_run)
    router.add_get(f"{_RUN}/log/events", log_events.log_events)
    router.add_get(f"{_RUN}/log.txt", log_events.log_download)
    router.add_get("/ui/cluster", pages_cluster.cluster_page)
    router.add_static("/ui/static/", STATIC, name="ui-static", append_version=False)
