# ticketflow: `make demo` and `make test` do all the set-up on a fresh machine, idempotently.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
WEIGHTS := inference_gateway/model_repository/ticket_classifier/1/weights.npz

.PHONY: setup venv redis prometheus kafka model demo test test-unit lint down clean peer

setup: venv redis prometheus kafka model

venv: $(STAMP)
$(STAMP):
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[train,dev]"
	rm -f $(VENV)/.installed-*; touch $@

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

lint: venv
	$(BIN)/ruff check .

test: setup lint
	$(BIN)/ticketflow stack up
	$(BIN)/pytest -q -ra

test-unit: venv
	$(BIN)/pytest -q tests/unit

# The quix-streams peer of `ticketflow bench pipeline` (variant e), in a venv of its own:
# quixstreams 3.28.1 needs confluent-kafka < 2.13, older than the one the worker runs on
PEER       := .venv-peer
PEER_STAMP := $(PEER)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
peer: $(PEER_STAMP)
$(PEER_STAMP):
	$(PYTHON) -m venv $(PEER)
	$(PEER)/bin/pip install -q --upgrade pip
	$(PEER)/bin/pip install -q -e . "quixstreams==3.28.1"
	rm -f $(PEER)/.installed-*; touch $@

down:
	-$(BIN)/ticketflow stack down

clean: down
	rm -rf .stack
