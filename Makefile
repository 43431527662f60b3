# rlparity: `make run` (the main job) and `make test` (all tests) on a fresh machine.
# Uses the active python3 when it can import torch; otherwise creates .venv from
# requirements-cpu.txt (the CPU pin, torch 2.13.0, and the dev tools).

SHELL := /bin/bash
PYTHON_SYS ?= python3
HAVE_TORCH := $(shell $(PYTHON_SYS) -c 'import torch' >/dev/null 2>&1 && echo yes)
# An activated .venv is the .venv: the same interpreter path, so the same build stamp (nothing rebuilds).
IN_VENV := $(shell $(PYTHON_SYS) -c 'import sys; print(sys.prefix)' 2>/dev/null)
ifeq ($(IN_VENV),$(CURDIR)/.venv)
  PY := .venv/bin/python
  ENV_STAMP := .venv/.stamp
else ifeq ($(HAVE_TORCH),yes)
  PY := $(PYTHON_SYS)
  ENV_STAMP :=
else
  PY := .venv/bin/python
  ENV_STAMP := .venv/.stamp
endif

SOURCES := $(wildcard kernels/rl_kernel/*/*/*.h kernels/rl_kernel/*/*/*.cuh kernels/rl_kernel/*/*/*.cpp kernels/rl_kernel/*/*/*.cu) \
  kernels/rl_kernel/build_flags.py setup.py pyproject.toml
BUILD_STAMP := build/.rl_kernel-$(notdir $(PY)).stamp
JOBS ?= auto

.PHONY: all build run test test-hf-lowest test-fast lint kernels-check selfcheck golden selftest bench device-wheels print-python clean

all: test

.venv/.stamp: requirements-cpu.txt
	$(PYTHON_SYS) -m venv .venv
	.venv/bin/python -m pip install -q --upgrade pip
	.venv/bin/python -m pip install -q -r requirements-cpu.txt
	touch $@

# Builds rl_kernel._C in place: the CPU reference always, CUDA/HIP when torch has them.
$(BUILD_STAMP): $(ENV_STAMP) $(SOURCES)
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q --no-build-isolation --no-deps -e .
	@mkdir -p build && touch $@

build: $(BUILD_STAMP)

MATRIX ?= quick
RUN_JOBS ?= 2
RUN_OUT ?= results

# The main job: the quick matrix of bitwise cells on this machine (local backend), a table, the gate's exit code.
run: build
	$(PY) -m rlparity.cli run --matrix $(MATRIX) --jobs $(RUN_JOBS) --out $(RUN_OUT)

# The kernels' own bitwise self-check (CPU vs GPU bits) on this machine's devices; FAMILY=decoder
# (or softmax) checks one operator family.
FAMILY ?=
selfcheck: build
	$(PY) -m rl_kernel.contract.selfcheck $(if $(FAMILY),--family $(FAMILY))

# Checks every committed golden digest (the kernels' per family, the harness workloads') against this
# build. The only writer is `rlparity golden --update`, run by hand after an intended contract change.
golden: build
	$(PY) -m rlparity.cli golden

# The harness's negative controls: every deliberately wrong kernel must be caught.
selftest: build
	$(PY) -m rlparity.cli selftest

# One benchmark of bench/ (`make bench` alone lists them): make bench BENCH=row ARGS="--quick --json row.json".
BENCH ?= --list
bench: build
	$(PY) -m bench $(BENCH) $(ARGS)

# The wheels a GPU machine without network gets in `.whl/` (bench/gpu_round.sh installs them there): Python 3.12,
# manylinux, no dependencies (bench/device-wheels.txt names every one).
WHEEL_PLATFORMS := $(foreach p,manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any,--platform $(p))
device-wheels:
	$(PYTHON_SYS) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(WHEEL_PLATFORMS) -d .whl -r bench/device-wheels.txt

# The lowest transformers the Hugging Face patch supports (the highest is requirements.txt's, in the venv),
# with the hub and tokenizers it needs, in a folder that shadows them for tests/integrations only. kernels too:
# transformers >= 5.25 requires kernels 0.19, whose LayerRepository 5.0.0 calls without the now required revision.
HF_LOWEST := "transformers==5.0.0" "huggingface-hub==1.33.0" "tokenizers==0.22.2" "kernels==0.12.3" httpx httpcore h11 \
  anyio typer-slim
build/hf-lowest/.stamp: | $(BUILD_STAMP)
	$(PY) -m pip install -q --no-compile --no-deps --target build/hf-lowest $(HF_LOWEST)
	touch $@

# TRL's GRPOTrainer adapter is tested at both ends of its range (requirements-trl.txt), each TRL in a folder of its
# own with the packages it needs that the venv lacks (--no-deps: a plain install would pull a CUDA torch). These
# folders and build/hf-lowest are not byte compiled up front (--no-compile: the three installs took 22 s of a fresh
# clone's `make test` on 2 cores, 17 of them compiling modules the tests mostly never import; those compile on use).
TRL_RANGE := 1.10.0 1.16.0
TRL_DEPS := accelerate==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1 \
  python-dateutil==4.0.0 tzdata==2026.6 psutil==7.2.2 xxhash==4.1.0
build/trl-%/.stamp: | $(BUILD_STAMP)
	$(PY) -m pip install -q --no-compile --no-deps --target build/trl-$* "trl==$*" $(TRL_DEPS)
	touch $@
TRL_TESTS := tests/integrations/test_trl.py tests/harness/test_engines.py::test_trls_grpo_trainer_as_cells

# All tests, then the Hugging Face integration again at the lowest supported transformers (its workers fill the
# cores), then TRL's adapter at each end of its range side by side (make -j: one process each; -O: each pass's output
# whole when it ends; RLPARITY_REQUIRE_TRL: a TRL that does not import fails instead of skipping). All three side by
# side took 1 min 38 s on 2 cores, one after the other as here 1 min 30 s (2026-12-07).
TRL_PASSES := $(TRL_RANGE:%=test-trl-%)
PASSES := test-hf-lowest $(TRL_PASSES)
# One intra-op thread per test process (unless the caller sets it): pytest-xdist already runs a worker per core, and
# torch's default of a thread per core in every worker oversubscribes them (6-10% of the wall time of a sample of tests).
test test-fast $(PASSES): export OMP_NUM_THREADS ?= 1
# Byte code written as modules are first imported: under PYTHONDONTWRITEBYTECODE (set in some images, this machine's
# among them) each of the ~400 Python processes a `make test` starts compiled the repository's modules, and pytest
# rewrote its test modules, all over again (a cell: 330 modules, a tenth of its start).
run test test-fast $(PASSES): export PYTHONDONTWRITEBYTECODE =
test: build build/hf-lowest/.stamp $(TRL_RANGE:%=build/trl-%/.stamp)
	$(PY) -m pytest -n $(JOBS) --maxschedchunk 1 --durations=25 tests
	@$(MAKE) --no-print-directory test-hf-lowest
	@$(MAKE) --no-print-directory -j $(words $(TRL_PASSES)) -O $(TRL_PASSES)

test-hf-lowest: build build/hf-lowest/.stamp
	PYTHONPATH=build/hf-lowest $(PY) -m pytest -n $(JOBS) --maxschedchunk 1 -p no:cacheprovider tests/integrations

test-trl-%: build build/trl-%/.stamp
	RLPARITY_REQUIRE_TRL=1 PYTHONPATH=$(CURDIR)/build/trl-$* $(PY) -m pytest -p no:cacheprovider $(TRL_TESTS)

# The developer's loop (under 2 minutes on 2 cores): the first fast case of every test function (the `loop` marker,
# tests/conftest.py), so each family and harness module is tried once; `make test` runs every case.
test-fast: build
	$(PY) -m pytest -n $(JOBS) --maxschedchunk 1 -m loop tests

lint: build
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -c 'import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())' --no-cache

# Static proof for GPU targets we cannot run (clang 19 for AMD, nvcc for NVIDIA).
kernels-check: $(ENV_STAMP)
	$(PY) kernels/check/kernels_check.py

# The interpreter the targets use (.ci/run asks, to run rlparity's own commands with it).
print-python:
	@echo $(PY)

clean:
	rm -rf build kernels/rl_kernel/_C*.so *.egg-info .pytest_cache
