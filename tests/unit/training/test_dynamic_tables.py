"""Constant tables that follow a dynamic length or batch (a mask's flat indices, token-type ids, rotary
tables, causal masks) are rebuilt at run time from the sizes: one compiled step serves every length and
batch size, longer and larger ones than any seen included, and trains as eager does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from tests.helpers.one_graph import train_counting_graphs

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.compile, pytest.mark.filterwarnings("ignore")]
VOCAB = 32
TINY = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}


class _Masked(torch.nn.Module):
    """A ``transformers`` model called with an attention mask, returning its logits (a causal LM's
    flattened to (batch * tokens, vocab))."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids, attention_mask=mask).logits
        return logits if logits.dim() == 2 else logits.flatten(0, 1)


def _export(model: torch.nn.Module, directory: Path) -> None:
    torch.manual_seed(0)
    axes = {0: "batch", 1: "sequence"}
    generate_artifacts(
        _Masked(model),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        example_inputs=(torch.randint(0, VOCAB, (2, 8)), torch.ones(2, 8, dtype=torch.int64)),
        dynamic_axes={"ids": axes, "mask": axes, "output": {0: "rows"}},
    )


def _batches(shapes: list[tuple[int, int]], per_token: bool) -> list[tuple[np.ndarray, ...]]:
    """Token batches of ``shapes``, the first sequence's last token masked out; labels per token or per sequence."""
    rng = np.random.default_rng(0)
    batches = []
    for batch, length in shapes:
        ids = rng.integers(0, VOCAB, (batch, length))
        mask = np.ones_like(ids)
        mask[0, -1] = 0
        batches.append((ids, mask, rng.integers(0, VOCAB if per_token else 3, ids.size if per_token else batch)))
    return batches


REFUSED = ("stays fixed", "fixed shapes", " up to ")  # no axis stays fixed, none is bounded by the sizes seen


SHAPES = [(4, 16), (4, 16), (3, 16), (4, 9), (1, 23), (2, 16), (4, 31), (3, 7)]  # the batch x length per step
# the shapes, then a batch larger than any before it (its lengths 23 and 31 are longer than any before them)
SHAPES_AND_A_LARGER_BATCH = [*SHAPES, (6, 12)]


def test_t5_compiles_once_over_eight_shapes_with_batch_1_and_longer_lengths(tmp_path, caplog):
    """T5's relative-position buckets start from the distances between query and key positions, a table
    the conversion folds at the length it was made for: rebuilt from the length at run time (a relative
    table), it bounds nothing, so batch 1, new batch sizes and lengths longer than any seen reuse the one
    graph; its loss checks label indices against batch x length rows, which fixes no axis either.
    Traced by Dynamo and AOT autograd (backend "aot_eager"): the graph count is asserted, and the losses
    and parameters against eager's."""
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_decoder_layers=1, num_heads=2,
        dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model = transformers.T5ForConditionalGeneration(config)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids).logits.flatten(0, 1)

    torch.manual_seed(0)
    axes = {0: "batch", 1: "sequence"}
    generate_artifacts(
        Logits(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randint(0, VOCAB, SHAPES[0]), torch.ones(SHAPES[0], dtype=torch.int64)),
        dynamic_axes={"ids": axes, "mask": axes, "output": {0: "rows"}},
    )
    batches = _batches(SHAPES, per_token=True)
    refused = (*REFUSED, "reject")
    eager_losses, eager_parameters, _ = train_counting_graphs(tmp_path, batches, False, caplog, refused)
    losses, parameters, graphs = train_counting_graphs(tmp_path, batches, {"backend": "aot_eager"}, caplog, refused)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)


def _tiny_llama() -> torch.nn.Module:
    config = transformers.LlamaConfig(
        **TINY, num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64, use_cache=False
    )
    return transformers.LlamaForCausalLM(config)


def _tiny_bert() -> torch.nn.Module:
    config = transformers.BertConfig(
        **TINY, intermediate_size=32, max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0
    )
    config.attention_probs_dropout_prob = 0.0
    return transformers.BertForSequenceClassification(config)


@pytest.mark.slow
@pytest.mark.parametrize(("build", "per_token"), [(_tiny_llama, True), (_tiny_bert, False)], ids=["llama", "bert"])
def test_batch_1_longer_lengths_and_a_larger_batch_share_one_graph_under_inductor(tmp_path, caplog, build, per_token):
    """Llama's repeated key and value heads (unsqueeze, expand, reshape) and BERT's pooler (the first
    token, selected) each made inductor guard that the batch is not 1 (a reshaped broadcast's strides;
    the reinplacing of the select's backward), which compiled a second graph at batch 1: the compiled
    graph reshapes a contiguous copy and picks the token by index. Llama's rotary tables and causal mask
    are computed from the length at run time, not cut to the longest length seen; BERT's mask's flat
    indices (batch x length) and token-type ids neither fix the length nor bound the batch by the first
    one. One graph under inductor over the issue's 8 shapes (lengths 23 and 31 longer than any before
    them) and a batch larger than any before it, the losses and parameters eager's."""
    _export(build(), tmp_path)
    batches = _batches(SHAPES_AND_A_LARGER_BATCH, per_token=per_token)
    eager_losses, eager_parameters, _ = train_counting_graphs(tmp_path, batches, False, caplog, REFUSED)
    losses, parameters, graphs = train_counting_graphs(tmp_path, batches, {"backend": "inductor"}, caplog, REFUSED)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_a_vits_batch_1_shares_the_graph_of_eight_batches_under_inductor(tmp_path, caplog):
    """ViT's patch embedding (a convolution whose kernel is its stride) made torch ask which conv backend
    the batch's size picks, and the gradient of its small attention (products of heads of 16) reached an
    unsqueeze of a strided tensor that inductor views with a guard that the batch is not 1: batch 1
    compiled a second graph. The compiled graph multiplies the patches by the kernel and copies the
    gradient row-major. One graph under inductor over the issue's 8 batch sizes, the losses and
    parameters eager's."""
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=8,
        patch_size=4, num_labels=3, attn_implementation="eager",
    )  # fmt: skip
    vit = transformers.ViTForImageClassification(config)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = vit

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.vit(pixel_values=pixels).logits

    torch.manual_seed(0)
    generate_artifacts(
        Logits(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randn(2, 3, 8, 8),),
        input_names=["pixels"],
        dynamic_axes={"pixels": {0: "batch"}},
    )
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((batch, 3, 8, 8), dtype=np.float32), rng.integers(0, 3, batch)) for batch, _ in SHAPES
    ]
    eager_losses, eager_parameters, _ = train_counting_graphs(tmp_path, batches, False, caplog, REFUSED)
    losses, parameters, graphs = train_counting_graphs(tmp_path, batches, {"backend": "inductor"}, caplog, REFUSED)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)
