#!/bin/bash
# The GPU machine's measurements in one command (docs/results-gpu.md has the tables), on a
# PyTorch-only node with no package registry: Python 3.12 with torch, torchvision, OpenCV, Pillow,
# numpy, psutil and nvidia-ml-py; no TensorFlow. Carry the wheels it lacks in .whl/ (docs/library.md):
#
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
#     -d .whl mpich==5.0.2 mpi4py==4.1.2 google-crc32c jsonschema jsonschema-specifications referencing rpds-py \
#     pytest pluggy iniconfig tensorsocket pyzmq tornado
#   WHEELS=.whl OUT=results/gpu PARTS="checks feed" bash benchmarks/gpu.sh    # on the GPU node, in the repository's root
#
# PARTS (default: all of them) picks the parts, in this order: checks (the GPU-only tests), feed
# (benchmarks/feed.py: members fed seven ways on the one GPU), rates, scaling, cells. One command
# may run 10 minutes: "checks feed" fit one.
#
# They go into the node's own Python environment (its MPICH's mpiexec beside its python3), and
# enspipe runs from src/. Each part has its own time limit, so a part that fails or overruns
# leaves the others' results. Writes $OUT/feed.json, $OUT/gpu_rates.json, $OUT/scaling.json (one member's pillow
# engine, cell, stream and server at 1, 2, 4, ... cores), $OUT/gpu_cells.json, the NVML and
# nvidia-smi logs and every cell's summary (summaries.tar.gz); the log goes to stdout.
set -u
OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT"
PY=$(command -v python3)
if [ -n "${WHEELS:-}" ]; then  # the carried wheels, into this Python's environment (a bare node's own)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --force-reinstall "$WHEELS"/*.whl || exit 1
fi
export PATH="$(dirname "$PY"):$PATH" PYTHONPATH="$PWD/src:$PWD/benchmarks" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv 2>&1
echo "cpus: $(nproc); $(grep -m1 "model name" /proc/cpuinfo); RAPL: $(ls /sys/class/powercap 2>&1 | tr "\n" " ")"
# rank 0 says for both (two ranks printing at once interleave their words on the one stdout)
mpiexec -n 2 "$PY" -c "from mpi4py import MPI; c = MPI.COMM_WORLD; r = c.gather(c.rank); c.rank or print('mpi ranks', r, 'of', c.size, MPI.Get_library_version().split(chr(10))[0])" || exit 1
"$PY" -c "import enspipe, torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" || exit 1

PARTS=" ${PARTS:-checks feed rates scaling cells} "
part() { [[ "$PARTS" == *" $1 "* ]] && START=$SECONDS; }
took() { echo "$((SECONDS - START)) s"; }

if part checks; then  # what CI skips without CUDA: nvJPEG and the gpu backend's values, the CUDA IPC ring and pool
  timeout "${CHECKS_SECONDS:-150}" "$PY" -m pytest -q -p no:cacheprovider -o addopts= -rs tests/test_gpu_backend.py \
    tests/test_torch_transport.py -k "nvjpeg or engine_on_the_gpu or cuda_ipc"
  echo "gpu_checks: exit $? in $(took)"
fi
if part feed; then
  timeout "${FEED_SECONDS:-420}" "$PY" benchmarks/feed.py --out "$OUT" --budget 330 ${FEED_ARGS:-}
  echo "feed: exit $? in $(took)"
fi
if part rates; then
  timeout "${RATES_SECONDS:-240}" "$PY" benchmarks/gpu_rates.py --out "$OUT/gpu_rates.json" \
    --steps 20 --warmup 5 --repeats 2 --seconds 1.5 ${RATES_ARGS:-}
  echo "gpu_rates: exit $? in $(took)"
fi
if part scaling; then
  timeout "${SCALING_SECONDS:-300}" "$PY" benchmarks/scaling.py --paths engine,cell,stream,serve --backends pillow \
    --preprocess inception --repeats 1 --images-per-core 1024 --json "$OUT/scaling.json" ${SCALING_ARGS:-}
  echo "scaling: exit $? in $(took)"
fi
if part cells; then
  CELLS_OUT=${CELLS_OUT:-/tmp/gpu-cells}  # the cells' folders; what comes back is copied to $OUT
  timeout "${CELLS_SECONDS:-330}" "$PY" benchmarks/gpu_cells.py --out "$CELLS_OUT" --images 512 \
    --steps 30 --warmup 3 --repeats 2 ${CELLS_ARGS:-}
  echo "gpu_cells: exit $? in $(took)"
  for f in gpu_cells.json nvml_samples.csv nvidia_smi.csv enspipe_nvml_samples.json summaries.tar.gz; do
    if [ -f "$CELLS_OUT/$f" ]; then cp "$CELLS_OUT/$f" "$OUT/"; fi
  done
fi
ls -la "$OUT"
