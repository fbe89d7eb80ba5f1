.PHONY: install test up faults bench lint

install:
	test -x .venv/bin/python || python3 -m venv .venv
	.venv/bin/python -m pip install --upgrade pip
	.venv/bin/python -m pip install -e '.[test]'

test:
	bash scripts/test.sh

up: install
	.venv/bin/etcdsched up

lint: install
	.venv/bin/ruff check etcdsched tests scripts
	.venv/bin/mypy --strict etcdsched
	.venv/bin/lint-imports

DURATION ?= 30m
SEED ?= 0
faults: install
	.venv/bin/python -m tests.faults.harness --duration $(DURATION) --seed $(SEED)

bench: install
	.venv/bin/etcdsched bench
