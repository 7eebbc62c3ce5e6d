# xum developer targets. Only python3 and git are needed on the machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

NPM ?= npm
# The node suites join `make test` when npm is here (a machine without it skips them, saying so).
TS_DEPS := $(if $(shell command -v $(NPM) 2>/dev/null),ts-deps agent-deps)

.PHONY: install install-user run ts-deps agent-deps ts-test ts-pack vsix test test-portable test-editors test-reliability test-reliability-sample lint typecheck fmt schema units bench clean mutate

install: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The shipped systemd/xumd.service runs %h/.local/bin/xumd: link this checkout's entry points
# there (HOME=... make install-user for another home). `xum daemon install` needs no link: it
# writes units naming this venv's xumd.
install-user: install
	mkdir -p $(HOME)/.local/bin
	ln -sfn $(abspath $(BIN))/xumd $(HOME)/.local/bin/xumd
	ln -sfn $(abspath $(BIN))/xum $(HOME)/.local/bin/xum

run: install
	$(BIN)/xumd

# The suite runs on pytest-xdist workers, one per core (`auto`), each test file whole on one
# worker (`--dist loadfile`: a module's shared daemon is started once, its tests keep their
# order; the long few-test files first: tests/conftest.py). TEST_WORKERS=0 runs it in this one
# process; docs/DEVELOPING.md, "Tests".
TEST_WORKERS ?= auto
TEST_ARGS ?=

test: install $(TS_DEPS)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(TEST_ARGS)

# The contract's tests again on the portable backend (psutil and POSIX calls: what macOS and the
# BSDs run), here on Linux: the crash matrix, the cleanup fences, quiescence and leases, mounts
# inside checkouts, containment, git locks, disk full. Where that backend keeps a guarantee only
# in a weaker form, its tests assert the weaker form (docs/RELIABILITY.md, "Platforms").
PORTABLE_TESTS = tests/recovery/test_crash_matrix.py tests/recovery/test_reconcile_inprocess.py \
	tests/cleanup/test_guards.py tests/cleanup/test_service.py tests/cleanup/test_end_to_end.py \
	tests/processes/test_quiescence.py tests/processes/test_lease.py \
	tests/processes/test_lease_scripts.py tests/lifecycle/test_mount_boundaries.py \
	tests/system/test_containment.py tests/system/test_fsdelete.py \
	tests/system/test_mount_table_unreadable.py tests/daemon/test_disk_full.py \
	tests/daemon/test_platform_status.py tests/lifecycle/test_gitlocks.py \
	tests/cleanup/test_trash_hostile.py tests/lifecycle/test_named_ports.py

test-portable: install
	XUM_PLATFORM=portable $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile \
		--no-loadscope-reorder $(PORTABLE_TESTS)

# The TypeScript client and the VS Code extension (clients/ts, clients/vscode): packages from the
# committed lockfiles, then their node suites against real xumd processes.
ts-deps: clients/ts/node_modules/.package-lock.json clients/vscode/node_modules/.package-lock.json

clients/ts/node_modules/.package-lock.json: clients/ts/package-lock.json
	cd clients/ts && $(NPM) ci --no-audit --no-fund

clients/vscode/node_modules/.package-lock.json: clients/vscode/package-lock.json
	cd clients/vscode && $(NPM) ci --no-audit --no-fund

# The MCP TypeScript SDK's client that drives `xum mcp` (tests/agents/test_mcp_typescript.py).
agent-deps: tests/agents/ts_client/node_modules/.package-lock.json

tests/agents/ts_client/node_modules/.package-lock.json: tests/agents/ts_client/package-lock.json
	cd tests/agents/ts_client && $(NPM) ci --no-audit --no-fund

ts-test: install ts-deps
	cd clients/ts && XUMD="$(CURDIR)/$(BIN)/xumd" $(NPM) test
	cd clients/vscode && XUMD="$(CURDIR)/$(BIN)/xumd" $(NPM) test

# The TypeScript client as a tarball another project installs: clients/ts/xum-client-VERSION.tgz
# (npm pack builds it first; clients/ts/README.md, "Installing it in your project").
ts-pack: ts-deps
	cd clients/ts && $(NPM) pack

# The VS Code extension's package: clients/vscode/xum-vscode.vsix (vsce package).
vsix: ts-deps
	cd clients/vscode && $(NPM) run package

# The VS Code extension inside a real VS Code: code-server (Node 24) with the .vsix installed, driven
# by headless Chromium through playwright-core against a real xumd (tests/editors/run.sh; it gets
# Node 24, code-server and the .vsix itself, and skips saying why without npm, Chromium or the build
# tools; docs/DEVELOPING.md, "The extension in a real VS Code").
test-editors: install
	tests/editors/run.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@# unused code in the product (settings and why each allowed name is used: pyproject.toml, vulture_allow.py)
	$(BIN)/vulture
	@# the Neovim plugin and its scenarios (.luacheckrc); CI installs luacheck (Debian: lua-check)
	if command -v luacheck >/dev/null; then luacheck -q clients/nvim tests/nvim; else echo "luacheck not found: the Lua is not linted"; fi

typecheck: install
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

schema: install
	$(BIN)/python -m xum_protocol.schema protocol/schema
	$(BIN)/python -m xum_protocol.methods protocol/xum_protocol/method_names.py \
		--lua clients/nvim/lua/xum/methods.lua
	$(BIN)/python -m xum_protocol.docs docs/PROTOCOL.md
	@# The TypeScript client's types follow the schema (a test fails while they are stale); the
	@# generator needs only node, no packages.
	if command -v node >/dev/null; then cd clients/ts && node scripts/gen-types.mjs ../../protocol/schema/xum-protocol.schema.json src/generated/protocol.ts; else echo "node not found: run npm run gen in clients/ts"; fi

# The systemd units and launchd plist in systemd/ are rendered from xum_client/units.py.
units: install
	$(BIN)/python -m xum_client.units systemd

test-reliability: install
	$(BIN)/python -m pytest -q -m reliability -o addopts=""

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(MUTATE_VENV) .mypy_cache .ruff_cache .pytest_cache

# Mutation testing of the contract-critical modules (mutation/run.py; not part of CI). CPU heavy:
# scope it, e.g. make mutate MUTATE_ARGS="--module cleanup/fence.py --budget-s 900".
MUTATE_VENV := .venv-mutate
MUTATE_ARGS ?=

$(MUTATE_VENV)/.installed: mutation/requirements.lock
	test -x $(MUTATE_VENV)/bin/python || $(PYTHON) -m venv $(MUTATE_VENV)
	$(MUTATE_VENV)/bin/python -m pip install -q --disable-pip-version-check -r mutation/requirements.lock
	touch $@

mutate: install $(MUTATE_VENV)/.installed
	$(MUTATE_VENV)/bin/python mutation/run.py $(MUTATE_ARGS)

# A bounded sample of the reliability suite, for CI (a few minutes at most).
test-reliability-sample: install
	XUM_RELIABILITY_SAMPLE=1 $(BIN)/python -m pytest -q -m reliability -o addopts="" --timeout=600 || test $$? -eq 5
