"""Prometheus metric objects shared by every role of an agent.

All live on one module-level :data:`REGISTRY` (not the client library's global
default registry), so tests and embedded agents can read exactly etcdsched's
metrics, and ``/metrics`` serves the registry it is given. Each role updates
its own metrics; the API only exposes them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_ETCD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_API_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

START_LAG = Histogram(
    "etcdsched_start_lag_seconds",
    "Actual start of an attempt minus its scheduled (not-before) instant.",
    buckets=_LAG_BUCKETS,
    registry=REGISTRY,
)
FIRES = Counter(
    "etcdsched_fires",
    "Slots fired into runs by schedulers, by run kind (scheduled, manual, backfill).",
    ["kind"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "etcdsched_queue_depth",
    "Runs waiting for placement, by partition (as last observed by this process).",
    ["partition"],
    registry=REGISTRY,
)
RUNS_BY_STATE = Counter(
    "etcdsched_run_transitions",
    "Runs that entered each state (as written by this process).",
    ["state"],
    registry=REGISTRY,
)
LOST_RUNS = Counter(
    "etcdsched_lost_runs",
    "Attempts marked lost because their worker's lease expired.",
    registry=REGISTRY,
)
REQUEUED_RUNS = Counter(
    "etcdsched_requeued_runs",
    "Runs put back in the queue, no attempt used, because their worker's lease expired"
    " before their job started.",
    registry=REGISTRY,
)
RETRIES = Counter(
    "etcdsched_retries",
    "Attempts scheduled again by the retry policy, by the outcome that caused them.",
    ["outcome"],
    registry=REGISTRY,
)
FIRING_HELD = Counter(
    "etcdsched_firing_held",
    "Times a partition's firing waited because placement was behind (overload, ADR 0014).",
    registry=REGISTRY,
)
SKIPPED_SLOTS = Counter(
    "etcdsched_skipped_slots",
    "Slots that deliberately did not run (skip records and runs ended skipped), by reason"
    " (misfire, overlap, paused, starting_deadline, dependency, ...).",
    ["reason"],
    registry=REGISTRY,
)
PARTITIONS_OWNED = Gauge(
    "etcdsched_partitions_owned",
    "Partitions the scheduler in this process currently owns.",
    registry=REGISTRY,
)
ETCD_LATENCY = Histogram(
    "etcdsched_etcd_request_seconds",
    "Latency of etcd requests, by operation (get, range, txn, lease, watch).",
    ["op"],
    buckets=_ETCD_BUCKETS,
    registry=REGISTRY,
)
ETCD_REQUEST_ERRORS = Counter(
    "etcdsched_etcd_request_errors",
    "etcd requests that failed (unavailable, outcome unknown, refused), by operation.",
    ["op"],
    registry=REGISTRY,
)
API_REQUESTS = Counter(
    "etcdsched_api_requests",
    "HTTP API requests, by method, route template and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
API_LATENCY = Histogram(
    "etcdsched_api_request_seconds",
    "HTTP API request handling time, by route template (streams excluded).",
    ["route"],
    buckets=_API_BUCKETS,
    registry=REGISTRY,
)
WEBHOOK_DELIVERIES = Counter(
    "etcdsched_webhook_deliveries",
    "Webhook deliveries that ended, by result (delivered, or failed: given up).",
    ["result"],
    registry=REGISTRY,
)
WEBHOOK_ATTEMPTS = Counter(
    "etcdsched_webhook_attempts",
    "Webhook POSTs, by result (ok: a 2xx answer; error: anything else).",
    ["result"],
    registry=REGISTRY,
)
WEBHOOK_PENDING = Gauge(
    "etcdsched_webhook_pending",
    "Webhook deliveries waiting in the outbox of the partitions this scheduler owns.",
    registry=REGISTRY,
)
