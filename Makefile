# The project's entry points; .ci/run calls them. `make test` does all the set-up on a fresh machine.
VENV := .venv
BIN := $(VENV)/bin
PYTHON := $(BIN)/python
LOCK := constraints/locked.txt

.PHONY: install install-test-deps install-newest lint typecheck test-unit test test-newest docs bench

# A virtualenv with the project and every development tool, at the versions of the lock (the locked stack of
# docs/compatibility.md). Nothing here needs root: it is all `make install && .venv/bin/warmup serve` needs.
install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml $(LOCK)
	python3 -m venv $(VENV)
	$(BIN)/pip install -q -c $(LOCK) -e '.[dev]'
	touch $@

# The system packages the tests need that pip cannot install (chromium, postgresql): tools/install-test-deps.sh
# installs the missing ones with apt-get, which needs root (or sudo).
install-test-deps:
	@bash tools/install-test-deps.sh || { \
	    echo "make: the tests need the system packages above; as root: bash tools/install-test-deps.sh" >&2; \
	    echo "make: (the service does not: make install && .venv/bin/warmup serve needs no root)" >&2; \
	    exit 1; }

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

# In process: no server, no subprocess, no compile.
test-unit: install
	$(PYTHON) -m pytest tests/unit

# The full suite, every tier, a module's tests that share a fixture in one worker (tests/conftest.py). The
# two-node cluster's module runs on its own, after the rest: its two SLURM nodes and torchrun launches get the
# machine's cores to themselves.
MULTI_NODE := tests/e2e/test_multi_node.py
test: install install-test-deps
	$(PYTHON) -m pytest -n auto --dist loadgroup --ignore=$(MULTI_NODE)
	$(PYTHON) -m pytest $(MULTI_NODE)

# The newest stack (docs/compatibility.md): a virtualenv of its own with the newest torch this machine has
# (constraints/newest.txt) and the newest transformers, accelerate, TRL and peft the registry serves within the
# extras' ranges; on it, the unit tier, the planner's truth tests against real TRL and the zero-compile proofs
# (SFT, DPO, GRPO, LoRA SFT, a job of several processes). Its record (versions, what passed) goes to
# $(NEWEST_VENV)/stack.json (tools/stack_record.py; `--write` puts it into warmup/data/stacks.json).
NEWEST_VENV ?= .venv-newest
NEWEST_TESTS := tests/unit tests/integration/planner tests/e2e/test_zero_compile.py \
    tests/e2e/test_zero_compile_jobs.py::test_lora_sft_with_gradient_checkpointing tests/e2e/test_multi_process.py \
    tests/e2e/test_trace_skip_fallback.py
install-newest: $(NEWEST_VENV)/.installed
$(NEWEST_VENV)/.installed: pyproject.toml constraints/newest.txt
	python3 -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/pip install -q -c constraints/newest.txt -e '.[dev]'
	touch $@

test-newest: install-newest install-test-deps
	$(NEWEST_VENV)/bin/python -m pytest -n auto --dist loadgroup --junitxml=$(NEWEST_VENV)/junit.xml $(NEWEST_TESTS) \
	    ; status=$$?; $(NEWEST_VENV)/bin/python tools/stack_record.py newest $(NEWEST_VENV)/junit.xml \
	    > $(NEWEST_VENV)/stack.json; exit $$status

# The docs site into site/; a warning (a broken link, a reference page out of step with the code) fails it.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The benchmarks, each printing its ratio measured side by side in one run: all of them, or one with
# `make bench BENCH=benchmarks/bench_plan.py`. The bench extra brings the `aws s3 sync` baseline.
BENCH ?= $(wildcard benchmarks/bench_*.py)
bench: install
	$(BIN)/pip install -q -c $(LOCK) -e '.[bench]'
	for script in $(BENCH); do echo "== $$script"; $(PYTHON) $$script || exit 1; done
