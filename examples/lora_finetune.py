"""LoRA fine-tuning of a transformers model on its exported ONNX graph, run with onnxruntime.

A small Llama (random weights, from a ``transformers`` config) is exported and turned into training
artifacts with LoRA adapters on its attention and MLP weights (``generate_artifacts(lora=...)``). Two
adapters are trained on the same frozen base, one per task (next token = token + 1, and token + 2,
modulo the vocabulary). Then:

- ``merged_<task>.onnx``: each adapter merged into the weights (``export_model_for_inferencing``),
- ``unmerged.onnx`` + ``<task>.onnx_adapter``: one base model, adapters chosen per run with
  ``onnxruntime.LoraAdapter`` and ``RunOptions.add_active_adapter``,

and checks with onnxruntime that each adapter gives its merged model's outputs and solves its task.

    python examples/lora_finetune.py [--steps 150] [--hidden 32] [--out runs/lora]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime
import torch
import transformers

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import AdamW, LossType, generate_artifacts
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.export import export_adapter, export_unmerged_model

VOCAB, TOKENS, BATCH = 16, 8, 16
TASKS = {"plus_one": 1, "plus_two": 2}


class Logits(torch.nn.Module):
    """The language model's logits, flattened to (batch * tokens, vocab) for CrossEntropyLoss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits.flatten(0, 1)


def base_model(hidden: int, layers: int) -> Logits:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=TOKENS,
        use_cache=False,
        attn_implementation="eager",
    )
    return Logits(transformers.LlamaForCausalLM(config))


def batch(rng: np.random.Generator, shift: int) -> tuple[np.ndarray, np.ndarray]:
    tokens = rng.integers(0, VOCAB, (BATCH, TOKENS), dtype=np.int64)
    return tokens, ((tokens + shift) % VOCAB).reshape(-1)


def train_adapter(artifacts: Path, shift: int, steps: int, lr: float) -> tuple[Module, list[float]]:
    """A Module on fresh copies of the artifacts' state, its adapter trained on one task."""
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(lr)
    rng = np.random.default_rng(shift)
    losses = []
    for _ in range(steps):
        losses.append(float(module(*batch(rng, shift))))
        optimizer.step()
        module.lazy_reset_grad()
    return module, losses


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--out", default="runs/lora")
    args = parser.parse_args(argv)
    out = Path(args.out)
    artifacts = out / "artifacts"
    shutil.rmtree(artifacts, ignore_errors=True)

    model = base_model(args.hidden, args.layers)
    generate_artifacts(
        model,
        example_inputs=(torch.zeros(BATCH, TOKENS, dtype=torch.int64),),
        input_names=["tokens"],
        output_names=["logits"],
        loss=LossType.CrossEntropyLoss,
        optimizer=AdamW(),
        artifact_directory=artifacts,
        lora=LoraConfig(r=args.rank, alpha=2 * args.rank, targets=["all-linear"]),
    )

    summary: dict = {"tasks": {}}
    for task, shift in TASKS.items():
        module, losses = train_adapter(artifacts, shift, args.steps, args.lr)
        module.export_model_for_inferencing(out / f"merged_{task}.onnx", ["logits"])
        export_adapter(module, out / f"{task}.onnx_adapter")
        if task == "plus_one":
            export_unmerged_model(module, out / "unmerged.onnx", ["logits"])
            summary["trainable_parameters"] = module.parameters_size(trainable_only=True)
            summary["all_parameters"] = module.parameters_size(trainable_only=False)
        summary["tasks"][task] = {"first_loss": losses[0], "last_loss": losses[-1]}

    tokens, _ = batch(np.random.default_rng(100), 0)
    quiet = onnxruntime.SessionOptions()
    quiet.log_severity_level = 3  # onnxruntime warns that overridable initializers are not constant-folded
    session = onnxruntime.InferenceSession(str(out / "unmerged.onnx"), quiet, providers=["CPUExecutionProvider"])
    for task in TASKS:
        adapter = onnxruntime.LoraAdapter()
        adapter.Load(str(out / f"{task}.onnx_adapter"))
        options = onnxruntime.RunOptions()
        options.add_active_adapter(adapter)
        logits = session.run(None, {"tokens": tokens}, options)[0]
        merged = onnxruntime.InferenceSession(str(out / f"merged_{task}.onnx"), providers=["CPUExecutionProvider"])
        predicted = logits.argmax(axis=1).reshape(tokens.shape)
        summary["tasks"][task]["max_difference_to_merged"] = float(
            np.abs(logits - merged.run(None, {"tokens": tokens})[0]).max()
        )
        summary["tasks"][task]["accuracy"] = {
            other: float((predicted == (tokens + shift) % VOCAB).mean()) for other, shift in TASKS.items()
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
