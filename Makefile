# `make run` and `make test` are the contract with a new user: each sets up .venv on first
# use (and again only when pyproject.toml changes), then runs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The peers the benchmarks compare against live in an environment of their own: they are
# not project dependencies.
BENCH_VENV := .venv-bench
# Renamed when the list below grows, so an older .venv-bench is topped up.
BENCH_STAMP := $(BENCH_VENV)/.installed-with-matplotlib
# The real applications of the application-beside-smoosh harness (bench/apps/, issue 46): Django
# and SQLAlchemy as shipped, in an environment of their own (the application's process, never
# smoosh's). The minor versions are pinned so that sittings on different days compare.
APPS_VENV := .venv-apps
APPS_REQUIREMENTS := bench/apps/requirements.txt
APPS_STAMP := $(APPS_VENV)/.installed

.PHONY: run test test-under-load soak bench bench-apps apps-env docs screenshots clean install

install: $(STAMP)

$(STAMP): pyproject.toml smoosh/compactors/_openguard.c
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	@echo "setting up $(VENV) (first run, or pyproject.toml changed)"
	@# Until 0.1 the distribution was called "smoosh": an old install of it owns the same
	@# command and packages, so it goes first.
	@$(BIN)/python -m pip uninstall -q -y --disable-pip-version-check smoosh >/dev/null 2>&1 || true
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]' >$(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; echo "pip install failed; log above"; exit 1; }
	@touch $(STAMP)

run: $(STAMP)
	@mkdir -p var/databases var/smoosh
	$(BIN)/smoosh run --config conf/smoosh.ini

# Types first (seconds), then the layering (lint-imports: pyproject.toml's contracts), then the
# suite on two processes. No -x: a run that fails names every test that failed, not the first
# one or two that two processes happened to meet.
test: $(STAMP)
	$(BIN)/python -m mypy
	$(BIN)/lint-imports --no-logo
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 2

# The documentation site (docs/: Sphinx with MyST Markdown) into build/docs/, warnings as errors,
# read fresh (-E) so the reference pages follow the code. `make test` builds it the same way
# (tests/docs/test_docs_build.py).
docs: $(STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -q -b html docs build/docs
	@echo "built build/docs/index.html"

# The operators' page's screenshots in the docs (docs/images/page-*.png), taken by its browser
# tests (tests/browser: Debian's chromium and chromium-driver).
screenshots: $(STAMP)
	SMOOSH_SCREENSHOTS=docs/images $(BIN)/python -m pytest -q -p no:cacheprovider tests/browser

# `make test` LOAD_RUNS times in a row while other processes load the disk (a loop of writes,
# each followed by fsync, in the tests' temporary directory) and one core (issue 30); the
# loaders stop whatever happens. On this project's 2-core VM (virtio disk, fsync about 0.5 ms)
# 4 KiB writes leave one SQLite commit at about 3 ms and 1 MiB writes at 5-10 ms; 4 MiB writes
# bring it to about 20 ms, the slow disk of the issue (18 ms). The script prints what a commit
# cost before and after each run; LOAD_WRITE_BYTES=4096 is the gentler load.
LOAD_RUNS ?= 3
LOAD_DISK_PROCS ?= 1
LOAD_WRITE_BYTES ?= 4194304
LOAD_CPU_PROCS ?= 1
test-under-load: $(STAMP)
	$(BIN)/python tests/load/run_under_load.py --runs $(LOAD_RUNS) --disk-procs $(LOAD_DISK_PROCS) \
		--write-bytes $(LOAD_WRITE_BYTES) --cpu-procs $(LOAD_CPU_PROCS) -- $(MAKE) --no-print-directory test

soak: $(STAMP)
	SMOOSH_SOAK=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m slow

$(BENCH_STAMP):
	@test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	@echo "setting up $(BENCH_VENV) (the peers: huey, persist-queue; matplotlib for the benchmarks page's plots)"
	@$(BENCH_VENV)/bin/python -m pip install -q --disable-pip-version-check huey persist-queue msgpack matplotlib
	@touch $(BENCH_STAMP)

# A few minutes; rewrites bench/RESULTS.md (each benchmark its table, then the budgets at a glance)
# and the plots of the docs' benchmarks page (docs/images/bench-*.png). Never part of `make test`.
bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python -m bench.all

$(APPS_STAMP): $(APPS_REQUIREMENTS)
	@test -x $(APPS_VENV)/bin/python || $(PY) -m venv $(APPS_VENV)
	@echo "setting up $(APPS_VENV) (the applications: $$(grep -v '^#' $(APPS_REQUIREMENTS) | tr '\n' ' '))"
	@$(APPS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r $(APPS_REQUIREMENTS)
	@touch $(APPS_STAMP)

apps-env: $(APPS_STAMP)

# The application beside smoosh (bench/apps/, docs/guides/the-application-beside-smoosh.md):
# Django and SQLAlchemy at their defaults on a bloated tenant fleet, runs with and without
# smoosh alternated in one sitting. Never part of `make test` or `make bench`: two to three hours
# as given, `APPS_ARGS="--quick --modes none,compact"` for about ten minutes.
APPS_ARGS ?=
bench-apps: $(STAMP) $(APPS_STAMP)
	$(BIN)/python -m bench.apps $(APPS_ARGS)

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(APPS_VENV) build *.egg-info var
