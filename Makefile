# Two commands on a fresh machine with Python 3.11, pip and apt:
#   make run       set up .venv, run the fast default workflow (config/config.yaml: every figure in
#                  about 15 minutes on 2 cores) end to end and build its HTML report (results/report.html)
#   make run-full  the same with the whole study (config/full.yaml: about 75 minutes on 2 cores)
#   make test      set up .venv and run the quick test suite (everything but the tests marked slow,
#                  with one short end-to-end workflow run)
#   make test-all  every test: also the long end-to-end runs (the test grid's workflow, Slurm where
#                  a cluster is up, Horovod where .venv-horovod exists) and the whole MPI matrix (CI)
#   make test-notf set up .venv-notf (enspipe with torch and JAX, no TensorFlow) and run the tests of
#                  enspipe without TensorFlow there (CI runs it after test-all)
# and one to rerun a single cell of the default grid by its name (see `snakemake -n`):
#   make cell CELL=alexnet_v2/all_shared/n2_p2/c1/emulated/rep0
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CORES  ?= 2

.PHONY: run run-full test test-all test-notf test-stress bench cell clean-results horovod test-horovod

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tf,workflow,test]'
	touch $@

CONFIG ?=
run: $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --cores $(CORES) $(CONFIG)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --report results/report.html $(CONFIG)
	$(BIN)/enspipe summarize --results results

run-full:
	$(MAKE) run CONFIG="--configfile config/full.yaml"

cell: $(STAMP)
	@test -n "$(CELL)" || { echo "make cell CELL=network/scheme/nN_pP/cC/consumer/repR"; exit 2; }
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/snakemake --cores $(CORES) -f results/runs/$(CELL)/summary.json

# WORKERS pytest processes side by side (pytest-xdist), each taking whole files (a file's shared jobs
# run once); the tests wait on processes, Slurm and emulated accelerators about a third of the time
WORKERS ?= 2
# then the tests marked alone, with nothing beside them (they check what enspipe frees machine-wide)
test: $(STAMP)
	$(BIN)/pytest -m "not slow and not alone" -n $(WORKERS) --dist loadfile; a=$$?; \
	$(BIN)/pytest -m "not slow and alone"; exit $$(( a | $$? ))

# The Horovod transport's tests run where .venv-horovod was built (`make horovod`; CI builds it);
# in .venv they skip, saying why.
test-all: $(STAMP)
	$(BIN)/pytest -m "not alone" -n $(WORKERS) --dist loadfile; a=$$?; $(BIN)/pytest -m alone; exit $$(( a | $$? ))
	if [ -x .venv-horovod/bin/pytest ]; then .venv-horovod/bin/pytest tests/test_horovod.py; fi

# The tests marked mpi, slow or timing, 10 times each under 2 busy loops (CI's loaded 2 cores), run
# as CI runs them (WORKERS xdist workers), with a table of each one that failed (docs/testing.md):
# `make test-stress STRESS="--repeats 10 tests/test_serve.py -m ''"` for one file
STRESS ?= -n $(WORKERS) --dist loadfile
test-stress: $(STAMP)
	$(BIN)/python tests/stress.py $(STRESS)

bench: $(STAMP)
	$(BIN)/python benchmarks/preprocessing.py

# The optional Horovod transport: build .venv-horovod (TensorFlow 2.15 + Horovod 0.28.1; reused
# when present) and run the tests that use it.
horovod:
	bash .ci/horovod-venv

# Without TensorFlow: .venv-notf (enspipe with its torch and jax extras; no TensorFlow) runs the
# pillow backend's and its engine's, the torch and JAX handoff's, the attach server's and the examples' tests. CI runs it after
# test-all.
test-notf:
	bash .ci/notf-venv
	.venv-notf/bin/pytest -m "not workflow" -n $(WORKERS) --dist loadfile tests/test_backend.py tests/test_frameworks.py tests/test_keys.py \
	  tests/test_serve.py tests/test_serve_schedule.py tests/test_serve_mesh.py tests/test_gpu_benchmarks.py tests/test_engine.py \
	  tests/test_torch_transport.py tests/test_transforms.py tests/test_gpu_backend.py tests/test_epochs.py \
	  tests/test_pixel_kernels.py tests/test_region_decode.py
	.venv-notf/bin/pytest tests/test_decode_cache.py -k "not tf and not cached_pixels and not users_preprocess"

test-horovod: horovod
	.venv-horovod/bin/pytest -v tests/test_horovod.py

clean-results:
	rm -rf results/runs results/dataset results/calibration results/idle results/tables results/logs \
	  results/figures results/report.html
