# The project's entry points; .ci/run calls them. `make test` does all the set-up on a fresh machine.
VENV := .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python

.PHONY: install lint typecheck test-unit test docs bench

# A virtualenv with the project and every development tool; the system packages the tests need
# (tools/install-test-deps.sh, where it exists).
install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	if [ -f tools/install-test-deps.sh ]; then bash tools/install-test-deps.sh; fi
	touch $@

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

# In process: no server, no subprocess, no compile.
test-unit: install
	$(PYTHON) -m pytest tests/unit

# The full suite, every tier.
test: install
	$(PYTHON) -m pytest -n auto --dist loadgroup

# The docs site into site/; a warning (a broken link, a reference page out of step with the code) fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The benchmarks, each printing its ratio measured side by side in one run: all of them, or one with
# `make bench BENCH=benchmarks/bench_plan.py`. The bench extra brings the `aws s3 sync` baseline.
BENCH ?= $(wildcard benchmarks/bench_*.py)
bench: install
	$(BIN)/pip install -q -e '.[bench]'
	for script in $(BENCH); do echo "== $$script"; $(PYTHON) $$script || exit 1; done
