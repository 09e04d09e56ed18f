# The two commands of the README: `make run` serves with the embedded defaults, `make test` runs
# the whole test suite. Each first sets up what it needs and is quick when nothing changed: .venv
# is created, and refreshed only when pyproject.toml changes (stamp: .venv/.installed).
#
#   make run  [ARGS="--port 8080"]       serve (appliance with no command = appliance serve)
#   make test [ARGS="-x tests/ops"]      pytest, after the interop tools the suite can use
#   make test-postgres [ARGS=...]        the same suite on the PostgreSQL store, in a throwaway
#                                        cluster (Debian's postgresql package; tests/pg_cluster.sh)
#   make dist                            the standalone executable dist/appliance (PyInstaller)
#   make smoke [APPLIANCE_BINARY=PATH]   the executable's smoke test, with its figures

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BUILD_STAMP := $(VENV)/.installed-build
HTMX := static/vendor/htmx.min.js
INTEROP := tests/marmot/interop
NOSTR_INTEROP := tests/relay/interop
MDK_SCRIPT := ../shared/tools/install-mdk-python.sh

.PHONY: run test test-postgres dist smoke clean

run: $(STAMP)
	$(BIN)/appliance $(ARGS)

test: $(STAMP) $(HTMX) $(VENV)/.mdk $(INTEROP)/node_modules/.installed $(NOSTR_INTEROP)/node_modules/.installed
	$(BIN)/pytest -q $(ARGS)

test-postgres: $(STAMP) $(HTMX) $(VENV)/.mdk $(INTEROP)/node_modules/.installed $(NOSTR_INTEROP)/node_modules/.installed
	tests/pg_cluster.sh $(BIN)/pytest -q --storage=postgresql $(ARGS)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@

# The dashboard's htmx: from the npm registry at its pinned version, integrity checked (never committed).
$(HTMX): $(STAMP) appliance/admin/assets.py
	$(BIN)/appliance admin fetch-assets
	touch $@

# MDK (the reference Marmot implementation) for the Marmot interoperability tests; without it they
# skip and say why. Tried again on the next run when it could not be installed.
$(VENV)/.mdk: $(STAMP)
	if [ -f $(MDK_SCRIPT) ] && bash $(MDK_SCRIPT) $(BIN)/python; then touch $@; \
	else echo "mdk-python unavailable: the MDK tests will skip"; fi

# ts-mls (an independent MLS implementation, npm) for the MLS cross-checks; they skip without it.
$(INTEROP)/node_modules/.installed: $(INTEROP)/package-lock.json
	if command -v npm >/dev/null 2>&1 && npm ci --prefix $(INTEROP) --no-audit --no-fund --silent; then touch $@; \
	else echo "ts-mls unavailable: the cross-check tests will skip"; fi

# nostr-tools (npm) for the NIP-77 interoperability test; it skips without it.
$(NOSTR_INTEROP)/node_modules/.installed: $(NOSTR_INTEROP)/package-lock.json
	if command -v npm >/dev/null 2>&1 && npm ci --prefix $(NOSTR_INTEROP) --no-audit --no-fund --silent; then touch $@; \
	else echo "nostr-tools unavailable: its NIP-77 test will skip"; fi

$(BUILD_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,build]'
	touch $@

# One build command: a single-file executable with the templates, static files, the verified htmx
# and every dependency inside.
dist: $(BUILD_STAMP) $(HTMX)
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
		packaging/appliance.spec
	@ls -l dist/appliance && dist/appliance --version

# The executable's smoke test alone, showing its figures (size, cold start, idle RSS). It builds
# one unless APPLIANCE_BINARY names an executable already built (make smoke APPLIANCE_BINARY=dist/appliance).
smoke: $(STAMP) $(HTMX)
	APPLIANCE_BINARY=$(APPLIANCE_BINARY) $(BIN)/pytest -q -s tests/packaging/test_smoke.py

clean:
	rm -rf build dist
