"""Dynamo graphs of a compiled step over new sequence lengths and batch sizes, for a before/after comparison
of constant tables that follow the length (a mask's flat indices, token-type ids, rotary tables).

    .venv/bin/python bench/experiments/dynamic_tables.py ROOT ROW DIR SHAPES OUT.json

ROW: bert (tiny BertForSequenceClassification with a mask, dropout 0), bert-dropout (its default
dropout 0.1) or llama (tiny LlamaForCausalLM with a mask, the last position's logits). DIR: its artifacts
(exported there on first use, example batch 2 x 8, batch and sequence axes dynamic). SHAPES: batch x
length per step, e.g. 4x8,4x5,4x12. Trains one eager and one compiled Module (``compile_cache=False``,
learning rate 1e-2, the first sequence's last token masked) on the checkout at ROOT (its
``ort_torch_train``; another commit's for a "before" figure: copy its ``adapters`` into it as
``ort_torch_train/adapters``) and writes the graphs after each step, the seconds of the compiled steps
and both runs' losses to OUT.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    root, row, directory, shapes, out = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
    sys.path.insert(0, root)
    import numpy as np
    import torch
    import transformers

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
    from ort_torch_train.torch_internals import compile_counters

    vocab, classes = 50, 3 if row.startswith("bert") else 50
    tiny = {"vocab_size": vocab, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            if row.startswith("bert"):
                no_dropout = {} if row == "bert-dropout" else {"hidden_dropout_prob": 0.0}
                config = transformers.BertConfig(
                    **tiny, intermediate_size=32, max_position_embeddings=32, num_labels=3, **no_dropout
                )
                config.attention_probs_dropout_prob = 0.1 if row == "bert-dropout" else 0.0
                self.model = transformers.BertForSequenceClassification(config)
            else:
                config = transformers.LlamaConfig(
                    **tiny, num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64
                )
                self.model = transformers.LlamaForCausalLM(config)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            logits = self.model(input_ids=ids, attention_mask=mask).logits
            return logits if logits.dim() == 2 else logits[:, -1, :]

    if not (directory / "training_model.onnx").exists():
        torch.manual_seed(0)
        axes = {0: "batch", 1: "sequence"}
        generate_artifacts(
            Masked(),
            loss=LossType.CrossEntropyLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=directory,
            example_inputs=(torch.randint(0, vocab, (2, 8)), torch.ones(2, 8, dtype=torch.int64)),
            dynamic_axes={"ids": axes, "mask": axes, "output": {0: "batch"}},
        )
    rng = np.random.default_rng(0)
    batches = []
    for batch, length in (tuple(map(int, shape.split("x"))) for shape in shapes.split(",")):
        ids = rng.integers(0, vocab, (batch, length))
        mask = np.ones_like(ids)
        mask[0, -1] = 0
        batches.append((ids, mask, rng.integers(0, classes, batch)))
    result: dict[str, object] = {"row": row, "root": root, "shapes": shapes}
    for compile in (False, True):
        torch.manual_seed(0)
        torch._dynamo.reset()
        compile_counters().clear()
        state = CheckpointState.load_checkpoint(directory / "checkpoint")
        module = Module(directory / "training_model.onnx", state, compile=compile, compile_cache=False)
        optimizer = Optimizer(directory / "optimizer_model.onnx", module)
        optimizer.set_learning_rate(1e-2)
        started, losses, graphs = time.perf_counter(), [], []
        for batch in batches:
            losses.append(float(module.step(optimizer, *batch)))
            graphs.append(compile_counters()["stats"]["unique_graphs"])
        key = "compiled" if compile else "eager"
        result[f"{key}_losses"], result[f"{key}_seconds"] = losses, round(time.perf_counter() - started, 1)
        if compile:
            result["graphs_after_each_step"] = graphs
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
