"""Float32 GEMM speed on this CPU: torch's BLAS (``torch.mm``), oneDNN (this project's ``onednn_linear``)
and ORT 1.19.2's MatMul (MLAS), at the sizes of the size sweep's linears and two tiny ones.

    .venv/bin/python bench/experiments/gemm_backends.py [--threads 2] [--calls 30]

ORT runs in its venv (``ORT_TRAINING_PYTHON`` or ``.venv-ort``; skipped when absent). Prints microseconds
per product and GFLOPS; the ratio decides ``onednn_linear.MIN_MACS`` (compiled graphs; eager calls use
``EAGER_MIN_MACS``, which also covers the autograd Function's Python).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[1] / "harness"
sys.path.insert(0, str(HARNESS))
SIZES = [
    (32, 32, 32),
    (32, 32, 64),
    (256, 128, 128),
    (256, 128, 512),
    (256, 512, 512),
    (256, 512, 2048),
    (256, 2048, 512),
]

_ORT_SCRIPT = """
import json, sys, time
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
threads, calls, sizes = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
out = {}
for m, k, n in sizes:
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
                              [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"a": np.random.randn(m, k).astype(np.float32), "b": np.random.randn(k, n).astype(np.float32)}
    for _ in range(5):
        session.run(None, feeds)
    start = time.perf_counter()
    for _ in range(calls):
        session.run(None, feeds)
    out[f"{m}x{k}x{n}"] = (time.perf_counter() - start) / calls
print(json.dumps(out))
"""


def _seconds(call, calls: int) -> float:
    for _ in range(5):
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    import torch
    from model_artifacts import ORT_PYTHON

    from ort_torch_train.api import set_threads
    from ort_torch_train.passes.onednn_linear import EAGER_MIN_MACS, MIN_MACS

    set_threads(args.threads)  # pinned: the library's default follows the load
    ort_times = {}
    if Path(ORT_PYTHON).exists():
        command = [str(ORT_PYTHON), "-c", _ORT_SCRIPT, str(args.threads), str(args.calls), json.dumps(SIZES)]
        answer = subprocess.run(command, capture_output=True, text=True, check=True)
        ort_times = json.loads(answer.stdout)
    print(
        f"{args.threads} thread(s); oneDNN is used from {MIN_MACS} multiply-accumulates in compiled graphs, "
        f"{EAGER_MIN_MACS} in eager ones"
    )
    print(f"{'m x k x n':>16} {'torch.mm':>16} {'oneDNN':>16} {'ORT MatMul':>16}")
    for m, k, n in SIZES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        weight = b.t()  # (n, k) as F.linear takes it, strided
        cells = []
        for call in (lambda: torch.mm(a, b), lambda: torch.ops.ort_torch_train.onednn_linear(a, weight, None)):
            seconds = _seconds(call, args.calls)
            cells.append(f"{seconds * 1e6:8.1f} us {2 * m * k * n / seconds / 1e9:4.0f} GF")
        seconds = ort_times.get(f"{m}x{k}x{n}")
        cells.append("-" if seconds is None else f"{seconds * 1e6:8.1f} us {2 * m * k * n / seconds / 1e9:4.0f} GF")
        print(f"{f'{m} x {k} x {n}':>16} " + " ".join(f"{cell:>16}" for cell in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
