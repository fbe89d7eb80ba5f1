"""A job for tests: appends start/end lines to a ledger file outside etcd —
the real side effect a history checker trusts — then sleeps and exits.

Usage: python jobscript.py LEDGER [--sleep S] [--exit N] [--ignore-term] [--beat]

With ``--beat`` it also appends a ``beat`` line every 100 ms while it sleeps,
so a checker knows the last instant each attempt was surely alive.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

BEAT_EVERY = 0.1


def note(ledger: str, event: str, **extra: object) -> None:
    line = {
        "event": event,
        "job": os.environ.get("ETCDSCHED_JOB_ID"),
        "run": os.environ.get("ETCDSCHED_RUN_ID"),
        "attempt": int(os.environ.get("ETCDSCHED_ATTEMPT", "0")),
        "slot_ms": int(os.environ.get("ETCDSCHED_SCHEDULED_AT_MS", "0")),
        "worker": os.environ.get("ETCDSCHED_WORKER_ID"),
        "pid": os.getpid(),
        "mono": time.monotonic(),
        "wall_ms": time.time_ns() // 1_000_000,
        **extra,
    }
    with open(ledger, "a") as out:
        out.write(json.dumps(line) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledger")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--exit", type=int, default=0)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--beat", action="store_true", help="a beat line every 100 ms")
    args = parser.parse_args()
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    note(args.ledger, "start")
    if args.beat:
        sleep_beating(args.ledger, args.sleep)
    else:
        time.sleep(args.sleep)
    note(args.ledger, "end", exit=args.exit)
    raise SystemExit(args.exit)


def sleep_beating(ledger: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(BEAT_EVERY, left))
        note(ledger, "beat")


if __name__ == "__main__":
    main()
