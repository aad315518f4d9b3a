"""``--profile MODEL``: where a training step of this project's Module spends its time.

Profiles config (a) (or (b)/(e) with ``--profile-config ours-compile``/``ours-step``) and, for comparison, the
hand-written eager model (c) with torch.profiler; prints the op table of ours and the ops with the
most self time per step side by side.
"""

from __future__ import annotations

import numpy as np
import torch
from model_artifacts import ArtifactSet
from models import LEARNING_RATE, BenchModel
from report import LABELS
from runners import Runner, make_runner
from timing import render_table, time_phased_steps
from torch.profiler import ProfilerActivity, profile, record_function


def profile_runner(runner: Runner, steps: int, warmup: int, cuda: bool) -> profile:
    """torch.profiler over ``steps`` steps, each phase under a record_function of its name."""
    time_phased_steps(runner.phases, warmup, runner.sync)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as profiler:
        for _ in range(steps):
            for name, phase in runner.phases:
                with record_function(name):
                    phase()
            if runner.sync is not None:
                runner.sync()
    return profiler


def time_per_step(profiler: profile, steps: int, kind: str) -> dict[str, float]:
    """Op or phase name -> ``kind`` ("self" or "total") time per step in microseconds (CPU time)."""
    attribute = "self_cpu_time_total" if kind == "self" else "cpu_time_total"
    return {event.key: getattr(event, attribute) / steps for event in profiler.key_averages()}


def profile_model(
    model: BenchModel,
    artifacts: ArtifactSet,
    *,
    threads: int,
    device: str,
    steps: int,
    config: str = "ours",
    torch_inputs: bool = False,
    top: int = 20,
) -> None:
    """Print the profiler table of ``config`` (an ``ours*`` config) and its top self-time ops against (c)."""
    x, y = np.load(artifacts.directory / "x.npy"), np.load(artifacts.directory / "y.npy")
    cuda = device.startswith("cuda")
    self_times, total_times = {}, {}
    label = LABELS[config]
    for name in (config, "torch"):
        runner = make_runner(
            name,
            artifacts.directory,
            x,
            y,
            threads=threads,
            device=device,
            lr=LEARNING_RATE,
            model_name=model.name,
            torch_inputs=torch_inputs,
        )
        profiler = profile_runner(runner, steps, warmup=max(3, steps // 5), cuda=cuda)
        self_times[name] = time_per_step(profiler, steps, "self")
        total_times[name] = time_per_step(profiler, steps, "total")
        if name == config:
            sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            print(
                f"\ntorch.profiler, {model.name}, {label}, {steps} steps, {torch.get_num_threads()} threads "
                f"(artifacts: {artifacts.generator})"
            )
            print(profiler.key_averages().table(sort_by=sort, row_limit=40))
    ours, eager = self_times[config], self_times["torch"]
    phases = [name for name, _ in runner.phases]
    ranked = sorted(
        (op for op in set(ours) | set(eager) if op not in phases),
        key=lambda op: -max(ours.get(op, 0.0), eager.get(op, 0.0)),
    )[:top]
    rows = [
        [op, f"{ours.get(op, 0.0):.1f}", f"{eager.get(op, 0.0):.1f}", f"{ours.get(op, 0.0) - eager.get(op, 0.0):+.1f}"]
        for op in ranked
    ]
    print(f"\nTop {top} ops by self time per step (us), {label} vs torch eager (c):")
    print(render_table(["op", label, "torch eager (c)", "difference"], rows))
    wall = [
        [phase]
        + [f"{times[name].get(phase, 0.0):.1f}" for name in (config, "torch") for times in (total_times, self_times)]
        for phase in phases
    ]
    print("\nPhases per step (us): total CPU time, and self time = Python and dispatch outside any op:")
    print(render_table(["phase", "ours total", "ours self", "torch total", "torch self"], wall))
