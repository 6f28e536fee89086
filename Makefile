# Two commands: `make demo` (set up and run the demo) and `make test` (set up and run the tests).
# Dependencies come from the hash-locked requirements/*.txt only (`make lock` refreshes them).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK_ARGS := --universal --python-version 3.11 --generate-hashes --quiet
PIP_LOCKED := $(BIN)/pip install -q --require-hashes --only-binary :all:

$(STAMP): requirements/dev.txt pyproject.toml
	$(PY) -m venv --clear $(VENV)
	$(PIP_LOCKED) -r requirements/dev.txt
	# setuptools warns at every editable install about folders named like the package (here
	# the package's own folder): a block of asterisks on each first `make demo`, not a problem.
	PYTHONWARNINGS="ignore:Editable installation.:UserWarning" \
	    $(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

.PHONY: setup demo test lint lock tools screenshots schemas mutation model deb
setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/depositd demo

# axe-core checks every console page for accessibility in the browser tests
# (tests/console/test_console_browser.py reads $DEPOSITD_AXE, by default this place).
AXE_DIR ?= $(HOME)/.cache/depositd-test-tools
AXE_VERSION := 4.11.0

export DEPOSITD_AXE ?= $(AXE_DIR)/node_modules/axe-core/axe.min.js

# promtool (Debian's prometheus package) checks the shipped alert rules and /metrics;
# PostgreSQL's server binaries run the throwaway cluster the tests of the second store use.
tools:
	@command -v promtool >/dev/null || { \
	    command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends prometheus; } || { \
	    echo "promtool missing: run apt-get install -y prometheus (as root)" >&2; exit 1; }
	@# The console's browser tests drive the distribution's headless Chromium (Selenium).
	@{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || { \
	    command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends chromium chromium-driver; } || { \
	    echo "chromium missing: run apt-get install -y chromium chromium-driver (as root)" >&2; \
	    exit 1; }
	@# The PostgreSQL server binaries: the tests run a throwaway cluster (initdb, pg_ctl).
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	    command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends postgresql; } || { \
	    echo "PostgreSQL missing: run apt-get install -y postgresql (as root)" >&2; exit 1; }
	@# axe-core from the npm registry, this exact version, outside the checkout.
	@grep -qs '"version": "$(AXE_VERSION)"' $(AXE_DIR)/node_modules/axe-core/package.json || { \
	    command -v npm >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends npm; } ; } && \
	    mkdir -p $(AXE_DIR) && npm install --prefix $(AXE_DIR) --no-audit --no-fund \
	    --save-exact axe-core@$(AXE_VERSION) >/dev/null || { \
	    echo "axe-core missing: install npm, then run make tools" >&2; exit 1; }
	@# tests/deploy boots a minimal Debian with systemd as PID 1: mmdebstrap builds its root
	@# filesystem (cached in /var/cache/depositd-tests), systemd-nspawn boots it.
	@{ command -v mmdebstrap >/dev/null && command -v systemd-nspawn >/dev/null; } || { \
	    command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -q --no-install-recommends mmdebstrap systemd-container; } || { \
	    echo "mmdebstrap or systemd-nspawn missing: run apt-get install -y mmdebstrap" \
	        "systemd-container (as root)" >&2; exit 1; }

# The suite on two workers (pytest-xdist): each starts its own PostgreSQL cluster and browser.
# loadgroup keeps tests/deploy (one booted container) on one worker.
test: $(STAMP) tools
	$(BIN)/pytest -q -n 2 --dist loadgroup

# The console's screenshots in docs/, taken by its browser tests.
screenshots: $(STAMP) tools
	DEPOSITD_SCREENSHOTS=1 $(BIN)/pytest -q -p no:randomly tests/console/test_console_browser.py

# The JSON Schemas in docs/schemas/ (named by the shipped YAML files), from `depositd schema`.
schemas: $(STAMP)
	for kind in config rules profiles; do \
	    $(BIN)/depositd schema $$kind > docs/schemas/$$kind.schema.json; done

# Mutation testing of the modules that decide money (tens of minutes; not in CI):
# `make mutation` for all, `make mutation MODULES=worker/track/tracker.py` for one.
mutation: $(STAMP)
	$(BIN)/python mutation/run.py $(MODULES)

# The generated model test of the money path, EXAMPLES histories per engine (make test runs a
# fixed budget of them); a run by hand draws new histories each time (DEPOSITD_MODEL_SEED).
EXAMPLES ?= 2000
model: $(STAMP) tools
	DEPOSITD_MODEL_EXAMPLES=$(EXAMPLES) DEPOSITD_MODEL_SEED=$$RANDOM $(BIN)/pytest -q -p no:randomly \
	    -n 2 --timeout=0 tests/model

# The Debian package, dist/depositd_VERSION_ARCH.deb (deploy/build-deb.sh; build it on the
# Debian release it is for: its virtualenv uses that release's /usr/bin/python3).
deb:
	deploy/build-deb.sh --out dist

lint: $(STAMP)
	$(BIN)/python requirements/check.py
	$(BIN)/ruff check worker tests bench mutation
	$(BIN)/ruff format --check worker tests bench mutation
	$(BIN)/mypy worker
	$(BIN)/yamllint --strict .
	@# The docs site: a broken link or anchor, a missing page or one left out of the nav fails.
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Re-resolve both locks from pyproject.toml with hashes, keeping the pinned versions that
# still fit; `make lock UPGRADE=1` takes the newest versions pyproject.toml allows.
LOCK_ARGS += $(if $(UPGRADE),--upgrade)
lock: $(STAMP)
	$(BIN)/uv pip compile $(LOCK_ARGS) pyproject.toml requirements/build.in \
	    -o requirements/runtime.txt
	$(BIN)/uv pip compile $(LOCK_ARGS) --extra dev pyproject.toml requirements/build.in \
	    -o requirements/dev.txt
