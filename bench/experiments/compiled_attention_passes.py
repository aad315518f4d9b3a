"""compile=True's step on the tinyformer with the package programs' attention passes added to its compiled graphs,
against the step as committed, in one process (issue 51, item 4).

    .venv/bin/python bench/experiments/compiled_attention_passes.py [--rounds 7] [--out bench/results/STAMP-NAME]

The package builder's post-grad passes (passes/attention_loops.py, passes/refined_reshapes.py) are not in
compile=True's inductor options (training/compile/settings.py); this experiment puts them there for one of two
modules, by replacing settings.small_products_pass while that module compiles, so that a later change can
weigh them. Both modules train the tinyformer fixture through ``module.step(optimizer, *inputs)`` on the same
batches (8 and 64 rows of its train data), one thread; blocks alternate between them, round after round.
Reported: each module's median block (microseconds per step), after / before, and, since both took the same
steps on the same batches, the largest difference of their parameters and of a last step's loss.
Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import ort_torch_train.training.compile.settings as settings
from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.passes.attention_loops import attention_loops_pass
from ort_torch_train.passes.onednn_linear import cpu_matmuls
from ort_torch_train.passes.refined_reshapes import refined_reshapes
from ort_torch_train.torch_internals import GraphPass, custom_graph_pass

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "fixtures" / "transformer" / "artifacts"
COMMITTED = settings.small_products_pass


def with_attention_passes(then: GraphPass | None = None, symbolic_contraction: bool = True) -> GraphPass:
    """settings.small_products_pass with the attention passes before its ``then`` (onednn_linear's)."""
    last = then if then is not None else cpu_matmuls()

    def apply(graph: torch.fx.Graph) -> None:
        refined_reshapes(graph)
        last(graph)

    tail = custom_graph_pass("RefinedThenMatmuls", apply, lambda: b"refined-reshapes:" + last.uuid())
    return COMMITTED(then=attention_loops_pass(then=tail), symbolic_contraction=symbolic_contraction)


def module_of(passes: bool) -> tuple[Module, Optimizer]:
    settings.small_products_pass = with_attention_passes if passes else COMMITTED  # type: ignore[assignment]
    state = CheckpointState.load_checkpoint(str(ARTIFACTS / "checkpoint"))
    module = Module(str(ARTIFACTS / "training_model.onnx"), state, str(ARTIFACTS / "eval_model.onnx"), compile=True)
    return module, Optimizer(str(ARTIFACTS / "optimizer_model.onnx"), module)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-compiled-attention-passes", time.gmtime())
    data = np.load(ROOT / "tests" / "fixtures" / "transformer" / "data.npz")
    keys = json.loads((ROOT / "tests" / "fixtures" / "transformer" / "expected.json").read_text())["data_keys"]["train"]

    def batch(rows: int) -> list[np.ndarray]:
        return [np.ascontiguousarray(data[key].reshape(-1, *data[key].shape[2:])[:rows]) for key in keys]

    sides = {}
    for name, passes in (("before", False), ("after", True)):
        module, optimizer = module_of(passes)
        for rows in (8, 64, 8, 64):  # compiles the static and the dynamic graphs
            module.step(optimizer, *batch(rows))
        sides[name] = (module, optimizer)
    settings.small_products_pass = COMMITTED  # type: ignore[assignment]
    load_start = os.getloadavg()[0]
    rows_out = []
    for rows in (8, 64):
        inputs, calls = batch(rows), 40 if rows == 8 else 10
        times: dict[str, list[float]] = {name: [] for name in sides}
        for round_index in range(args.rounds):
            for name in list(sides)[round_index % 2 :] + list(sides)[: round_index % 2]:
                module, optimizer = sides[name]
                start = time.perf_counter()
                for _ in range(calls):
                    module.step(optimizer, *inputs)
                times[name].append((time.perf_counter() - start) / calls * 1e6)
        before, after = statistics.median(times["before"]), statistics.median(times["after"])
        rows_out.append(
            {"batch": rows, "before_us": before, "after_us": after, "ratio": after / before, "blocks": times}
        )
    losses = {
        name: float(np.asarray(module.step(optimizer, *batch(8))).reshape(-1)[0])
        for name, (module, optimizer) in sides.items()
    }
    params = {name: module.contiguous_parameters(False).detach().numpy() for name, (module, _) in sides.items()}
    param_gap = float(np.abs(params["after"] - params["before"]).max())
    loss_gap = abs(losses["after"] - losses["before"]) / abs(losses["before"])
    load_end = os.getloadavg()[0]
    lines = [
        "# compile=True's step on the tinyformer with the package programs' attention passes",
        "",
        f"`.venv/bin/python bench/experiments/compiled_attention_passes.py --rounds {args.rounds}`; load average "
        f"{load_start:.1f} at the start, {load_end:.1f} at the end; medians of {args.rounds} alternating blocks of "
        "`module.step`, one thread, one process.",
        "",
        "| batch | committed | with the attention passes | after / before |",
        "|---:|---:|---:|---:|",
        *(f"| {r['batch']} | {r['before_us']:.1f} us | {r['after_us']:.1f} us | {r['ratio']:.2f}x |" for r in rows_out),
        "",
        f"After the same steps on the same batches: parameters within {param_gap:.1e}, a last step's loss within "
        f"{loss_gap:.1e} relative.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"load": [load_start, load_end], "rows": rows_out, "param_gap": param_gap, "loss_gap": loss_gap})
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
