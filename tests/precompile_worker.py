"""One process of tests/test_compile_cache.py: load the compile cache, train the MLP case compiled, save it.

    python precompile_worker.py CASE_DIR CACHE_FILE OUT.npz

Writes the losses, the final parameters and the eval step's outputs after training to OUT.npz; the log
lines of precompiled.py go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from corpus import Case  # noqa: E402

from ort_torch_train.api import Module, Optimizer  # noqa: E402
from ort_torch_train.training.compile_cache import load_compile_cache, save_compile_cache  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", type=Path)
    parser.add_argument("cache", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mixed-precision", choices=["bf16"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    torch.set_num_threads(1)
    load_compile_cache(args.cache)
    case = Case(args.case)
    module = Module(case.artifact("training_model.onnx"), case.load_state(), case.artifact("eval_model.onnx"),
                    compile=True, mixed_precision=args.mixed_precision)
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = []
    for step in range(3):
        inputs = case.train_inputs(step)
        losses.append(np.asarray(module.step(optimizer, *inputs)))
    module.eval()
    evaluated = np.asarray(module(*case.eval_inputs()))
    save_compile_cache(args.cache)
    np.savez(args.out, losses=np.stack(losses), params=module.get_contiguous_parameters().numpy(),
             evaluated=evaluated)


if __name__ == "__main__":
    main()
