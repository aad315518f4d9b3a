"""The lean softmax cross-entropy (no log-probabilities kept; scores reduced a block of positions at a time)
against log_softmax + nll_loss, alone and in a tiny int4 LoRA step: same loss and adapter gradients."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.adapters import lean_cross_entropy, matmul_nbits
from ort_torch_train.adapters.lean_cross_entropy import LeanSoftmaxCrossEntropy
from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.artifacts import LossType, generate_artifacts
from ort_torch_train.lora import LoraConfig

VOCAB, HIDDEN, BLOCK = 64, 32, 32


@pytest.mark.parametrize("shape", [(2, 7, VOCAB), (9, VOCAB)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_lean_cross_entropy_matches_log_softmax_and_nll_loss(shape, reduction, monkeypatch):
    monkeypatch.setattr(lean_cross_entropy, "BLOCK_ELEMENTS", 3 * VOCAB)  # several blocks per batch row
    logits = torch.randn(*shape) * 3
    labels = torch.randint(0, VOCAB, shape[:-1])
    labels.view(-1)[[1, 4]] = -100
    results = []
    for lean in (True, False):
        leaf = logits.clone().requires_grad_()
        # a language model's shifted [B, V, T - 1] view of [B, T, V] logits, or [N, C] scores as they are
        scores, target = (leaf[:, :-1].transpose(1, 2), labels[:, 1:]) if len(shape) == 3 else (leaf, labels)
        if lean:
            loss = LeanSoftmaxCrossEntropy.apply(scores, target, -100, reduction)
        else:
            loss = F.nll_loss(torch.log_softmax(scores, 1), target, ignore_index=-100, reduction=reduction)
        (loss * 1.5).backward()
        results.append((loss.detach(), leaf.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-6, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-6, atol=1e-7)


def test_lean_cross_entropy_keeps_only_the_scores_and_per_position_values():
    logits = torch.randn(1, 9, VOCAB, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        LeanSoftmaxCrossEntropy.apply(logits[:, :-1].transpose(1, 2), torch.zeros(1, 8, dtype=torch.long), -100, "mean")
    large = [t for t in saved if t.numel() >= VOCAB]
    assert [t.untyped_storage().data_ptr() for t in large] == [logits.untyped_storage().data_ptr()]


def tiny_int4_lm() -> onnx.ModelProto:
    """ids -> Gather(float embedding) -> MatMulNBits(down_proj) -> MatMulNBits(lm_head) -> logits [B, T, V]."""
    generator = np.random.default_rng(0)

    def packed(n: int, name: str) -> list[onnx.TensorProto]:
        weight = generator.integers(0, 256, (n, HIDDEN // BLOCK, BLOCK // 2), dtype=np.uint8)
        scales = (generator.random(n * HIDDEN // BLOCK) * 0.2 + 0.05).astype(np.float32)
        return [numpy_helper.from_array(weight, f"{name}_Q4"), numpy_helper.from_array(scales, f"{name}_scales")]

    def nbits(x: str, name: str, n: int, y: str) -> onnx.NodeProto:
        inputs = [x, f"{name}_Q4", f"{name}_scales"]
        return helper.make_node(
            "MatMulNBits", inputs, [y], domain="com.microsoft", K=HIDDEN, N=n, bits=4, block_size=BLOCK
        )

    embedding = generator.standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    down, head = "model.layers.0.mlp.down_proj.MatMul.weight", "lm_head.MatMul.weight"
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["embed.weight", "input_ids"], ["hidden"]),
            nbits("hidden", down, HIDDEN, "mixed"),
            nbits("mixed", head, VOCAB, "logits"),
        ],
        "tiny_int4_lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "T"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "T", VOCAB])],
        [numpy_helper.from_array(embedding, "embed.weight"), *packed(HIDDEN, down), *packed(VOCAB, head)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def test_int4_lora_step_has_the_losses_and_adapter_gradients_of_log_softmax_and_nll_loss(tmp_path: Path, monkeypatch):
    generate_artifacts(
        tiny_int4_lm(),
        loss=LossType.LanguageModelLoss,
        artifact_directory=tmp_path,
        lora=LoraConfig(r=2, alpha=4, targets=["*down_proj*"]),
    )
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 9)).astype(np.int64)
    labels = ids.copy()
    labels[0, 4] = labels[1, 2] = -100
    monkeypatch.setattr(matmul_nbits, "CHUNK_ELEMENTS", 5 * HIDDEN)  # weights dequantised in several row blocks
    monkeypatch.setattr(lean_cross_entropy, "BLOCK_ELEMENTS", 3 * VOCAB)
    runs = []
    for lean_from in (0, 1 << 40):  # the lean loss at every size, and never (log_softmax + nll_loss)
        monkeypatch.setattr(lean_cross_entropy, "LEAN_FROM_ELEMENTS", lean_from)
        state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
        module = Module(tmp_path / "training_model.onnx", state)
        loss = float(module(ids, labels))
        params = module.training_state.params
        runs.append((loss, {name: p.grad.clone() for name, p in params.items() if p.requires_grad}))
    (lean_loss, lean_grads), (loss, grads) = runs
    assert sorted(lean_grads) == sorted(grads) and len(grads) == 2
    np.testing.assert_allclose(lean_loss, loss, rtol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(lean_grads[name], grad, rtol=1e-6, atol=1e-6 * float(grad.abs().max()))
