# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU suite: one thread per process (two oversubscribe a 2-core machine). Without CUDA,
# tests/conftest.py runs Triton kernels through the interpreter (TRITON_INTERPRET=1).
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1

.PHONY: venv demo test test-slow lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned to the CPU wheel on local disk; an unpinned torch pulls a CUDA build.
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

demo: $(VENV)/.installed
	OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 $(PY) examples/quickstart.py

# The CI suite; `@pytest.mark.slow` tests (long fuzzing, a second server) run with test-slow.
# Two pytest-xdist workers (the CI machine's two cores; each test process is single-threaded),
# whole modules to a worker so module-scoped fixtures (servers, process groups) start once:
# 9:00 -> 5:24 on 2 cores. Session-scoped servers start once per worker that uses them.
test: $(VENV)/.installed
	$(TEST_ENV) $(PY) -m pytest -q -p no:cacheprovider -m "not slow" -n 2 --dist loadfile tests

# Its fuzzing draws new hypothesis examples each run (the CI suite draws the same ones).
test-slow: $(VENV)/.installed
	$(TEST_ENV) HYPOTHESIS_PROFILE=explore $(PY) -m pytest -q -p no:cacheprovider -m slow tests

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check lang runtime radix_cache constrained kernels tests examples
	$(VENV)/bin/ruff format --check lang runtime radix_cache constrained kernels tests examples

clean:
	rm -rf $(VENV) build dist *.egg-info
