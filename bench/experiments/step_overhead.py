"""Fixed cost of one compiled training step, layer by layer, on a small model (default: the mlp).

    .venv/bin/python bench/experiments/step_overhead.py [--model mlp] [--threads 1] [--blocks 15] [--calls 200]

Times, in one process and interleaved (blocks of ``--calls`` calls, A B C ... A B C ...; reported: the
lowest block median, the least disturbed by other load), each layer of ``module.step(optimizer, x, y)``
with ``compile=True``, from the outside in:

- ``module.step`` fed numpy arrays (ORT's API: torch views in, numpy loss out);
- ``module.step`` fed torch tensors;
- the engine's ``train_and_update`` (no input conversion, no lock, no output wrapping);
- the ``CompiledTrainStep`` call (the step's own argument handling);
- the precompiled function alone (its guard check, AOTAutograd's and inductor's wrappers, the kernels;
  under the step's grad mode and BLAS thread setting, ``training/blas_threads.py``, as the step calls it);
- that without its guard check (unsafe: for the measure only);
- the same step through torch.compile's usual call instead (Dynamo's frame evaluation and guards), what
  ``CompiledTrainStep`` ran before it precompiled every step (``training/compile/precompiled.py``);
- with ``--python-wrapper``: ``module.step`` (torch tensors) compiled with inductor's Python wrapper
  (``compile={"options": {"cpp_wrapper": False}}``; one more compile) instead of the C++ one that
  ``compile=True`` uses on CPU;
- the hand-written model's eager step, for scale.

The differences between consecutive layers are what each layer costs per step.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.api import set_threads

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))

from timing import block_median_us  # noqa: E402


def layers(model_name: str, python_wrapper: bool = False) -> dict[str, Callable[[], object]]:
    """The step at each layer, warmed up (compiled) and ready to call repeatedly."""
    from model_artifacts import prepare_artifacts
    from models import LEARNING_RATE, MODELS
    from runners import make_runner, ours_module

    from ort_torch_train.api import Module, Optimizer
    from ort_torch_train.state.fresh_gradients import pays_off
    from ort_torch_train.torch_internals import GradDisabled
    from ort_torch_train.training.blas_threads import blas_threads_for

    directory = prepare_artifacts(MODELS[model_name], BENCH / ".cache", use_ort=True).directory
    x, y = np.load(directory / "x.npy"), np.load(directory / "y.npy")
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def compiled_module(compile: bool | dict) -> tuple[Module, Optimizer]:
        module, optimizer = ours_module(directory, LEARNING_RATE, compile=compile)
        for _ in range(3):
            module.step(optimizer, x, y)
        return module, optimizer

    module, optimizer = compiled_module(True)
    engine_optimizer = optimizer.engine_for_step()
    (compiled_step,) = module.train_graph._cache.values()
    trainable, frozen, grads = module._engine._parameter_views()
    moments = engine_optimizer.moment_lists()
    flat = module.training_state.flat  # the step's flat buffers (state/flat.py), if any
    if flat is not None:
        trainable, moments = [flat.params], [[moment] for moment in flat.moments]
        # a large buffer: module.step's graph makes gradients of its own (fresh_gradients.py)
        grads = [] if pays_off(flat) else [flat.grads]

    def step_call() -> object:
        return compiled_step([tx, ty], trainable, frozen, grads, True, moments, engine_optimizer.next_step_scalars())

    flag = compiled_step._reset_flag(True, trainable[0].device)
    scalars = engine_optimizer.next_step_scalars()

    guarded = compiled_step._compiled  # a precompiled.GuardedStep
    arguments = ([tx, ty], trainable, frozen, grads, flag, tuple(moments), scalars, None)

    def calling(function: Callable) -> Callable[[], object]:
        def call() -> object:
            with GradDisabled(), blas_threads_for(compiled_step._products, trainable[0].device):
                return function(*arguments)

        return call

    torch_runner = make_runner(
        "torch", directory, x, y, threads=torch.get_num_threads(), device="cpu", lr=LEARNING_RATE, model_name=model_name
    )

    def torch_eager() -> None:
        for _, phase in torch_runner.phases:
            phase()

    steps = {
        "module.step, numpy in/out": lambda: module.step(optimizer, x, y),
        "module.step, torch in/out": lambda: module.step(optimizer, tx, ty),
        "engine.train_and_update": lambda: module.train_and_update([tx, ty], engine_optimizer),
        "CompiledTrainStep call": step_call,
        "precompiled function": calling(guarded),
        "  without its guard check": calling(guarded.compiled.fn),
        "  through torch.compile instead": calling(guarded.fallback),
    }
    if python_wrapper:
        python_module, python_optimizer = compiled_module({"options": {"cpp_wrapper": False}})
        steps["module.step, Python wrapper, torch"] = lambda: python_module.step(python_optimizer, tx, ty)
    steps["hand-written eager step (c)"] = torch_eager
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument(
        "--python-wrapper", action="store_true", help="also time the step with inductor's Python wrapper"
    )
    args = parser.parse_args()
    set_threads(args.threads)
    steps = layers(args.model, args.python_wrapper)
    for step in steps.values():  # warm every path (the guard-skipping stance included)
        for _ in range(20):
            step()
    best = {name: float("inf") for name in steps}
    for _ in range(args.blocks):
        for name, step in steps.items():
            best[name] = min(best[name], block_median_us(step, args.calls))
    print(
        f"{args.model}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}: lowest of "
        f"{args.blocks} block medians ({args.calls} calls each)"
    )
    previous = None
    for name, us in best.items():
        delta = (
            ""
            if previous is None or not name.startswith(("engine", "Compiled", "precompiled", " "))
            else f"  (layer above: {previous - us:+.1f} us)"
        )
        print(f"  {name:<30} {us:8.1f} us{delta}")
        previous = us
    return 0


if __name__ == "__main__":
    sys.exit(main())
