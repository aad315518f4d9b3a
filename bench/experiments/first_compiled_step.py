"""First compiled steps of tiny models, ours against the same torch models under plain torch.compile.

    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py export DIR [ROW ...]
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py table [--together] DIR OUT.json [ROW ...]
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py measure ROOT DIR ROW OUT.json
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py reference DIR ROW OUT.json
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py markdown TABLE.json [...]

Rows (``first_step_models.py``): mixtral and qwen2-moe (transformers' routing; Qwen2-MoE with its shared
expert), olmoe (routed over every expert; its second batch reaches 2 of 4 experts), dinov2 (bicubic
Resize), clip (the vision tower with a classification head), convnext (2 stages, 32x32 images), vit, t5,
llama (with an attention mask, per-token labels), lstm (a tiny LSTM tagger) and whisper (a tiny Whisper
exported by ``torch.onnx.export(dynamo=True)``, per-token labels); batch and sequence axes dynamic for
t5, llama, lstm and whisper (its decoder's length), static shapes for the others. t5, lstm and whisper
train on issue 57's 8 shapes (batch 1 and a longer length included; ``STEPS=N``: the first N).
``export`` writes artifacts under DIR/<row>. ``measure`` trains ROW with ``compile=True`` (or the JSON in
``OURS_COMPILE``, e.g. ``{"options": {"cpp_wrapper": false}}``; no compile cache) on the checkout at ROOT (its ``ort_torch_train`` and ``adapters``: another commit's, for a
"before" figure). ``reference`` trains the same torch model under plain ``torch.compile`` (forward,
backward, torch.optim.AdamW; ``dynamic=True`` for the rows whose axes ours marks dynamic, else False)
on the same batches. Both write to OUT.json the first step's seconds, the Dynamo graphs after each
step, the error a step raised, the nodes of each graph Dynamo hands to inductor (``dynamo_graph_nodes``)
and of each ATen graph inductor compiles (``aten_graph_nodes``: the reference's forward and backward,
ours' one graph of both and the update), and the first step's time by phase (``first_step_phases_s``:
ours' conversion of the ONNX graph, from its log; Dynamo, AOT autograd and inductor from torch's own
compile timers, ``compile_phases.py``; the rest, running the step; every timer in
``first_step_timers_s``); ``first_step_cpu_s`` is the process's own CPU time in the first step
(inductor's C++ compilers run in other processes).
``table`` runs, row by row, ``measure`` on this checkout then ``reference``, each in its own process
with its own empty inductor cache directory, and writes every result, the load average and
``process_tree_cpu_s`` (CPU seconds of the whole process and its compilers: less sensitive to other
jobs than seconds of wall time) to OUT.json (after each side). ``--together`` starts the two sides of a
row at the same time, each with one thread (``ORT_TORCH_TRAIN_THREADS``, ``OMP_NUM_THREADS``,
``TORCHINDUCTOR_COMPILE_THREADS``), so that a load changing during the run falls on both. ``markdown`` prints tables' rows as Markdown.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from checkout import import_checkout  # noqa: E402
from compile_phases import CompileAccount, timers  # noqa: E402
from first_step_models import DYNAMIC, MOE, ROWS, batches, input_names, model  # noqa: E402


def _export(directory: Path, rows: list[str]) -> None:
    import numpy as np
    import torch

    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
    from tests.helpers.moe_models import VOCAB, experts_reached

    for row in rows:
        torch_model, names = model(row), input_names(row)
        if row in MOE:
            rng, tokens = np.random.default_rng(0), []
            while len(tokens) < 3:
                candidate = rng.integers(0, VOCAB, (2, 8))
                if len(experts_reached(torch_model, torch.from_numpy(candidate))) == 4:
                    tokens.append(candidate)
            if row == "olmoe":
                tokens[1] = np.full((2, 8), 5)
            (directory / row).mkdir(parents=True, exist_ok=True)
            np.save(directory / row / "tokens.npy", np.stack(tokens))
        example = tuple(torch.from_numpy(x) for x in batches(row, directory)[0][:-1])
        axes = {name: {0: "b", 1: "s"} for name in DYNAMIC.get(row, ())}
        if row == "llama":  # as tests/unit/training/test_dynamic_tables.py exports it
            axes["output"] = {0: "rows"}
        if row == "whisper":  # as tests/unit/training/test_compile_dynamic_axes.py exports it
            batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
            shapes = (({0: batch}, {0: batch, 1: length}),)  # Logits takes *inputs: one argument
            axes = {"exporter": "dynamo", "dynamic_shapes": shapes}  # type: ignore[dict-item]
        generate_artifacts(
            torch_model,
            loss=LossType.CrossEntropyLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory / row,
            example_inputs=example,
            input_names=list(names),
            **(axes if row == "whisper" else {"dynamic_axes": axes} if axes else {}),
        )


def _train(step, batches: list[tuple], result: dict, account: CompileAccount, conversion=lambda: 0.0) -> None:
    """Runs ``step`` on each batch, recording losses, seconds, Dynamo graphs and the first step's compile
    phases (``conversion()``: its seconds converting so far), or the error raised."""
    import numpy as np
    from torch._dynamo.utils import counters

    result.update(losses=[], graphs_after_step=[])
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        for batch in batches:
            result["losses"].append(float(np.asarray(step(batch)).reshape(-1)[0]))
            result["graphs_after_step"].append(counters["stats"]["unique_graphs"])
            if "first_step_s" not in result:
                result["first_step_s"] = round(time.perf_counter() - started, 2)
                result["first_step_cpu_s"] = round(time.process_time() - cpu_started, 1)
                result["first_step_phases_s"] = account.phases(result["first_step_s"], conversion())
                result["first_step_timers_s"] = timers()
        result["total_s"] = round(time.perf_counter() - started, 1)
    except Exception as error:
        result.setdefault("first_step_s", round(time.perf_counter() - started, 1))
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    result["graphs"] = counters["stats"]["unique_graphs"]
    result["dynamo_graph_nodes"], result["aten_graph_nodes"] = account.dynamo_graph_nodes, account.aten_graph_nodes
    result["aten_graph_kinds"], result["backend_s"] = account.aten_graph_kinds, round(account.backend_s, 2)


class _Conversions:
    """The seconds ours logs for each conversion ("converted the training graph in 0.21 s"), summed."""

    def __init__(self) -> None:
        import logging
        import re

        self.seconds, pattern = 0.0, re.compile(r"converted the .* in ([0-9.]+) s")

        class Handler(logging.Handler):
            def emit(handler, record: logging.LogRecord) -> None:  # noqa: N805
                found = pattern.search(record.getMessage())
                if found:
                    self.seconds += float(found.group(1))

        logger = logging.getLogger("ort_torch_train")
        logger.setLevel(logging.INFO)
        logger.addHandler(Handler())


def _reference(directory: Path, row: str, out: Path) -> None:
    import torch
    import torch.nn.functional as F

    account = CompileAccount()
    torch_model = model(row)
    compiled = torch.compile(torch_model, dynamic=row in DYNAMIC)
    optimizer = torch.optim.AdamW(torch_model.parameters(), lr=1e-3)

    def step(batch: tuple):
        *inputs, labels = (torch.from_numpy(x) for x in batch)
        loss = F.cross_entropy(compiled(*inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach().numpy()

    result: dict = {"row": row, "side": "torch.compile", "dynamic": row in DYNAMIC}
    _train(step, batches(row, directory), result, account)
    out.write_text(json.dumps(result))
    print(result)


def _measure(root: str, directory: Path, row: str, out: Path) -> None:
    import_checkout(root)
    from ort_torch_train.api import CheckpointState, Module, Optimizer

    account, conversions = CompileAccount(), _Conversions()
    state = CheckpointState.load_checkpoint(directory / row / "checkpoint")
    compile = json.loads(os.environ.get("OURS_COMPILE", "true"))
    module = Module(directory / row / "training_model.onnx", state, compile=compile, compile_cache=False)
    optimizer = Optimizer(directory / row / "optimizer_model.onnx", module)
    result: dict = {"row": row, "side": "ours", "root": root, "dynamic": row in DYNAMIC, "compile": compile}

    def step(batch: tuple):  # the Module converts nothing before its first step
        return module.step(optimizer, *batch)

    _train(step, batches(row, directory), result, account, lambda: conversions.seconds)
    result["conversion_s"] = round(conversions.seconds, 2)
    out.write_text(json.dumps(result))
    print(result)


def _table(directory: Path, out: Path, rows: list[str], together: bool = False) -> None:
    """Ours then the reference per row, each in a fresh process with an empty inductor cache directory;
    ``together``: the two sides of a row started at the same time, one thread each (compilers included),
    so that both see the same load."""
    root = str(Path(__file__).resolve().parents[2])
    table: dict = {"command": " ".join(sys.argv), "cpus": os.cpu_count(), "together": together, "rows": {}}
    for row in rows:
        sides = {"ours": ["measure", root, str(directory), row], "reference": ["reference", str(directory), row]}
        with tempfile.TemporaryDirectory() as scratch:
            load_before, started = os.getloadavg(), {}
            for side, args in sides.items():
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/{side}/inductor", "PYTHONPATH": root}
                if together:
                    env.update(ORT_TORCH_TRAIN_THREADS="1", OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1")
                started[side] = _start(args, f"{scratch}/{side}.json", env, scratch)
                if not together:
                    _finish(started[side], table, row, side, load_before)
                    out.write_text(json.dumps(table, indent=1))
                    load_before = os.getloadavg()
            for side in started if together else ():
                _finish(started[side], table, row, side, load_before)
                out.write_text(json.dumps(table, indent=1))


def _start(args: list[str], result: str, env: dict, scratch: str) -> tuple[subprocess.Popen, str, str]:
    """A side's process started, its output and error going to files under ``scratch``."""
    error = f"{result}.stderr"
    with open(error, "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, __file__, *args, result], env=env, stdout=subprocess.DEVNULL, stderr=stderr
        )
    return process, result, error


def _finish(started: tuple, table: dict, row: str, side: str, load_before: tuple) -> None:
    """Waits for a side's process; records its result, the load average around it and the CPU seconds of
    its process tree (its own rusage: the other side's process does not count)."""
    process, result_path, error = started
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    path = Path(result_path)
    result = json.loads(path.read_text()) if path.exists() else {"error": Path(error).read_text()[-500:]}
    result["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    result["process_tree_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    table["rows"].setdefault(row, {})[side] = result
    print(row, side, result, flush=True)


PHASES = ("conversion", "dynamo", "aot_autograd", "inductor", "rest")


def _markdown(paths: list[Path]) -> None:
    """Prints the rows of the ``table`` results at ``paths`` as Markdown: per side, then ours / reference."""
    print("| row | side | graphs after each step | first step s | " + " | ".join(PHASES) + " | Dynamo graph nodes | "
          "ATen graph nodes (checks, shape, update) | process tree CPU s | load before/after |")  # fmt: skip
    print("|---" * (8 + len(PHASES)) + "|")
    ratios = []
    for path in paths:
        for row, sides in json.loads(path.read_text())["rows"].items():
            for side in ("ours", "reference"):
                result = sides.get(side, {})
                phases = result.get("first_step_phases_s", {})
                kinds = [
                    f"{nodes} ({k.get('checks', 0)}, {k.get('shape', 0)}, {k.get('update', 0)})"
                    for nodes, k in zip(result.get("aten_graph_nodes", []), result.get("aten_graph_kinds", []))
                ]
                cells = [
                    row, side, result.get("graphs_after_step", result.get("error", "-")), result.get("first_step_s"),
                    *(phases.get(phase, "-") for phase in PHASES), result.get("dynamo_graph_nodes"), ", ".join(kinds),
                    result.get("process_tree_cpu_s"), " / ".join(map(str, result.get("load_average_before_after", []))),
                ]  # fmt: skip
                print("| " + " | ".join(str(cell) for cell in cells) + " |")
            ours, reference = sides.get("ours", {}), sides.get("reference", {})
            if ours.get("first_step_s") and reference.get("first_step_s") and "error" not in ours:
                wall = ours["first_step_s"] / reference["first_step_s"]
                cpu = ours.get("process_tree_cpu_s", 0) / max(reference.get("process_tree_cpu_s", 0), 0.1)
                ratios.append(f"{row} {wall:.2f}x ({cpu:.2f}x)")
    print("\nOurs / plain torch.compile, first step wall (process tree CPU, all steps): " + ", ".join(ratios))


if __name__ == "__main__":
    mode, args = sys.argv[1:2], sys.argv[2:]
    if mode == ["export"]:
        _export(Path(args[0]), args[1:] or list(ROWS))
    elif mode == ["table"]:
        together = "--together" in args
        args = [arg for arg in args if arg != "--together"]
        _table(Path(args[0]), Path(args[1]), args[2:] or list(ROWS), together)
    elif mode == ["reference"]:
        _reference(Path(args[0]), args[1], Path(args[2]))
    elif mode == ["measure"]:
        _measure(args[0], Path(args[1]), args[2], Path(args[3]))
    elif mode == ["markdown"]:
        _markdown([Path(arg) for arg in args])
    else:
        raise SystemExit(__doc__)
