"""The legacy recompute settings: torch.utils.checkpoint of GELUs, attention dropouts and transformer layers.

Each must give the losses, gradients and trained weights of the run without recomputation (dropout
is active: the masks are replayed), keep fewer tensors for backward, and warn when the graph has
nothing to recompute (ORT then silently leaves the graph alone).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ort_torch_train.legacy import TrainingSession
from ort_torch_train.passes import onednn_linear
from tests.helpers.legacy_bert import LR, STEPS, Bert, bert_batches, bert_parameters, export_bert
from tests.helpers.paths import FIXTURES


@pytest.fixture(scope="session")
def bert(tmp_path_factory) -> Path:
    """A 3-layer post-LN BERT-style encoder with its loss."""
    torch.manual_seed(0)
    return export_bert(Bert(), tmp_path_factory.mktemp("bert") / "bert.onnx")


def _train(path: Path, feeds: list[dict], loss: str = "loss", **settings):
    """Losses, first-run gradients, final state, saved-for-backward bytes and checkpointed segment count."""
    model = onnx.load(path)
    session = TrainingSession(str(path), bert_parameters(model, loss, **settings))
    torch.manual_seed(0)
    losses = []
    for step, feed in enumerate(feeds):
        losses.append(float(session.run([loss], {**feed, **LR})[0]))
        if step == 0:
            grads = {n: p.grad.clone() for n, p in session.training_state.params.items() if p.grad is not None}
    engine = session._engine
    inputs = [torch.from_numpy(v) for v in feeds[0].values()]
    storages = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    params = [session.training_state.params[n] for n in engine.train_layout.params]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        engine.train_graph(inputs, params)
    module = engine.train_graph.module_for(inputs, params)
    segments = sum(hasattr(child, "segment") for child in module.children())
    return losses, grads, session.get_state(), sum(storages.values()), segments


@pytest.fixture(scope="session")
def baseline(bert):
    """The run without recomputation."""
    feeds = bert_batches(np.random.default_rng(1))
    return feeds, _train(bert, feeds)


@pytest.mark.parametrize(
    "settings, segments",
    [
        ({"gelu_recompute": True}, 3),
        ({"attn_dropout_recompute": True}, 3),
        ({"transformer_layer_recompute": True}, 2),  # 0: every layer but the last (ORT's default)
        ({"transformer_layer_recompute": True, "number_recompute_layers": 1}, 1),
        (
            {
                "transformer_layer_recompute": True,
                "number_recompute_layers": 1,
                "gelu_recompute": True,
                "attn_dropout_recompute": True,
            },
            5,
        ),  # layer 0 whole, the GELU and dropout of layers 1 and 2
    ],
)
def test_recompute_settings_match_the_run_without_them(bert, baseline, settings, segments):
    feeds, (losses, grads, state, saved, none) = baseline
    assert none == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r_losses, r_grads, r_state, r_saved, r_segments = _train(bert, feeds, **settings)
    assert r_segments == segments
    assert r_saved < saved
    np.testing.assert_allclose(r_losses, losses, rtol=0, atol=1e-6)
    assert len(set(losses)) == STEPS
    for name, grad in grads.items():
        np.testing.assert_allclose(r_grads[name].numpy(), grad.numpy(), rtol=0, atol=1e-6, err_msg=name)
    for name, value in state.items():
        np.testing.assert_allclose(r_state[name], value, rtol=0, atol=1e-6, err_msg=name)


def test_a_gelu_read_by_onednn_products_is_recomputed_too(bert, monkeypatch):
    monkeypatch.setattr(onednn_linear, "EAGER_MIN_MACS", 0)  # every float32 linear through onednn_linear.linear
    feeds = bert_batches(np.random.default_rng(1))[:1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "no GELU read by a MatMul" before linear counted as one
        *_, segments = _train(bert, feeds, gelu_recompute=True)
    assert segments == 3


def test_number_recompute_layers_beyond_the_last_layer_is_clipped_with_a_warning(bert):
    feeds = bert_batches(np.random.default_rng(1))[:1]
    with pytest.warns(UserWarning, match="number_recompute_layers 5 is larger than the limit 2"):
        *_, segments = _train(bert, feeds, transformer_layer_recompute=True, number_recompute_layers=5)
    assert segments == 2


def test_pre_layer_norm_layers_are_found_too(tmp_path):
    torch.manual_seed(0)
    path = export_bert(Bert(layers=3, pre_ln=True), tmp_path / "pre_ln.onnx")
    feeds = bert_batches(np.random.default_rng(1))[:2]
    losses, grads, _, saved, _ = _train(path, feeds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r_losses, r_grads, _, r_saved, segments = _train(path, feeds, transformer_layer_recompute=True)
    assert segments == 2 and r_saved < saved
    np.testing.assert_allclose(r_losses, losses, rtol=0, atol=1e-6)
    for name, grad in grads.items():
        np.testing.assert_allclose(r_grads[name].numpy(), grad.numpy(), rtol=0, atol=1e-6, err_msg=name)


def _transformer_fixture_with_loss(tmp_path: Path) -> Path:
    """The transformer fixture's forward model (1 ReLU layer, no dropout) with a cross-entropy loss output."""
    model = onnx.load(FIXTURES / "transformer" / "base_model.onnx")
    model.graph.input.append(helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"]))
    model.graph.node.append(helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss"]))
    model.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    path = tmp_path / "transformer_with_loss.onnx"
    onnx.save(model, path)
    return path


def test_a_graph_without_the_patterns_warns_and_trains_unchanged(tmp_path):
    path = _transformer_fixture_with_loss(tmp_path)
    rng = np.random.default_rng(0)
    feeds = [
        {
            "input": rng.standard_normal((4, 6, 16)).astype(np.float32),
            "mask": np.ones((4, 6), np.float32),
            "labels": rng.integers(0, 4, 4).astype(np.int64),
        }
        for _ in range(2)
    ]
    losses, _, state, saved, _ = _train(path, feeds)
    for setting, message in [
        ("gelu_recompute", "gelu_recompute: the graph has no GELU read by a MatMul"),
        ("attn_dropout_recompute", "attn_dropout_recompute: the graph has no Dropout between a Softmax and a MatMul"),
        ("transformer_layer_recompute", "the graph has 1 transformer layer"),
    ]:
        with pytest.warns(UserWarning, match=message):
            r_losses, _, r_state, r_saved, segments = _train(path, feeds, **{setting: True})
        assert segments == 0 and r_saved == saved
        assert r_losses == losses
        for name, value in state.items():
            np.testing.assert_array_equal(r_state[name], value, err_msg=name)


def test_recompute_setting_errors(bert):
    model = onnx.load(bert)
    with pytest.raises(ValueError, match="number_recompute_layers must be an int >= 0"):
        TrainingSession(
            str(bert), bert_parameters(model, "loss", transformer_layer_recompute=True, number_recompute_layers=-1)
        )
    with pytest.warns(UserWarning, match="no effect without transformer_layer_recompute"):
        TrainingSession(str(bert), bert_parameters(model, "loss", number_recompute_layers=2))
    with pytest.raises(NotImplementedError, match="use_memory_efficient_gradient.*torch.utils.checkpoint"):
        TrainingSession(str(bert), bert_parameters(model, "loss", use_memory_efficient_gradient=True))
