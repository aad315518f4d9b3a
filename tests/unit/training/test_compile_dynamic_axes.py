"""Dynamic axes that hold in a compiled step: an LSTM's length (torch's fused kernel as one opaque call
with a backward of its own) compiles once over new batch sizes, batch 1 and longer lengths, and trains
as eager does; the opaque call's gradients are the fused kernel's, for RNN, GRU and LSTM in every
direction. Bidirectional RNN, GRU and LSTM taggers keep batch 1 in the graph of the other sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ort_torch_train.adapters.rnn_fused import fused_kernel, fused_recurrent
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from tests.helpers.one_graph import train_counting_graphs

pytestmark = pytest.mark.filterwarnings("ignore")
SHAPES = [(4, 16), (4, 16), (3, 16), (4, 9), (1, 23), (2, 16), (4, 31), (3, 7)]  # batch x length per step
REFUSED = ("stays fixed", "fixed shapes", " up to ", "runs uncompiled", "specialised")


@pytest.mark.parametrize(
    ("op_type", "direction", "relu"),
    [("LSTM", "bidirectional", False), ("GRU", "reverse", False), ("RNN", "forward", True)],
)
def test_the_opaque_fused_kernel_has_the_kernels_gradients(op_type, direction, relu):
    """torch.func.grad through the opaque call (forward op, backward op) against autograd through the kernel."""
    torch.manual_seed(0)
    directions, gates, hidden = 2 if direction == "bidirectional" else 1, {"RNN": 1, "GRU": 3, "LSTM": 4}[op_type], 3
    x = torch.randn(5, 2, 4)
    w, r = torch.randn(directions, gates * hidden, 4), torch.randn(directions, gates * hidden, hidden)
    b, h0 = torch.randn(directions, 2 * gates * hidden), torch.randn(directions, 2, hidden)
    c0 = torch.randn(directions, 2, hidden) if op_type == "LSTM" else None

    def loss(run, x, w, r, b, h0):
        y, y_h, y_c = run(op_type, direction, relu, x, w, r, b, h0, c0)
        return (
            (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum()
            + y_h.sum()
            + (0 if y_c is None else y_c.sum())
        )

    expected = torch.func.grad(loss, argnums=(1, 2, 3, 4, 5))(fused_kernel, x, w, r, b, h0)
    found = torch.func.grad(loss, argnums=(1, 2, 3, 4, 5))(fused_recurrent, x, w, r, b, h0)
    for a, e in zip(found, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-6)


class _Tagger(nn.Module):
    """Token embedding -> recurrent layer (``kind``: "LSTM", "GRU" or "RNN") -> mean over time -> linear."""

    def __init__(self, kind: str = "LSTM", bidirectional: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 2)
        self.recurrent = getattr(nn, kind)(2, 2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(4 if bidirectional else 2, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.recurrent(self.embed(tokens))[0].mean(1))


def _tagger_compiles_once(tagger: nn.Module, directory, caplog) -> None:
    """``tagger`` exported with batch and length dynamic trains in one aot_eager graph over ``SHAPES``,
    the losses and parameters eager's."""
    generate_artifacts(
        tagger,
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
        example_inputs=(torch.randint(0, 12, SHAPES[0]),),
        input_names=["tokens"],
        dynamic_axes={"tokens": {0: "batch", 1: "sequence"}},
    )
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 12, shape), rng.integers(0, 3, shape[0])) for shape in SHAPES]
    eager_losses, eager_parameters, _ = train_counting_graphs(directory, batches, False, caplog, REFUSED)
    losses, parameters, graphs = train_counting_graphs(directory, batches, {"backend": "aot_eager"}, caplog, REFUSED)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)


@pytest.mark.compile
def test_an_lstm_compiles_once_over_eight_shapes_with_batch_1_and_longer_lengths(tmp_path, caplog):
    """torch.nn.LSTM exported to the ONNX LSTM op, batch and length dynamic: one graph for every shape,
    the losses and parameters eager's. Traced by Dynamo and AOT autograd (backend "aot_eager")."""
    torch.manual_seed(0)
    _tagger_compiles_once(_Tagger(), tmp_path, caplog)


@pytest.mark.compile
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_bidirectional_rnn_compiles_once_with_batch_1(tmp_path, caplog, kind):
    """A bidirectional layer's output is exported as a Transpose then a Reshape merging the two directions,
    (length, batch, 2, hidden) -> (length, batch, 2 hidden): a view only at batch 1, which Dynamo guarded
    on (a second graph at batch 1). Compiled, the merge reads a row-major copy: one graph over the 8
    shapes, the losses and parameters eager's."""
    torch.manual_seed(0)
    _tagger_compiles_once(_Tagger(kind, bidirectional=True), tmp_path, caplog)


@pytest.mark.compile
@pytest.mark.slow
def test_a_dynamo_exported_whisper_compiles_once_over_eight_shapes(tmp_path, caplog):
    """A Whisper-shaped encoder-decoder exported by torch.onnx.export(dynamo=True), batch and decoder length
    dynamic: the GatherND index tuples its attention masks are built from (batch x length grids, stacked)
    are rebuilt from the sizes at run time, so that neither axis is bounded by the first batch. One graph,
    the losses and parameters eager's. Traced by Dynamo and AOT autograd (backend "aot_eager")."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    vocab, mel, frames = 32, 4, 16
    config = transformers.WhisperConfig(
        vocab_size=vocab, num_mel_bins=mel, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_source_positions=frames // 2,
        max_target_positions=64, dropout=0.0, use_cache=False, pad_token_id=0, decoder_start_token_id=1,
        attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(config)

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, features: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_features=features, decoder_input_ids=ids).logits.flatten(0, 1)

    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    generate_artifacts(
        Logits(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randn(SHAPES[0][0], mel, frames), torch.randint(0, vocab, SHAPES[0])),
        input_names=["features", "ids"],
        exporter="dynamo",
        dynamic_shapes={"features": {0: batch}, "ids": {0: batch, 1: length}},
    )
    rng = np.random.default_rng(0)
    batches = [
        (
            rng.standard_normal((b, mel, frames), dtype=np.float32),
            rng.integers(0, vocab, (b, n)),
            rng.integers(0, vocab, b * n),
        )
        for b, n in SHAPES
    ]
    eager_losses, eager_parameters, _ = train_counting_graphs(tmp_path, batches, False, caplog, REFUSED)
    losses, parameters, graphs = train_counting_graphs(tmp_path, batches, {"backend": "aot_eager"}, caplog, REFUSED)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)


class _KeyPadded(nn.Module):
    """Token embedding -> attention whose key padding mask is picked per (row, query, key) by advanced
    indexing (GatherND's index tuples over batch x length grids once exported, as a Whisper's masks) ->
    linear, per token."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(12, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        batch, length = tokens.shape
        rows = torch.arange(batch)[:, None, None].expand(batch, length, length)
        keys = torch.arange(length)[None, None, :].expand(batch, length, length)
        kept = (tokens != 0)[rows, keys]
        hidden = self.embed(tokens)
        scores = (hidden @ hidden.transpose(1, 2)).masked_fill(~kept, -1e4)
        return self.head(scores.softmax(-1) @ hidden).flatten(0, 1)


@pytest.mark.compile
@pytest.mark.slow
def test_gather_nd_over_batch_by_length_grids_compiles_once_with_batch_1_under_inductor(tmp_path, caplog):
    """A dynamo export's GatherND index tuples (batch x length grids, stacked): their range check takes
    each column narrowed, not selected, since inductor lowers a selected column of a stored strided
    tensor through a view that guards every size against 1 (a second graph at batch 1). One graph
    under inductor over the issue's 8 shapes, the losses and parameters eager's."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    generate_artifacts(
        _KeyPadded(),
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=tmp_path,
        example_inputs=(torch.randint(0, 12, SHAPES[0]),),
        input_names=["tokens"],
        exporter="dynamo",
        dynamic_shapes={"tokens": {0: batch, 1: length}},
    )
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 12, shape), rng.integers(0, 3, shape[0] * shape[1])) for shape in SHAPES]
    eager_losses, eager_parameters, _ = train_counting_graphs(tmp_path, batches, False, caplog, REFUSED)
    losses, parameters, graphs = train_counting_graphs(tmp_path, batches, {"backend": "inductor"}, caplog, REFUSED)
    assert graphs == 1
    np.testing.assert_allclose(losses, eager_losses, rtol=0, atol=1e-6)
    np.testing.assert_allclose(parameters, eager_parameters, rtol=0, atol=1e-6)
