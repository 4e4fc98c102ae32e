# `make demo` and `make test` do all set-up themselves on a fresh Debian machine:
# a virtualenv in .venv, the pinned packages, and Debian's Fashion-MNIST when it is missing.
# Any python3 from 3.9 to 3.13 (docs/install.md); another: make PYTHON=python3.13 ...
PYTHON ?= python3
VENV ?= .venv
REQUIREMENTS ?= requirements.txt
# MXNet, installed without its dependencies: its metadata asks for numpy<2 (requirements.txt).
MXNET ?= mxnet==1.9.1
PY := $(VENV)/bin/python

DEMO_ARGS ?= --num-gpus 2 --epochs 2 --batch-size 32 --lr 0.025 --train-limit 3000 --test-limit 1000 --seed 0

.PHONY: demo test test-slow lab-test test-all install data clean gpu-install gpu-demo gpu-test \
	horovod-install notebooks

demo: install data
	$(PY) -m gluon_mgpu.train $(DEMO_ARGS)

# Three targets (docs/testing.md): `make test`, the fast suite to run after every change, and
# `make test-slow`, what trains for long or starts real Horovod jobs, share tests/ by marker;
# `make lab-test` runs the tests of lab/ (the studies: the book table, the speed per CPU class),
# in lab/tests/. CI runs all three (.ci/run).
PYTEST := $(PY) -m pytest -v --durations=10

# Two pytest workers, a test file each (pytest-xdist): most of the fast suite is interpreters
# that start and import MXNet one thread at a time (864 s alone, 641 s so on a 2-core Zen 3).
test: install data
	$(PYTEST) -n 2 --dist loadfile -m 'not slow' tests

test-slow: install data horovod-install
	$(PYTEST) -m slow tests

lab-test: install data
	$(PYTEST) lab/tests

test-all: test test-slow lab-test

# The notebooks executed from a fresh kernel, outputs kept (docs/notebooks.md): at the book's
# settings, hours; stopped, the same command goes on after the last saved epoch.
notebooks: install data
	$(PY) tools/execute_notebooks.py $(NOTEBOOKS_ARGS)

# One stamp per requirements file: switching files reinstalls (use another VENV for the GPU
# build: mxnet and mxnet-cu112 are the same module and must not share an environment).
STAMP := $(VENV)/.installed-$(notdir $(REQUIREMENTS))

install: $(STAMP)

$(STAMP): $(REQUIREMENTS) setup.py
	@$(PYTHON) -c 'import platform, sys; v = sys.version_info[:2]; m = platform.machine(); sys.exit( \
	  "make: error: $(PYTHON) is Python %d.%d: gluon_mgpu runs on Python 3.9 to 3.13 (3.11 and 3.13 tested); run make PYTHON=python3.13 ... (docs/install.md)" % v \
	  if not (3, 9) <= v <= (3, 13) else "make: error: this machine is %s: mxnet 1.9.1 has wheels only for x86_64; use an x86_64 machine (docs/install.md)" % m \
	  if m != "x86_64" else None)' || exit 2
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || { \
	  V=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  echo "$(PYTHON) cannot create a virtualenv: installing Debian's package python$$V-venv"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y python$$V-venv; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip  # an older Python's own pip backtracks for minutes
	$(PY) -m pip install -r $(REQUIREMENTS) -e .
	$(PY) -m pip install --no-deps $(MXNET)
	$(PY) gluon_mgpu/runtime/gpu_build.py install-hook
	touch $@

data: install
	@$(PY) -c 'import gluon_mgpu; gluon_mgpu.find_data_dir()' 2>/dev/null || { \
	  echo "Fashion-MNIST not found: installing Debian's package dataset-fashion-mnist"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update && $$SUDO apt-get install -y dataset-fashion-mnist; }
	@$(PY) -c 'import gluon_mgpu; print("Fashion-MNIST:", gluon_mgpu.find_data_dir())'

# Horovod (docs/distributed.md), the second engine of --kvstore: built from its source against
# the mxnet wheel, CPU-only, with Gloo and without MPI (pip keeps the built wheel, so later
# installs take seconds). It needs cmake and a C++ compiler: from Debian when they are missing.
HOROVOD ?= horovod==0.28.1
HOROVOD_STAMP := $(VENV)/.installed-horovod

horovod-install: $(HOROVOD_STAMP)

$(HOROVOD_STAMP): $(STAMP)
	@missing=; for tool in cmake g++ make; do command -v $$tool >/dev/null || missing="$$missing $$tool"; done; \
	if [ -n "$$missing" ]; then \
	  echo "building Horovod needs$$missing: installing Debian's packages cmake g++ make"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  { $$SUDO apt-get update && $$SUDO apt-get install -y cmake g++ make; } || { \
	    echo "make horovod-install: error: Horovod cannot be built without$$missing; install them (apt-get install -y cmake g++ make) and run make horovod-install again"; exit 2; }; fi
	$(PY) -m pip install wheel
	HOROVOD_WITH_MXNET=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
	  HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	  $(PY) -m pip install --no-build-isolation $(HOROVOD)
	touch $@

# The GPU set-up (docs/gpu.md): mxnet-cu112 and NVIDIA's CUDA libraries from PyPI in their own
# environment; the machine needs only the NVIDIA driver. The .pth file that install writes makes
# any `import mxnet` in .venv-gpu find those libraries (gluon_mgpu/runtime/gpu_build.py).
GPU_VENV ?= .venv-gpu
GPU_PY := $(GPU_VENV)/bin/python
GPU_MAKE := $(MAKE) --no-print-directory VENV=$(GPU_VENV) REQUIREMENTS=requirements-gpu.txt \
	MXNET=mxnet-cu112==1.9.1

gpu-install:
	$(GPU_MAKE) install
	@echo '*' > $(GPU_VENV)/.gitignore

# The environment report first: without a driver it is the one line that says so (exit 2).
gpu-demo: gpu-install
	$(GPU_PY) -m gluon_mgpu.env
	$(GPU_MAKE) demo

# The GPU build's checks on any machine, GPU or not (tests_gpu/): pytest runs in the CPU
# environment, which the checks compare against, and starts the GPU environment's Python.
gpu-test: install data gpu-install
	GLUON_MGPU_GPU_PYTHON=$(abspath $(GPU_PY)) $(PY) -m pytest -v --durations=5 tests_gpu

clean:
	rm -rf $(VENV) $(GPU_VENV) *.egg-info .pytest_cache
