"""compile=True's tinyformer step, whose CPU graphs take the attention passes, against the eager step: 50 steps
on batches of 8, 1 and 11 rows in turn (issue 51, item 4).

    .venv/bin/python bench/experiments/compiled_attention_passes.py [--steps 50] [--out bench/results/STAMP-NAME]

compile=True's CPU graphs run the package programs' attention passes (passes/attention_loops.py,
passes/refined_reshapes.py) among their post-grad passes (``settings.cpu_post_grad_passes``). Their speed is
measured before/after by tiny_models_vs_ort.py (``--compiled-before PYTHON --models tinyformer --sides ort
compiled-step``); this experiment checks what they compute. An eager module (``module(*inputs)``,
``optimizer.step()``, ``module.lazy_reset_grad()``, recording each step's gradients) and a compiled one
(``module.step``) train the tinyformer fixture on the same batches, one thread. Reported: the largest relative
difference of the losses, how many Dynamo graphs the compiled step had compiled after its first step at each batch size,
and the largest difference of the final parameters, split into the elements whose gradient is zero but for
rounding (at every step at most ``NOISE`` times the largest gradient of its tensor: AdamW divides such a
gradient by its own root mean square, so rounding noise moves the parameter by up to the learning rate) and the
rest. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.torch_internals import compile_counters

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "transformer"
ARTIFACTS = FIXTURE / "artifacts"
BATCHES = (8, 1, 11)
NOISE = 1e-5  # an element's gradient relative to its tensor's largest, below which it counts as rounding


def module_of(compile: bool) -> tuple[Module, Optimizer]:
    state = CheckpointState.load_checkpoint(str(ARTIFACTS / "checkpoint"))
    module = Module(
        str(ARTIFACTS / "training_model.onnx"),
        state,
        str(ARTIFACTS / "eval_model.onnx"),
        compile=compile,
        compile_cache=False,
    )
    return module, Optimizer(str(ARTIFACTS / "optimizer_model.onnx"), module)


def loss_of(outputs: object) -> float:
    first = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    return float(np.asarray(first).reshape(-1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-compiled-attention-parity", time.gmtime())
    data = np.load(FIXTURE / "data.npz")
    keys = json.loads((FIXTURE / "expected.json").read_text())["data_keys"]["train"]
    rows = {key: data[key].reshape(-1, *data[key].shape[2:]) for key in keys}
    total = len(rows[keys[0]])

    def batch(step: int) -> list[np.ndarray]:
        size, start = BATCHES[step % len(BATCHES)], (step * 7) % total
        index = [(start + offset) % total for offset in range(size)]
        return [np.ascontiguousarray(rows[key][index]) for key in keys]

    eager, eager_optimizer = module_of(False)
    params = eager.training_state.params
    largest_gradient = {name: torch.zeros_like(p) for name, p in params.items() if p.requires_grad}
    eager_losses = []
    for step in range(args.steps):
        eager_losses.append(loss_of(eager(*batch(step))))
        for name, top in largest_gradient.items():
            torch.maximum(top, params[name].grad.abs(), out=top)
        eager_optimizer.step()
        eager.lazy_reset_grad()

    torch._dynamo.reset()
    compile_counters().clear()
    compiled, compiled_optimizer = module_of(True)
    compiled_losses, graphs = [], {}
    for step in range(args.steps):
        compiled_losses.append(loss_of(compiled.step(compiled_optimizer, *batch(step))))
        graphs.setdefault(BATCHES[step % len(BATCHES)], int(compile_counters()["stats"]["unique_graphs"]))

    loss_gap = max(abs(a - b) / abs(b) for a, b in zip(compiled_losses, eager_losses, strict=True))
    compiled_params = compiled.training_state.params
    gaps = {"rounding": 0.0, "rest": 0.0}
    where = {"rounding": "", "rest": ""}
    for name, top in largest_gradient.items():
        difference = (compiled_params[name].detach() - params[name].detach()).abs()
        rounding = top <= NOISE * top.max()
        for kind, mask in (("rounding", rounding), ("rest", ~rounding)):
            if mask.any() and float(difference[mask].max()) > gaps[kind]:
                gaps[kind], where[kind] = float(difference[mask].max()), name
    load = os.getloadavg()[0]
    lines = [
        "# compile=True's tinyformer step with the attention passes against eager",
        "",
        f"`.venv/bin/python bench/experiments/compiled_attention_passes.py --steps {args.steps}`; load average "
        f"{load:.1f}; {args.steps} steps on batches of {', '.join(map(str, BATCHES))} rows in turn, one thread.",
        "",
        f"- losses: largest relative difference {loss_gap:.1e}",
        "- Dynamo graphs after the first step at each batch size: "
        + ", ".join(f"batch {size}: {count}" for size, count in graphs.items()),
        f"- final parameters, elements whose gradient is zero but for rounding (<= {NOISE:g} of their tensor's "
        f"largest at every step): largest difference {gaps['rounding']:.1e} ({where['rounding'] or 'none'})",
        f"- final parameters, the rest: largest difference {gaps['rest']:.1e} ({where['rest'] or 'none'})",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"load": load, "loss_gap": loss_gap, "graphs": graphs, "param_gaps": gaps, "where": where})
    )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
