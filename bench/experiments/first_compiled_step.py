"""First compiled steps of tiny models, ours against the same torch models under plain torch.compile.

    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py export DIR [ROW ...]
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py table DIR OUT.json [ROW ...]
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py measure ROOT DIR ROW OUT.json
    PYTHONPATH=. .venv/bin/python bench/experiments/first_compiled_step.py reference DIR ROW OUT.json

Rows: mixtral (transformers' routing), olmoe (routed over every expert; its second batch reaches 2 of 4
experts), dinov2 (bicubic Resize), vit, t5, llama (with an attention mask, per-token labels), lstm (a
tiny LSTM tagger) and whisper (a tiny Whisper exported by ``torch.onnx.export(dynamo=True)``, per-token
labels); batch and sequence axes dynamic for t5, llama, lstm and whisper (its decoder's length), static
shapes for the others. t5, lstm and whisper train on issue 57's 8 shapes (batch 1 and a longer length
included; ``STEPS=N``: the first N).
``export`` writes artifacts under DIR/<row>. ``measure`` trains ROW with ``compile=True`` (no compile
cache) on the checkout at ROOT (its ``ort_torch_train`` and ``adapters``: another commit's, for a
"before" figure). ``reference`` trains the same torch model under plain ``torch.compile`` (forward,
backward, torch.optim.AdamW; ``dynamic=True`` for the rows whose axes ours marks dynamic, else False)
on the same batches. Both write the first step's seconds, the Dynamo graphs after each step, the nodes
of each graph Dynamo hands to inductor, the error a step raised, and the first step's compile time
(``first_step_phases_s``: Dynamo's timers, ``_compile_phases``; ours' ``first_step_conversion_s``, from
its log) to OUT.json; ``first_step_cpu_s``
is the process's own CPU time in the first step (inductor's C++ compilers run in other processes).
``table`` runs, row by row, ``measure`` on this checkout then ``reference``, each in its own process
with its own empty inductor cache directory, and writes every result, the load average and
``process_tree_cpu_s`` (CPU seconds of the whole process and its compilers: less sensitive to other
jobs than seconds of wall time) to OUT.json (after each row).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "harness"))

from checkout import import_checkout  # noqa: E402

ROWS = ("mixtral", "olmoe", "dinov2", "vit", "t5", "llama", "lstm", "whisper")
DYNAMIC = {"t5": ("tokens",), "llama": ("ids", "mask"), "lstm": ("tokens",), "whisper": ("features", "ids")}
ISSUE_SHAPES = [(4, 16), (4, 16), (3, 16), (4, 9), (1, 23), (2, 16), (4, 31), (3, 7)]  # issue 57's batch x length
SHAPES = {"t5": ISSUE_SHAPES, "llama": [(2, 8), (2, 6), (3, 16)], "lstm": ISSUE_SHAPES, "whisper": ISSUE_SHAPES}
MELS, FRAMES = 4, 16  # whisper's input features: mel bins x frames (twice its encoder positions)


def _model(row: str):
    """ROW's torch model, seeded: the one exported and the one the reference compiles."""
    import torch
    import transformers

    from tests.helpers.moe_models import Dinov2Logits, tiny_moe

    torch.manual_seed(0)
    if row in ("mixtral", "olmoe"):
        return tiny_moe(row, every_expert=row == "olmoe")
    if row == "dinov2":
        return Dinov2Logits()
    if row == "lstm":
        return _Tagger()
    if row == "vit":
        config = transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=16,
            patch_size=4, num_labels=3, attn_implementation="eager",
        )  # fmt: skip
        return _Logits(transformers.ViTForImageClassification(config), "pixel_values")
    if row == "t5":
        config = transformers.T5Config(
            vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
            dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
        )  # fmt: skip
        return _Logits(transformers.T5ForConditionalGeneration(config), "t5")
    if row == "whisper":
        config = transformers.WhisperConfig(
            vocab_size=32, num_mel_bins=MELS, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=FRAMES // 2,
            max_target_positions=64, dropout=0.0, use_cache=False, pad_token_id=0, decoder_start_token_id=1,
            attn_implementation="eager",
        )  # fmt: skip
        return _Logits(transformers.WhisperForConditionalGeneration(config), "whisper")
    if row == "llama":
        config = transformers.LlamaConfig(
            vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            intermediate_size=32, max_position_embeddings=64, use_cache=False,
        )  # fmt: skip
        return _Logits(transformers.LlamaForCausalLM(config), "masked")
    raise SystemExit(f"unknown row {row!r}; expected one of {ROWS}")


def _Tagger():
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.lstm, self.head = nn.Embedding(12, 4), nn.LSTM(4, 4, batch_first=True), nn.Linear(4, 3)

        def forward(self, tokens):
            return self.head(self.lstm(self.embed(tokens))[0].mean(1))

    return Tagger()


def _Logits(model, call: str):
    """A ``transformers`` model returning 2-D logits: per image, or per token flattened."""
    import torch
    from torch import nn

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs):
            if call == "pixel_values":
                return self.model(pixel_values=inputs[0]).logits
            if call == "t5":  # its own ids as decoder ids
                ones = torch.ones_like(inputs[0])
                out = self.model(input_ids=inputs[0], attention_mask=ones, decoder_input_ids=inputs[0])
                return out.logits.flatten(0, 1)
            if call == "whisper":
                return self.model(input_features=inputs[0], decoder_input_ids=inputs[1]).logits.flatten(0, 1)
            return self.model(input_ids=inputs[0], attention_mask=inputs[1]).logits.flatten(0, 1)

    return Logits()


def _batches(row: str, directory: Path) -> list[tuple]:
    """ROW's training batches as numpy arrays: inputs, then labels."""
    import numpy as np

    rng = np.random.default_rng(0)
    if row in ("dinov2", "vit"):
        return [(rng.standard_normal((2, 3, 16, 16), dtype=np.float32), rng.integers(0, 3, 2)) for _ in range(3)]
    if row in ("mixtral", "olmoe"):
        return [(b, rng.integers(0, 32, 16)) for b in np.load(directory / row / "tokens.npy")[:3]]
    shapes = SHAPES[row][: int(os.environ.get("STEPS", 8))]
    if row == "lstm":
        return [(rng.integers(0, 12, s), rng.integers(0, 3, s[0])) for s in shapes]
    if row == "t5":
        return [(rng.integers(0, 32, s), rng.integers(0, 32, s[0] * s[1])) for s in shapes]
    if row == "whisper":
        features = [rng.standard_normal((s[0], MELS, FRAMES), dtype=np.float32) for s in shapes]
        return [(f, rng.integers(0, 32, s), rng.integers(0, 32, s[0] * s[1])) for f, s in zip(features, shapes)]
    batches = []
    for shape in shapes:  # llama: the first sequence's last token masked out
        ids, mask = rng.integers(0, 32, shape), np.ones(shape, dtype=np.int64)
        mask[0, -1] = 0
        batches.append((ids, mask, rng.integers(0, 32, ids.size)))
    return batches


def _export(directory: Path, rows: list[str]) -> None:
    import numpy as np
    import torch

    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
    from tests.helpers.moe_models import VOCAB, experts_reached

    for row in rows:
        model, names = _model(row), DYNAMIC.get(row, ("pixels",) if row in ("dinov2", "vit") else ("tokens",))
        if row in ("mixtral", "olmoe"):
            rng, tokens = np.random.default_rng(0), []
            while len(tokens) < 3:
                candidate = rng.integers(0, VOCAB, (2, 8))
                if len(experts_reached(model, torch.from_numpy(candidate))) == 4:
                    tokens.append(candidate)
            if row == "olmoe":
                tokens[1] = np.full((2, 8), 5)
            (directory / row).mkdir(parents=True, exist_ok=True)
            np.save(directory / row / "tokens.npy", np.stack(tokens))
        example = tuple(torch.from_numpy(x) for x in _batches(row, directory)[0][:-1])
        axes = {name: {0: "b", 1: "s"} for name in DYNAMIC.get(row, ())}
        if row == "llama":  # as tests/unit/training/test_dynamic_tables.py exports it
            axes["output"] = {0: "rows"}
        if row == "whisper":  # as tests/unit/training/test_compile_dynamic_axes.py exports it
            batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
            shapes = (({0: batch}, {0: batch, 1: length}),)  # Logits takes *inputs: one argument
            axes = {"exporter": "dynamo", "dynamic_shapes": shapes}  # type: ignore[dict-item]
        generate_artifacts(
            model,
            loss=LossType.CrossEntropyLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory / row,
            example_inputs=example,
            input_names=list(names),
            **(axes if row == "whisper" else {"dynamic_axes": axes} if axes else {}),
        )


def _count_inductor_graphs() -> list[int]:
    """Nodes of each graph Dynamo hands to inductor, appended as they come (inductor itself unchanged)."""
    import torch._inductor.compile_fx as compile_fx

    nodes: list[int] = []
    inner, depth = compile_fx.compile_fx, [0]

    def counted(graph, *args, **kwargs):
        if not depth[0]:  # compile_fx calls itself once more under inductor options: counted once
            nodes.append(len(graph.graph.nodes))
        depth[0] += 1
        try:
            return inner(graph, *args, **kwargs)
        finally:
            depth[0] -= 1

    compile_fx.compile_fx = counted
    return nodes


def _train(step, batches: list[tuple], result: dict) -> None:
    """Runs ``step`` on each batch, recording losses, seconds and Dynamo graphs, or the error raised."""
    import numpy as np
    from torch._dynamo.utils import counters

    result.update(losses=[], graphs_after_step=[])
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        for batch in batches:
            result["losses"].append(float(np.asarray(step(batch)).reshape(-1)[0]))
            result["graphs_after_step"].append(counters["stats"]["unique_graphs"])
            result.setdefault("first_step_s", round(time.perf_counter() - started, 1))
            result.setdefault("first_step_cpu_s", round(time.process_time() - cpu_started, 1))
            result.setdefault("first_step_phases_s", _compile_phases())
        result["total_s"] = round(time.perf_counter() - started, 1)
    except Exception as error:
        result.setdefault("first_step_s", round(time.perf_counter() - started, 1))
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    result["graphs"] = counters["stats"]["unique_graphs"]


def _compile_phases() -> dict:
    """Seconds of the compilations so far in Dynamo's timers: the whole of Dynamo's compile (absent on a
    precompiled step's path), its backend call, AOT autograd's, and inductor's (nested in that order; the
    reference's backward compiles outside the backend call, at its first backward)."""
    from torch._dynamo.utils import compilation_time_metrics

    timers = {
        "dynamo": "_compile.compile_inner",
        "backend": "OutputGraph.call_user_compiler",
        "aot_autograd": "create_aot_dispatcher_function",
        "inductor": "compile_fx_inner",
    }
    return {name: round(sum(compilation_time_metrics.get(timer, [])), 1) for name, timer in timers.items()}


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

    nodes = _count_inductor_graphs()
    model = _model(row)
    compiled = torch.compile(model, dynamic=row in DYNAMIC)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(batch: tuple):
        *inputs, labels = (torch.from_numpy(x) for x in batch)
        loss = F.cross_entropy(compiled(*inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach().numpy()

    result: dict = {"row": row, "side": "torch.compile", "dynamic": row in DYNAMIC}
    _train(step, _batches(row, directory), result)
    result["inductor_graph_nodes"] = nodes
    out.write_text(json.dumps(result))
    print(result)


def _measure(root: str, directory: Path, row: str, out: Path) -> None:
    import_checkout(root)
    from ort_torch_train.api import CheckpointState, Module, Optimizer

    nodes, conversions = _count_inductor_graphs(), _Conversions()
    state = CheckpointState.load_checkpoint(directory / row / "checkpoint")
    module = Module(directory / row / "training_model.onnx", state, compile=True, compile_cache=False)
    optimizer = Optimizer(directory / row / "optimizer_model.onnx", module)
    result: dict = {"row": row, "side": "ours", "root": root, "dynamic": row in DYNAMIC}

    def step(batch: tuple):  # the Module converts nothing before its first step
        outputs = module.step(optimizer, *batch)
        result.setdefault("first_step_conversion_s", round(conversions.seconds, 1))
        return outputs

    _train(step, _batches(row, directory), result)
    result["conversion_s"] = round(conversions.seconds, 1)
    result["inductor_graph_nodes"] = nodes
    out.write_text(json.dumps(result))
    print(result)


def _children_cpu() -> float:
    """User and system seconds of this process's waited-for descendants (compiler processes included)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _table(directory: Path, out: Path, rows: list[str]) -> None:
    """Ours then the reference per row, each in a fresh process with an empty inductor cache directory."""
    root = str(Path(__file__).resolve().parents[2])
    table: dict = {"command": " ".join(sys.argv), "cpus": os.cpu_count(), "rows": {}}
    for row in rows:
        for side, args in (
            ("ours", ["measure", root, str(directory), row]),
            ("reference", ["reference", str(directory), row]),
        ):
            with tempfile.TemporaryDirectory() as scratch:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{scratch}/inductor", "PYTHONPATH": root}
                load_before, cpu_before = os.getloadavg(), _children_cpu()
                run = subprocess.run(
                    [sys.executable, __file__, *args, f"{scratch}/out.json"], env=env, capture_output=True, text=True
                )
                path = Path(f"{scratch}/out.json")
                result = json.loads(path.read_text()) if path.exists() else {"error": run.stderr[-500:]}
            result["load_average_before_after"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
            result["process_tree_cpu_s"] = round(_children_cpu() - cpu_before, 1)
            table["rows"].setdefault(row, {})[side] = result
            out.write_text(json.dumps(table, indent=1))
            print(row, side, result, flush=True)


if __name__ == "__main__":
    mode, args = sys.argv[1:2], sys.argv[2:]
    if mode == ["export"]:
        _export(Path(args[0]), args[1:] or list(ROWS))
    elif mode == ["table"]:
        _table(Path(args[0]), Path(args[1]), args[2:] or list(ROWS))
    elif mode == ["reference"]:
        _reference(Path(args[0]), args[1], Path(args[2]))
    elif mode == ["measure"]:
        _measure(args[0], Path(args[1]), args[2], Path(args[3]))
    else:
        raise SystemExit(__doc__)
