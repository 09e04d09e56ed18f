# The two commands of the README: `make run` serves with the embedded defaults, `make test` runs
# the test suite's default tier (everything but the slow end-to-end tests). Each first sets up what it needs and is quick when nothing changed: .venv
# is created and synced with uv.lock (exact versions and hashes of every package; stamps
# .venv/.installed*), again only when uv.lock or pyproject.toml changes. `make run` installs what
# serving needs and nothing else; `make test` adds the test extras, `make dist` the build extras.
#
#   make run  [ARGS="--port 8080"]       serve (appliance with no command = appliance serve)
#   make test [ARGS="-x tests/ops"]      pytest, after the interop tools the suite can use: the
#                                        default tier (tests marked slow are left out), on
#                                        TEST_WORKERS parallel workers (3; 0 runs it in one process)
#   make test-slow [ARGS=...]            the slow tier alone (pytest -m slow)
#   make test-postgres [ARGS=...]        both tiers on the PostgreSQL store, in a throwaway
#                                        cluster (Debian's postgresql package; tests/pg_cluster.sh)
#   make test-latest [ARGS=...]          the suite against the newest releases of the dependencies
#                                        (not the lock), in .venv-latest; its output goes to
#                                        test-artifacts/test-latest.log and one line says how it went
#   make test-lowest [ARGS=...]          the suite at the floors pyproject.toml declares (each direct
#                                        dependency at its lowest allowed release), in .venv-lowest
#   make lock                            re-resolve uv.lock after a change to pyproject.toml
#   make lock-upgrade                    move every pin in uv.lock to the newest release allowed
#   make dist                            the standalone executable dist/appliance (PyInstaller)
#   make smoke [APPLIANCE_BINARY=PATH]   the executable's smoke test, with its figures

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
UV := $(BIN)/uv
UV_STAMP := $(VENV)/.uv
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
BUILD_STAMP := $(VENV)/.installed-build
# uv.lock as it is (--locked: an out-of-date lock is an error, not a silent re-resolve), into .venv
# and its python (never a Python uv would download), adding to what is there (--inexact: MDK and
# the other extras stay).
SYNC := UV_PYTHON_DOWNLOADS=never $(UV) sync --quiet --locked --inexact --python $(BIN)/python
LATEST := .venv-latest
LATEST_LOG := test-artifacts/test-latest.log
# The newest-releases run is reported, never gating: bounded so it cannot hold up CI.
LATEST_TIMEOUT ?= 35m
HTMX := static/vendor/htmx.min.js
INTEROP := tests/marmot/interop
NOSTR_INTEROP := tests/relay/interop
MDK_SCRIPT := ../shared/tools/install-mdk-python.sh

.PHONY: run test test-slow test-postgres test-latest test-lowest lock lock-upgrade dist smoke clean

run: $(STAMP)
	$(BIN)/appliance $(ARGS)

TEST_DEPS := $(TEST_STAMP) $(HTMX) $(VENV)/.mdk $(INTEROP)/node_modules/.installed $(NOSTR_INTEROP)/node_modules/.installed

# The default tier waits on servers, sockets and timers far more than it computes: pytest-xdist
# runs it on parallel workers, stealing work at the end (docs/performance.md, the test suite).
TEST_WORKERS ?= 3

test: $(TEST_DEPS)
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist worksteal $(ARGS)

test-slow: $(TEST_DEPS)
	$(BIN)/pytest -q -m slow $(ARGS)

test-postgres: $(TEST_DEPS)
	tests/pg_cluster.sh $(BIN)/pytest -q --storage=postgresql --with-slow $(ARGS)

# uv itself, at the version and with the hashes uv.lock records (its `lock` group), into .venv.
$(UV_STAMP): uv.lock packaging/lockpin.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python packaging/lockpin.py uv > $(VENV)/uv-requirements.txt
	$(BIN)/pip install -q --require-hashes --no-deps -r $(VENV)/uv-requirements.txt
	touch $@

# Serving: the runtime dependencies only.
$(STAMP): pyproject.toml uv.lock $(UV_STAMP)
	$(SYNC)
	touch $@

# The suite: the runtime dependencies and the test extras.
$(TEST_STAMP): pyproject.toml uv.lock $(UV_STAMP)
	$(SYNC) --extra test
	touch $@

# Re-resolve after pyproject.toml changed (pins that still fit stay); then commit uv.lock.
lock: $(UV_STAMP)
	UV_PYTHON_DOWNLOADS=never $(UV) lock

lock-upgrade: $(UV_STAMP)
	UV_PYTHON_DOWNLOADS=never $(UV) lock --upgrade

# The dashboard's htmx: from the npm registry at its pinned version, integrity checked (never committed).
$(HTMX): $(STAMP) appliance/admin/assets.py
	$(BIN)/appliance admin fetch-assets
	touch $@

# MDK (the reference Marmot implementation) for the Marmot interoperability tests; without it they
# skip and say why. Tried again on the next run when it could not be installed.
$(VENV)/.mdk: $(TEST_STAMP)
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

$(BUILD_STAMP): pyproject.toml uv.lock $(UV_STAMP)
	$(SYNC) --extra build
	touch $@

# One build command: a single-file executable with the templates, static files, the verified htmx
# and every dependency inside.
dist: $(BUILD_STAMP) $(HTMX)
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
		packaging/appliance.spec
	@ls -l dist/appliance && dist/appliance --version

# The executable's smoke test alone, showing its figures (size, cold start, idle RSS). It builds
# one unless APPLIANCE_BINARY names an executable already built (make smoke APPLIANCE_BINARY=dist/appliance).
smoke: $(TEST_STAMP) $(HTMX)
	APPLIANCE_BINARY=$(APPLIANCE_BINARY) $(BIN)/pytest -q -s -m slow tests/packaging/test_smoke.py

# The suite against the newest releases of every dependency (a fresh .venv-latest resolved without
# the lock), to learn early what the next `make lock-upgrade` would break. Its output goes to
# $(LATEST_LOG); what it prints is one line of its own, so that its pytest summary is never
# read as the verdict of a CI run, and it exits 0 whatever the suite found (a report, not a gate).
test-latest: $(UV_STAMP) $(HTMX) $(INTEROP)/node_modules/.installed $(NOSTR_INTEROP)/node_modules/.installed
	@mkdir -p $(dir $(LATEST_LOG))
	@rm -rf $(LATEST) && $(PYTHON) -m venv $(LATEST) > $(LATEST_LOG) 2>&1 \
	&& UV_PYTHON_DOWNLOADS=never $(UV) pip install --python $(LATEST)/bin/python --upgrade -e '.[test]' >> $(LATEST_LOG) 2>&1 \
	&& { [ ! -f $(MDK_SCRIPT) ] || bash $(MDK_SCRIPT) $(LATEST)/bin/python >> $(LATEST_LOG) 2>&1 || true; } \
	&& $(UV) pip list --python $(LATEST)/bin/python >> $(LATEST_LOG) 2>&1 \
	&& { timeout --kill-after=60 $(LATEST_TIMEOUT) $(LATEST)/bin/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist worksteal $(ARGS) >> $(LATEST_LOG) 2>&1; \
	     rc=$$?; $(LATEST)/bin/python tests/latest_report.py $$rc $(LATEST_LOG); } \
	|| echo "test-latest (not gating): could not set up $(LATEST); see $(LATEST_LOG)"

# The floors, tested: every direct dependency at the lowest release pyproject.toml allows (their
# own dependencies at the newest that fit), in a fresh .venv-lowest. Not run by CI (it would add a
# third full run); run it after changing a floor, and say so in docs/dependencies.md.
test-lowest: $(UV_STAMP) $(HTMX) $(INTEROP)/node_modules/.installed
	rm -rf .venv-lowest && $(PYTHON) -m venv .venv-lowest
	UV_PYTHON_DOWNLOADS=never $(UV) pip install -q --python .venv-lowest/bin/python --resolution lowest-direct -e '.[test]'
	$(UV) pip list --python .venv-lowest/bin/python
	.venv-lowest/bin/pytest -q -p no:cacheprovider --with-slow $(ARGS)

clean:
	rm -rf build dist $(LATEST) .venv-lowest
