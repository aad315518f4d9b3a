"""A transformers BERT (built from a config, no download) through generate_artifacts with a dynamic sequence
length: it trains on batches of different lengths; exported without dynamic_axes, another length is refused
with an error naming the option."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore")

VOCAB, LABELS = 50, 3


class BertClassifier(torch.nn.Module):
    """BertForSequenceClassification returning its logits tensor (exporters need tensors out)."""

    def __init__(self) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        config = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
            num_labels=LABELS,
        )
        self.bert = transformers.BertForSequenceClassification(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).logits


def batch(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = rng.integers(0, VOCAB, (4, length), dtype=np.int64)
    return ids, np.ones_like(ids), (ids[:, 0] % LABELS).astype(np.int64)  # learnable: the first token's class


def open_module(directory) -> tuple[Module, Optimizer]:
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
    return module, Optimizer(directory / "optimizer_model.onnx", module)


@pytest.mark.slow
def test_bert_trains_with_a_dynamic_sequence_length(tmp_path) -> None:
    torch.manual_seed(0)
    example = (torch.randint(0, VOCAB, (2, 8)), torch.ones(2, 8, dtype=torch.int64))
    sequence = {0: "batch", 1: "sequence"}
    generate_artifacts(
        BertClassifier(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "dynamic",
        example_inputs=example,
        dynamic_axes={"input_ids": sequence, "attention_mask": sequence, "output": {0: "batch"}},
    )
    module, optimizer = open_module(tmp_path / "dynamic")
    optimizer.set_learning_rate(1e-2)
    rng = np.random.default_rng(0)
    lengths = [8, 5, 12] * 8
    losses = []
    for length in lengths:
        losses.append(float(module(*batch(rng, length))))
        optimizer.step()
        module.lazy_reset_grad()
    assert all(np.isfinite(losses))
    assert np.mean(losses[-4:]) < np.mean(losses[:4])  # it learns across lengths
    module.eval()
    assert np.isfinite(float(module(*batch(rng, 20))))  # a length never trained on

    generate_artifacts(
        BertClassifier(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path / "fixed",
        example_inputs=example,
    )
    fixed, _ = open_module(tmp_path / "fixed")
    with pytest.raises(InputError, match=r"Got: 5 Expected: 8 .*dynamic_axes=\{'input_ids': \{1: "):
        fixed(*batch(rng, 5))
