# One-command set-up: `make demo` (creates .venv, installs, runs the CPU quickstart) and `make test`.
PY ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
CONSTRAINTS := $(VENV)/constraints.txt
BASE_STAMP := $(VENV)/.installed-base
STAMP := $(VENV)/.installed

.PHONY: setup demo demo-data test lint bench-data clean

setup: $(STAMP)

# Torch goes first and is pinned through a constraints file, so that no later install pulls a CUDA build
# onto a CPU machine. Where `nvidia-smi` sees a GPU, the default (CUDA) build is installed instead.
# The demo needs the package alone; the test suite adds the extras (pretrained models, curation, Kubernetes,
# FP8, dev tools), so a first `make demo` does not wait for what it does not use.
$(BASE_STAMP): pyproject.toml setup.py
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
	  $(PIP) install -q "torch>=2.11"; \
	else \
	  $(PIP) install -q torch==2.13.0; \
	fi
	$(VPY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(CONSTRAINTS)
	$(PIP) install -q -c $(CONSTRAINTS) -e .
	touch $(BASE_STAMP)

$(STAMP): $(BASE_STAMP)
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[dev,pretrained,curation,k8s,fp8]"
	touch $(STAMP)

demo: $(BASE_STAMP)
	$(VPY) launchers/demo.py --out demo_output

# -p no:cacheprovider keeps a fresh clone clean; exit code 5 (no tests collected) is a failure.
# One OpenMP thread per process: the suite spawns gloo process groups, and oversubscribed OpenMP threads
# on 2 cores slow CPU tests down by an order of magnitude.
# TEST_WORKERS pytest-xdist processes share the test files (a file's tests stay on one worker, in order, so
# its module fixtures are built once); TEST_WORKERS=0 runs them all in this process. Tests marked `timing`
# assert on wall-clock throughput: they run afterwards, alone (a busy second worker would fail them).
TEST_WORKERS ?= 2
PYTEST := OMP_NUM_THREADS=1 $(VPY) -m pytest -q -x -p no:cacheprovider
test: setup
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile --durations=15 -m "not gpu and not timing" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc; \
	$(PYTEST) --durations=5 -m "timing and not gpu" tests

lint: setup
	$(VENV)/bin/ruff check nemo_vfm recipes launchers tests bench

# raw synthetic clips -> vfm prepare -> Energon (3:1 blend) -> packed training (CPU)
demo-data: setup
	$(VPY) launchers/demo_data.py --out demo_output/data --steps 100

# CPU benchmark of the data loader and packing efficiency (GPU benchmarks: see docs/benchmarks.md)
bench-data: setup
	$(VPY) bench/data_loader.py --out bench/results/data_loader_cpu.json

clean:
	rm -rf demo_output experiments .pytest_cache
