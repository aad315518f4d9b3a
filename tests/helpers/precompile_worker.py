"""One process of tests/unit/training/test_compile_cache.py: train the MLP case compiled with a compile cache.

    python -m tests.helpers.precompile_worker CASE_DIR CACHE_DIR OUT.npz [--mixed-precision bf16] [--mode MODE]
        [--copy DIR] [--stop-after-lookup]

Writes the losses, the final parameters, the eval step's outputs after training and the number of C++
libraries inductor built (g++ runs, counted at ``CppBuilder.build``) to OUT.npz; the log lines of
training/compile/ go to stderr. ``--copy DIR``: then ``save_compile_cache(DIR)``. ``--stop-after-lookup``:
the process ends right after the compile cache's real lookup of the train step (before anything is
compiled) and OUT.npz holds ``found``, whether that lookup found a saved step.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np

from ort_torch_train.api import Module, Optimizer, set_threads
from ort_torch_train.training.compile.cache import load_compile_cache, save_compile_cache
from tests.helpers.corpus import Case


def count_library_builds() -> list[str]:
    """The shared libraries inductor builds from now on (appended as they are built)."""
    from torch._inductor.cpp_builder import CppBuilder

    built, build = [], CppBuilder.build

    def counted_build(builder: CppBuilder) -> object:
        target = builder.get_target_file_path()
        if target.endswith(".so"):
            built.append(target)
        return build(builder)

    CppBuilder.build = counted_build
    return built


def stop_after_the_train_step_lookup(out: Path) -> None:
    """From now on the first lookup of a train step in a compile cache writes whether it found one to
    ``out`` and ends the process (what it logged stays in the log)."""
    from ort_torch_train.training.compile.cache_entries import CompileCache

    load_step = CompileCache.load_step

    def looked_up(cache: CompileCache, key: str, what: str) -> bytes | None:
        data = load_step(cache, key, what)
        if what == "train step":
            np.savez(out, found=data is not None)
            logging.shutdown()
            raise SystemExit(0)
        return data

    CompileCache.load_step = looked_up  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("case", type=Path)
    parser.add_argument("cache", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--mixed-precision", choices=["bf16"])
    parser.add_argument("--mode", help="a torch.compile mode (compile=MODE instead of True)")
    parser.add_argument("--copy", type=Path, help="a directory save_compile_cache copies the steps into")
    parser.add_argument("--stop-after-lookup", action="store_true", help="end after the train step's lookup")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    set_threads(1)
    library_builds = count_library_builds()
    if args.stop_after_lookup:
        stop_after_the_train_step_lookup(args.out)
    load_compile_cache(args.cache)
    case = Case(args.case)
    module = Module(
        case.artifact("training_model.onnx"),
        case.load_state(),
        case.artifact("eval_model.onnx"),
        compile=args.mode or True,
        mixed_precision=args.mixed_precision,
    )
    optimizer = Optimizer(case.artifact("optimizer_model.onnx"), module)
    losses = []
    for step in range(3):
        inputs = case.train_inputs(step)
        losses.append(np.asarray(module.step(optimizer, *inputs)))
    module.eval()
    evaluated = np.asarray(module(*case.eval_inputs()))
    if args.copy is not None:
        save_compile_cache(args.copy)
    np.savez(
        args.out,
        losses=np.stack(losses),
        params=module.get_contiguous_parameters().numpy(),
        evaluated=evaluated,
        library_builds=len(library_builds),
    )


if __name__ == "__main__":
    main()
