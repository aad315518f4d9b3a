"""First compiled steps of the tiny models with data-dependent sizes, for a before/after comparison.

    .venv/bin/python bench/experiments/first_compiled_step.py export DIR
    .venv/bin/python bench/experiments/first_compiled_step.py measure ROOT DIR ROW OUT.json
    .venv/bin/python bench/experiments/first_compiled_step.py reference ROW OUT.json

``export`` writes artifacts under DIR/<row> for the rows mixtral (transformers' routing), olmoe (routed
over every expert; its second batch reaches 2 of 4 experts), dinov2 (bicubic Resize), lstm (a tiny
LSTM, batch and sequence axes dynamic; 6 shapes) and t5 (a tiny T5, the same axes dynamic; 3 shapes). ``measure`` trains ROW with ``compile=True`` (no
compile cache) on the checkout at ROOT (its ``ort_torch_train`` and ``adapters``: another commit's,
for a "before" figure) and writes the first step's seconds, the Dynamo graphs after each step, or the
error the first step raised, to OUT.json. ``reference`` times the same torch model's first step under
plain ``torch.compile`` (forward, backward, torch.optim.AdamW; ``dynamic=True`` for lstm, whose axes ours
marks dynamic, else False). One process per row and checkout; run them one at a time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path


def _export(directory: Path) -> None:
    import numpy as np
    import torch

    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
    from tests.helpers.moe_models import VOCAB, Dinov2Logits, experts_reached, tiny_moe

    def export(model, example, row, name, **options) -> None:
        generate_artifacts(
            model,
            loss=LossType.CrossEntropyLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory / row,
            example_inputs=(example,),
            input_names=[name],
            **options,
        )

    rng = np.random.default_rng(0)
    for kind, every in (("mixtral", False), ("olmoe", True)):
        model = tiny_moe(kind, every)
        tokens = []
        while len(tokens) < 3:
            candidate = rng.integers(0, VOCAB, (2, 8))
            if len(experts_reached(model, torch.from_numpy(candidate))) == 4:
                tokens.append(candidate)
        if every:
            tokens[1] = np.full((2, 8), 5)
        export(model, torch.from_numpy(tokens[0]), kind, "tokens")
        np.save(directory / kind / "tokens.npy", np.stack(tokens))
    export(Dinov2Logits(), torch.randn(2, 3, 16, 16), "dinov2", "pixels")

    torch.manual_seed(0)
    export(_tagger(), torch.randint(0, 12, (4, 8)), "lstm", "tokens", dynamic_axes={"tokens": {0: "b", 1: "s"}})
    torch.manual_seed(0)
    export(_t5(), torch.randint(0, 32, (2, 8)), "t5", "tokens", dynamic_axes={"tokens": {0: "b", 1: "s"}})


def _t5():
    import torch
    import transformers
    from torch import nn

    class T5Logits(nn.Module):
        """T5 (d_model 16, one encoder and one decoder layer) on its own ids as decoder ids: 2-D logits."""

        def __init__(self) -> None:
            super().__init__()
            config = transformers.T5Config(
                vocab_size=32, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
                dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
            )  # fmt: skip
            self.model = transformers.T5ForConditionalGeneration(config)

        def forward(self, tokens):
            ones = torch.ones_like(tokens)
            return self.model(input_ids=tokens, attention_mask=ones, decoder_input_ids=tokens).logits.flatten(0, 1)

    return T5Logits()


def _tagger():
    from torch import nn

    class Tagger(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.lstm, self.head = nn.Embedding(12, 4), nn.LSTM(4, 4, batch_first=True), nn.Linear(4, 3)

        def forward(self, tokens):
            return self.head(self.lstm(self.embed(tokens))[0].mean(1))

    return Tagger()


def _reference(row: str, out: Path) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch._dynamo.utils import counters

    from tests.helpers.moe_models import Dinov2Logits, tiny_moe

    torch.manual_seed(0)
    if row == "lstm":
        model, x, y = _tagger(), torch.randint(0, 12, (4, 8)), torch.randint(0, 3, (4,))
    elif row == "dinov2":
        model, x, y = Dinov2Logits(), torch.randn(2, 3, 16, 16), torch.randint(0, 3, (2,))
    else:
        model = tiny_moe(row, every_expert=row == "olmoe")
        x, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (16,))
    compiled = torch.compile(model, dynamic=row == "lstm")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    started = time.perf_counter()
    loss = F.cross_entropy(compiled(x), y)
    loss.backward()
    optimizer.step()
    seconds = round(time.perf_counter() - started, 1)
    result = {"row": row, "reference": "torch.compile", "first_step_s": seconds, "loss": float(np.asarray(loss.item()))}
    result["graphs"] = counters["stats"]["unique_graphs"]
    out.write_text(json.dumps(result))
    print(result)


def _measure(root: str, directory: Path, row: str, out: Path) -> None:
    sys.path.insert(0, root)
    import ort_torch_train  # noqa: F401  (the checkout's, then its adapters as ort_torch_train.adapters)

    spec = importlib.util.spec_from_file_location(
        "ort_torch_train.adapters", f"{root}/adapters/__init__.py", submodule_search_locations=[f"{root}/adapters"]
    )
    assert spec is not None and spec.loader is not None
    adapters = importlib.util.module_from_spec(spec)
    sys.modules["ort_torch_train.adapters"] = adapters
    spec.loader.exec_module(adapters)
    import numpy as np
    from torch._dynamo.utils import counters

    from ort_torch_train.api import CheckpointState, Module, Optimizer

    rng = np.random.default_rng(0)
    if row == "lstm":
        shapes = [(4, 8), (4, 6), (4, 10), (3, 7), (5, 9), (4, 12)][: int(os.environ.get("STEPS", 6))]
        batches = [(rng.integers(0, 12, s), rng.integers(0, 3, s[0])) for s in shapes]
    elif row == "t5":
        batches = [(rng.integers(0, 32, s), rng.integers(0, 32, s[0] * s[1])) for s in [(2, 8), (2, 6), (3, 7)]]
    elif row == "dinov2":
        batches = [(rng.standard_normal((2, 3, 16, 16), dtype=np.float32), rng.integers(0, 3, 2)) for _ in range(3)]
    else:
        batches = [(b, rng.integers(0, 32, 16)) for b in np.load(directory / row / "tokens.npy")[:3]]
    state = CheckpointState.load_checkpoint(directory / row / "checkpoint")
    module = Module(directory / row / "training_model.onnx", state, compile=True, compile_cache=False)
    optimizer = Optimizer(directory / row / "optimizer_model.onnx", module)
    result: dict = {"row": row, "root": root, "losses": [], "graphs_after_step": []}
    started = time.perf_counter()
    try:
        for batch in batches:
            result["losses"].append(float(np.asarray(module.step(optimizer, *batch)).reshape(-1)[0]))
            result["graphs_after_step"].append(counters["stats"]["unique_graphs"])
            result.setdefault("first_step_s", round(time.perf_counter() - started, 1))
        result["total_s"] = round(time.perf_counter() - started, 1)
    except Exception as error:
        result.setdefault("first_step_s", round(time.perf_counter() - started, 1))
        result["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    result["graphs"] = counters["stats"]["unique_graphs"]
    out.write_text(json.dumps(result))
    print(result)


if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:
        _export(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["reference"]:
        _reference(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1:2] == ["measure"]:
        _measure(sys.argv[2], Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5]))
    else:
        raise SystemExit(__doc__)
