# The developer loop. `make demo` and `make test` work on a fresh Debian 12 machine: they install
# the Debian packages (when missing), a .venv and the Python dependencies first.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# chromium: the web console's browser suite (Playwright drives it; nothing is downloaded)
APT_PACKAGES := zookeeper rabbitmq-server default-jre-headless chromium
# As root use apt-get directly; otherwise through sudo.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: help setup apt-packages venv test lint pytest demo bench chaos fuzz diagrams screenshots pyfiles clean

help:
	@echo "make setup  - Debian packages (zookeeper, rabbitmq-server, JDK, chromium) + .venv + pip install -e .[dev] + the Gremlin Server's jars"
	@echo "make test   - setup, then ruff, mypy --strict and pytest against real servers"
	@echo "make demo   - setup, then a 3-node cluster: ontology sync, kill -9 failover, reports"
	@echo "make lint   - ruff and mypy only"
	@echo "make bench  - the benchmarks in bench/ (each prints its ratio last)"
	@echo "make chaos  - the full chaos profile: faults under load, one JSON table, exit 1 if a guarantee broke"
	@echo "make fuzz   - the fuzzers of tests/test_fuzz*.py with 50,000 inputs each (the suite runs 2,000)"
	@echo "make diagrams - render diagrams/*.puml to SVG (installs the Debian plantuml package when missing)"
	@echo "make screenshots - the README's pictures of the web console, taken by its browser suite"
	@echo "make pyfiles - dist/latchwork-pyfiles.zip for spark-submit --py-files"

setup: apt-packages venv

apt-packages:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if ! $(PYTHON) -c 'import venv, ensurepip' >/dev/null 2>&1; then missing="$$missing python3-venv"; fi; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends $$missing; \
	fi

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m runner.testing.gremlinserver install
	touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

pytest: setup
	$(VENV)/bin/pytest -n 2 --dist loadfile --durations=25

test: lint pytest

demo: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" ./scripts/demo.sh

bench: setup
	$(PY) -m pip install --quiet -e '.[bench]'
	@set -e; for b in bench/bench_*.py; do echo "== $$b"; $(PY) $$b; done

chaos: setup
	$(PY) bench/chaos.py --profile full $(CHAOS_ARGS)

# the fuzzers of tests/test_fuzz.py and, against a live node, tests/test_fuzz_cluster.py with
# 50,000 inputs each (the suite runs 2,000)
fuzz: setup
	LATCHWORK_FUZZ_EXAMPLES=50000 $(VENV)/bin/pytest -q -p no:timeout tests/test_fuzz.py \
	  tests/test_fuzz_cluster.py

# the browser suite saves the cluster and task pages of a live run (docs/images/web-*.png)
screenshots: setup
	LATCHWORK_SCREENSHOTS=docs/images $(VENV)/bin/pytest -q tests/test_web_browser.py -k in_a_browser

# PlantUML from Debian (a Java program; sequence diagrams need no Graphviz). The SVGs are
# committed; tests/test_diagrams.py fails when a source changed and its SVG was not rendered again.
diagrams:
	@dpkg-query -W -f='$${Status}' plantuml 2>/dev/null | grep -q "ok installed" || { \
	  echo "installing Debian package: plantuml"; $(SUDO) apt-get update && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends plantuml; }
	cd diagrams && plantuml -tsvg -charset UTF-8 -failfast2 *.puml
	@ls diagrams/*.svg

pyfiles: setup
	$(PY) -m runner.pipeline.bundle dist/latchwork-pyfiles.zip

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info
