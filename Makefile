# Two commands set everything up on a fresh machine (both create or reuse .venv):
#   make train   the main job: a real training run
#   make test    lint and types (make lint), then the whole test suite
#   make test-fast   lint, then the unit tests not marked compile, distributed, slow or ort_peer
# torch is pinned through constraints.txt so that a CPU-only machine takes the local
# torch 2.13.0 CPU wheel and never pulls CUDA packages.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS ?= test examples docs bench

.PHONY: train lint test test-fast docs bench fixtures ort-venv
unexport PYTHONDONTWRITEBYTECODE

# onnx2torch goes in without its declared dependencies: it declares torchvision, which this project
# never uses and which PyPI serves as a build that does not import beside a CPU torch
# ("operator torchvision::nms does not exist"). Its real needs (torch, onnx, numpy) are ours.
# A torchvision left by an older install that cannot be imported is removed.
# Nothing is byte-compiled at install: Python compiles each module the first time any process imports it and
# keeps the bytecode (a caller's PYTHONDONTWRITEBYTECODE is not passed to the recipes, or every process,
# each test's subprocesses included, would compile what it imports from source again).
$(STAMP): pyproject.toml constraints.txt tools/requirements.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -c constraints.txt torch
	$(PY) tools/requirements.py $(EXTRAS) > $(VENV)/requirements.txt
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -r $(VENV)/requirements.txt
	$(PY) -m pip install --quiet --no-compile --no-deps -e . $$($(PY) tools/requirements.py --onnx2torch)
	$(PY) -c "import torchvision" 2>/dev/null || $(PY) -m pip uninstall --quiet --yes torchvision 2>/dev/null || true
	touch $(STAMP)

train: $(STAMP)
	$(PY) examples/train_digits.py

# ruff and mypy come with the test extra; their settings are in pyproject.toml
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# two pytest workers (pytest-xdist): the suite is mostly single-threaded Python and subprocesses
test: lint
	$(PY) -m pytest -q -n 2 --durations=15

# tests/unit (every package) without the tests marked compile, distributed, slow or ort_peer, and the
# distributed package's single-process check
FAST_MARKERS := not compile and not distributed and not slow and not ort_peer
test-fast: lint
	$(PY) -m pytest -q -m "$(FAST_MARKERS)" tests/unit tests/integration/test_distributed.py

# the API reference (mkdocs + mkdocstrings) into site/; the test suite builds it too (tests/integration/test_docs.py)
docs: $(STAMP)
	$(PY) -m mkdocs build --strict

# make bench BENCH_ARGS="--compile"   (bench/README.md lists the options)
bench: $(STAMP)
	$(PY) bench/harness/run.py $(BENCH_ARGS)

# onnxruntime-training 1.19.2 in its own venv: regenerates tests/fixtures and joins the benchmarks.
ORT_VENV := .venv-ort
ort-venv:
	test -x $(ORT_VENV)/bin/python || $(PYTHON) -m venv $(ORT_VENV)
	$(ORT_VENV)/bin/pip install --quiet -c constraints.txt torch "numpy<2" onnx==1.16.2 onnxruntime-training-cpu==1.19.2

fixtures: ort-venv
	$(ORT_VENV)/bin/python tools/make_fixtures.py
