# ticketflow: `make demo` and `make test` do all the set-up on a fresh machine, idempotently.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
LOCKS  := requirements/build.txt requirements/lock.txt
# the venv is rebuilt when the project or its lock changes
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCKS) | cksum | cut -d' ' -f1)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
WEIGHTS := inference_gateway/model_repository/ticket_classifier/1/weights.npz

.PHONY: setup venv lock redis prometheus kafka model demo test test-unit lint typecheck down clean peer

setup: venv redis prometheus kafka model

# every dependency from the lock (requirements/README.md), hashes checked; then ticketflow
# itself, editable, built with the locked setuptools
venv: $(STAMP)
$(STAMP): pyproject.toml $(LOCKS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r requirements/build.txt
	$(BIN)/pip install -q --require-hashes -r requirements/lock.txt
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-*; touch $@

# Refresh requirements/*.txt after a change of dependencies (requirements/README.md);
# UPGRADE=--upgrade moves every pin to the newest version that fits
UV_COMPILE = $(BIN)/uv pip compile -q --generate-hashes --python-version 3.11 \
             --python-platform x86_64-manylinux_2_35 $(UPGRADE)
lock: venv
	$(UV_COMPILE) requirements/build.in -o requirements/build.txt
	$(UV_COMPILE) pyproject.toml --extra train --extra dev -o requirements/lock.txt
	$(UV_COMPILE) pyproject.toml -o requirements/runtime.txt
	$(UV_COMPILE) pyproject.toml requirements/peer.in -o requirements/peer.txt

# Debian's redis-server, openssl for the secured stack's certificates and tmux for the
# 80-column test of the command line (tests/integration/test_cli_width.py), installed only
# when missing
redis:
	@command -v redis-server >/dev/null 2>&1 || \
	  ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server)
	@command -v openssl >/dev/null 2>&1 || \
	  ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq openssl)
	@command -v tmux >/dev/null 2>&1 || \
	  ($(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq tmux)

# Debian's prometheus (and its promtool, which the alert rules' tests run), only when missing;
# on a systemd host the package's own service would hold :9090, so it is stopped: `stack up`
# runs ours, on the generated configuration
prometheus:
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || \
	  ($(SUDO) apt-get update -qq && \
	   $(SUDO) apt-get install -y -qq --no-install-recommends prometheus && \
	   ( ! command -v systemctl >/dev/null 2>&1 || \
	     $(SUDO) systemctl disable --now prometheus >/dev/null 2>&1 || true ))

# the Kafka broker's jars, fetched by Maven into the state folder (cached)
kafka: venv
	$(BIN)/python -m devstack fetch

# the default model, trained from the generated corpus (skipped when up to date)
model: venv
	$(BIN)/python -m training.train

demo: setup
	$(BIN)/ticketflow demo

lint: venv typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy over the runtime packages ([tool.mypy] in pyproject.toml), zero errors
typecheck: venv
	$(BIN)/mypy

test: setup lint
	$(BIN)/ticketflow stack up
	$(BIN)/pytest -q -ra

test-unit: venv
	$(BIN)/pytest -q tests/unit

# The quix-streams peer of `ticketflow bench pipeline` (variant e), in a venv of its own:
# quixstreams 3.28.1 needs confluent-kafka < 2.13, older than the one the worker runs on
PEER       := .venv-peer
PEER_STAMP := $(PEER)/.installed-$(shell cat pyproject.toml requirements/peer.txt | cksum | cut -d' ' -f1)
peer: $(PEER_STAMP)
$(PEER_STAMP): pyproject.toml requirements/build.txt requirements/peer.txt
	$(PYTHON) -m venv $(PEER)
	$(PEER)/bin/pip install -q --require-hashes -r requirements/build.txt
	$(PEER)/bin/pip install -q --require-hashes -r requirements/peer.txt
	$(PEER)/bin/pip install -q --no-deps --no-build-isolation -e .
	rm -f $(PEER)/.installed-*; touch $@

down:
	-$(BIN)/ticketflow stack down

clean: down
	rm -rf .stack
