#!/usr/bin/env bash
# The checks that need a CUDA device, in one command for a lent GPU machine:
#
#     OUT=DIR bash bench/experiments/gpu_session.sh
#
# Installs this checkout (editable, without dependencies; wheels in .whl/ first, e.g. onnx2torch where the
# machine lacks it), then runs each stage under its own time limit in seconds (0 skips the stage):
#   1. a smoke run of gpu_step.py on a tiny GPT-2 with CUDA graphs (SMOKE_TIMEOUT): stops the session early
#      when the project cannot train on the device;
#   2. gpu_step.py: GPT-2 small in bf16, this project's one-graph step against the hand-written model under
#      the same torch.compile mode, with and without CUDA graphs (STEP_TIMEOUT; BATCHES, MODES);
#   3. every CUDA test, with the reference corpus from .carry/refcorpus when ../shared is absent (TEST_TIMEOUT);
#   4. the size sweep on CUDA in bf16 (SIZES, SWEEP_TIMEOUT; default skipped).
# Everything printed goes to $OUT/session.log, gpu_step.py's files to $OUT/step, the sweep's to $OUT/sweep.
set -u
OUT=${OUT:-/tmp/gpu-session}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1
started=$(date +%s)
stage() { echo "== $1 ($(( $(date +%s) - started )) s)"; }

stage environment
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
echo "$(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
$PY -c "import onnx2torch, ort_torch_train.adapters" || { echo "the project does not import"; exit 1; }
if [ -d .carry/refcorpus ] && [ ! -d ../shared/refcorpus ]; then mkdir -p ../shared && cp -r .carry/refcorpus ../shared/; fi

if [ "${SMOKE_TIMEOUT:-90}" != 0 ]; then
    stage "smoke: tiny GPT-2, CUDA graphs"
    timeout "${SMOKE_TIMEOUT:-90}" $PY bench/experiments/gpu_step.py --tiny --batches 2x64 --modes reduce-overhead \
        --warmup 2 --blocks 1 --steps 2 --out "$OUT/smoke" || { echo "smoke run failed"; exit 1; }
fi
if [ "${STEP_TIMEOUT:-360}" != 0 ]; then
    stage "GPT-2 small, bf16: ours against hand-written torch.compile"
    timeout "${STEP_TIMEOUT:-360}" $PY bench/experiments/gpu_step.py --batches ${BATCHES:-8x512 16x1024} \
        --modes ${MODES:-max-autotune max-autotune-no-cudagraphs} --out "$OUT/step"
fi
if [ "${TEST_TIMEOUT:-120}" != 0 ]; then
    stage "CUDA tests"
    workers=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout "${TEST_TIMEOUT:-120}" $PY -m pytest -q $workers -p no:cacheprovider -k cuda --durations 5 tests
fi
if [ "${SWEEP_TIMEOUT:-0}" != 0 ]; then
    stage "size sweep, bf16"
    timeout "$SWEEP_TIMEOUT" $PY bench/experiments/size_sweep.py --device cuda --sizes ${SIZES:-512 1024} --no-ort \
        --rounds 3 --steps 30 --warmup 10 --mixed-precision bf16 --out "$OUT/sweep" --cache /tmp/bench-cache
fi
stage done
