"""The retention soak with the object-store log store: is the bucket flat too?

``etcdsched bench --scenario soak`` soaks the directory store (its agents
inherit this process's environment). This side measurement starts a
SeaweedFS S3 server on loopback (the test suite's ``WeedServer``), points
the soak's agents at it through ``ETCDSCHED_LOG_STORE`` and the S3
settings, runs the soak, and samples the bucket every ``--every`` seconds:
objects and bytes, all of them and the run logs alone (archives apart).
Writes the samples as JSON and prints first/last/max after the warm-up.

Run from the repository root:
``PYTHONPATH=. .venv/bin/python scripts/soak_bucket.py --runs 10000 --out soak-bucket.json``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.seaweed import _REGION, WeedServer


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--every", type=float, default=15.0, help="seconds between samples")
    parser.add_argument("--warm-up", type=float, default=135.0, help="seconds not judged")
    parser.add_argument("--out", type=Path, default=Path("soak-bucket.json"))
    return parser.parse_args()


def bucket_usage(client: Any, bucket: str) -> dict[str, int]:
    """Objects and bytes in the bucket: all, and the run logs alone."""
    usage = {"objects": 0, "bytes": 0, "log_objects": 0, "log_bytes": 0}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            usage["objects"] += 1
            usage["bytes"] += obj["Size"]
            if "/archive/" not in obj["Key"]:
                usage["log_objects"] += 1
                usage["log_bytes"] += obj["Size"]
    return usage


def sample(client: Any, bucket: str, every: float, stop: threading.Event, into: list[Any]) -> None:
    started = time.monotonic()
    while not stop.wait(0 if not into else every):
        into.append({"t": round(time.monotonic() - started, 1), **bucket_usage(client, bucket)})


def summary(samples: list[dict[str, Any]], warm_up: float) -> dict[str, Any]:
    judged = [s for s in samples if s["t"] >= warm_up]
    quarter = max(1, len(judged) // 4)
    out: dict[str, Any] = {}
    for name in ("objects", "bytes", "log_objects", "log_bytes"):
        values = [s[name] for s in judged]
        if not values:
            continue
        second, last = values[quarter : 2 * quarter] or values, values[-quarter:]
        out[name] = {
            "first": values[0],
            "last": values[-1],
            "max": max(values),
            "last_quarter_max_over_second": round(max(last) / max(1, max(second)), 2),
        }
    return out


def main() -> None:
    opts = options()
    work = Path(tempfile.mkdtemp(prefix="soak-bucket-"))
    server = WeedServer(work)
    s3 = server.start()
    client = s3.client()
    env = {
        **os.environ,
        "ETCDSCHED_LOG_STORE": f"s3://{s3.bucket}/soak",
        "ETCDSCHED_LOG_S3_ENDPOINT_URL": s3.endpoint_url,
        "ETCDSCHED_LOG_S3_REGION": _REGION,
        "ETCDSCHED_LOG_S3_ACCESS_KEY_FILE": str(s3.access_key_file),
        "ETCDSCHED_LOG_S3_SECRET_KEY_FILE": str(s3.secret_key_file),
        "ETCDSCHED_LOG_S3_ADDRESSING_STYLE": "path",
    }
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(client, s3.bucket, opts.every, stop, samples))
    sampler.start()
    bench = [sys.executable, "-m", "etcdsched.bench", "--scenario", "soak"]
    bench += ["--soak-runs", str(opts.runs), "--out-dir", str(work / "bench")]
    bench += ["--docs", str(work / "bench" / "benchmarks.md"), "--data-dir", str(work / "data")]
    try:
        subprocess.run(bench, env=env, check=True)
    finally:
        stop.set()
        sampler.join()
        samples.append({"t": samples[-1]["t"] if samples else 0, **bucket_usage(client, s3.bucket)})
        server.stop()
    result = {
        "command": " ".join(sys.argv),
        "bench": " ".join(bench),
        "runs": opts.runs,
        "summary": summary(samples, opts.warm_up),
        "samples": samples,
    }
    opts.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
