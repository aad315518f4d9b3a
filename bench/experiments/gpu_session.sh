#!/usr/bin/env bash
# The checks that need a CUDA device, in one command for a lent GPU machine:
#
#     OUT=DIR bash bench/experiments/gpu_session.sh
#
# Installs this checkout (editable, without dependencies; wheels in .whl/ first, e.g. onnx2torch where the
# machine lacks it), then, each stage under its own time limit in seconds (0 skips the stage):
#   1. the size sweep on CUDA in bf16, where attention can run as flash attention (SIZES, BF16_TIMEOUT);
#   2. every CUDA test, with the reference corpus from .carry/refcorpus when ../shared is absent (TEST_TIMEOUT);
#   3. the size sweep in float32 (FP32_SIZES, FP32_TIMEOUT).
# STEPS sets the timed steps per round. Everything printed goes to $OUT/session.log, the sweeps' files
# to $OUT/bf16 and $OUT/fp32, the benchmark workers' logs to $OUT/worker_logs.tgz.
#
# As run on a lent H100 (docs/performance.md, "H100"), with .whl holding onnx2torch's wheel:
#     SIZES="512 1024" STEPS=50 TEST_TIMEOUT=0 FP32_TIMEOUT=0 bash bench/experiments/gpu_session.sh
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
echo "$(nproc) cores"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
$PY -c "import onnx2torch, ort_torch_train.adapters" || { echo "the project does not import"; exit 1; }
if [ -d .carry/refcorpus ] && [ ! -d ../shared/refcorpus ]; then mkdir -p ../shared && cp -r .carry/refcorpus ../shared/; fi

sweep() {  # precision sizes time-limit
    [ "$3" = 0 ] && return
    stage "size sweep, $1, hidden $2"
    local option=""
    [ "$1" = bf16 ] && option="--mixed-precision bf16"
    timeout "$3" $PY bench/experiments/size_sweep.py --device cuda --sizes $2 --no-ort --rounds 3 --steps ${STEPS:-30} --warmup 10 \
        $option --out "$OUT/$1" --cache /tmp/bench-cache
}

sweep bf16 "${SIZES:-512 1024}" "${BF16_TIMEOUT:-200}"
if [ "${TEST_TIMEOUT:-150}" != 0 ]; then
    stage "CUDA tests"
    workers=$($PY -c "import xdist" 2>/dev/null && echo "-n 8")
    timeout "${TEST_TIMEOUT:-150}" $PY -m pytest -q $workers -p no:cacheprovider -k cuda --durations 5 tests
fi
sweep fp32 "${FP32_SIZES:-512}" "${FP32_TIMEOUT:-120}"
stage "CUDA graph skips in the benchmark workers"
grep -h "skipping cudagraphs" /tmp/bench-cache/logs/*.log | sort | uniq -c
tar -czf "$OUT/worker_logs.tgz" -C /tmp/bench-cache logs 2>/dev/null
stage done
