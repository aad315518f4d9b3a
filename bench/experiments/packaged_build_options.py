"""What AOTInductor's build-time options do to a package's train program's per-call cost (issue 51, item 4).

    .venv/bin/python bench/experiments/packaged_build_options.py [--fixture mlp_ce_adamw_sched] [--batch 8]
        [--rounds 15] [--calls 500] [--out bench/results/STAMP-packaged-build-options]

Compiles the fixture's train step (as ``ort-torch-train package`` does: ``programs.train_function``, exported with
``programs.export_step``) once per variant below, loads each with libtorch's loader (one thread, as the runtime with
no Python does) and times ``run`` on the same arguments in blocks alternating between the variants, round after
round; each block's time is the process's CPU time per call (``time.process_time``: less disturbed than the wall
clock on a shared machine), the Python call included. Variants: the dynamic batch (as packages are built); the
batch static; ``memory_planning`` (one pool per step for the intermediates); ``aot_inductor.allow_stack_allocation``
(static shapes); ``max_autotune`` with the CPP GEMM backend alone (the cpp GEMM template instead of the extern mm).
A variant that does not compile is reported with its error. Writes OUT.md and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.compile.step_spec import ParameterPlan
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.package import build, program_build, programs

ROOT = Path(__file__).resolve().parents[2]
VARIANTS: dict[str, tuple[bool, dict[str, object]]] = {  # name -> (static batch, inductor config)
    "dynamic batch (default)": (False, {}),
    "static batch": (True, {}),
    "memory_planning": (True, {"memory_planning": True}),
    "allow_stack_allocation": (True, {"aot_inductor.allow_stack_allocation": True}),
    "max_autotune, CPP GEMM": (True, {"max_autotune": True, "max_autotune_gemm_backends": "CPP"}),
}


def train_program(
    fixture: str, batch: int, static: bool
) -> tuple[torch.export.ExportedProgram, list[torch.Tensor], int]:
    """The fixture's train step exported as the package build exports it, arguments to run it with and how many
    of them are user inputs."""
    folder = ROOT / "tests" / "fixtures" / fixture / "artifacts"
    state = TrainingState.load(folder / "checkpoint")
    engine = TrainingEngine(build._model(folder, "training_model"), state, None, EngineOptions.of())
    graph_names = list(engine.train_layout.params)
    plan = ParameterPlan.of(graph_names, engine.trainable_parameter_names)
    trainable = [state.params[name].detach().clone() for name in engine.trainable_parameter_names]
    frozen = [state.params[name].detach().clone() for name in plan.frozen_names(graph_names)]
    examples = program_build.examples(engine.train_graph, batch)
    inputs, axes = examples.inputs, examples.axes
    module = program_build.converted(engine.train_graph, inputs, [state.params[name] for name in graph_names])
    step = programs.train_function(module, len(inputs), plan)
    example = [*inputs, *trainable, *frozen, *(torch.zeros_like(t) for t in trainable), torch.tensor(True)]
    fixed = [None] * (len(example) - len(inputs))
    exported = programs.export_step(step, example, [*([None] * len(inputs) if static else axes), *fixed])
    generator = torch.Generator().manual_seed(0)
    arguments = [torch.randn(t.shape, generator=generator) if t.is_floating_point() else t for t in example]
    return exported, arguments, len(inputs)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", default="mlp_ce_adamw_sched")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    out = args.out or ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M-packaged-build-options", time.gmtime())
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    runners, errors, compile_s = {}, {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, (static, config) in VARIANTS.items():
            exported, arguments, _ = train_program(args.fixture, args.batch, static)
            path = Path(scratch) / f"{len(runners) + len(errors)}.pt2"
            started = time.perf_counter()
            try:
                with torch._inductor.config.patch(config):
                    torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
            except Exception as error:  # torch's many compile errors: reported, the other variants go on
                errors[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                continue
            compile_s[name] = time.perf_counter() - started
            runners[name] = torch._inductor.aoti_load_package(str(path), run_single_threaded=True).loader
        blocks: dict[str, list[float]] = {name: [] for name in runners}
        for runner in runners.values():
            for _ in range(50):
                runner.run(arguments)
        names = list(runners)
        for round_index in range(args.rounds):
            for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
                started = time.process_time()
                for _ in range(args.calls):
                    runners[name].run(arguments)
                blocks[name].append((time.process_time() - started) / args.calls * 1e6)
    load = (load_start, os.getloadavg()[0])
    base = statistics.median(blocks[names[0]])
    command = " ".join([".venv/bin/python bench/experiments/packaged_build_options.py", *(argv or [])])
    lines = [
        f"# A package's train program under AOTInductor's build options: {args.fixture}, batch {args.batch}",
        "",
        f"`{command}`; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; torch {torch.__version__}; one thread;",
        f"{args.rounds} rounds of blocks of {args.calls} calls alternating between the variants; CPU time per call",
        f"(process_time, the Python call included); load average {load[0]:.1f} at the start, {load[1]:.1f} at the end",
        "(the 2-core VM shared with seven other sessions).",
        "",
        "| variant | median CPU per call | lowest block | / default | compile |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        median = statistics.median(blocks[name])
        lines.append(
            f"| {name} | {median:.1f} us | {min(blocks[name]):.1f} us | {median / base:.2f}x | {compile_s[name]:.0f} s |"
        )
    lines += [f"| {name} | does not compile: {error} | | | |" for name, error in errors.items()]
    text = "\n".join(lines) + "\n"
    Path(f"{out}.md").write_text(text)
    result = {"load_average": load, "blocks": blocks, "errors": errors, "compile_s": compile_s}
    Path(f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
