"""Tensor parallel's checks that need no ranks: the weight pairs found in real training graphs, the
option's validation, and the legacy settings it answers (the runs on gloo ranks are in
tests/integration/test_tensor_parallel.py)."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import fx

from ort_torch_train.distributed.tensor_parallel import check_tensor_parallel_size
from ort_torch_train.distributed.tensor_parallel_patterns import (
    LinearLayer,
    WeightPair,
    _converted_pair,
    find_weight_pairs,
)
from ort_torch_train.errors import DistributedError, ModelError
from ort_torch_train.graph.layout import forward_graph, training_layout
from ort_torch_train.legacy.parameters import SLICED_REASON, UNSUPPORTED_SETTINGS
from ort_torch_train.passes.onednn_linear import LINEARS
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.options import EngineOptions
from tests.helpers.legacy_models import WEIGHTS, forward_model, params_for, session
from tests.helpers.paths import FIXTURES


def pairs_of(graph: onnx.GraphProto, shapes: dict) -> tuple[list[tuple], list[str]]:
    """The pairs of a forward ``graph`` over the parameters ``shapes``, as tuples, and the unmatched layers."""
    pairs, unmatched = find_weight_pairs(graph, shapes)
    found = [(p.column.weight, p.activation, p.row.weight, p.column.bias, p.column.out_features) for p in pairs]
    return found, unmatched


def artifacts(fixture: str) -> tuple[onnx.GraphProto, dict]:
    """A fixture's forward training graph and its parameters' shapes."""
    folder = FIXTURES / fixture / "artifacts"
    model, state = onnx.load(folder / "training_model.onnx"), TrainingState.load(folder / "checkpoint")
    shapes = {name: tuple(param.shape) for name, param in state.params.items()}
    return forward_graph(model, training_layout(model, shapes), initializers=False), shapes


def test_the_transformer_mlp_is_a_pair_and_the_attention_is_named_as_unmatched() -> None:
    found, unmatched = pairs_of(*artifacts("transformer"))
    assert found == [("enc.linear1.weight", "Relu", "enc.linear2.weight", "enc.linear1.bias", 32)]
    assert unmatched == ["enc.self_attn.in_proj_weight", "enc.self_attn.out_proj.weight", "head.weight"]


@pytest.mark.parametrize(
    "fixture, expected",
    [
        ("mlp_ce_adamw_sched", [("0.weight", "Relu", "2.weight", "0.bias", 32)]),
        ("regress_mse_sgd", [("0.weight", "Tanh", "2.weight", "0.bias", 16)]),
        ("bce", []),
    ],
)
def test_pairs_of_the_fixtures(fixture: str, expected: list) -> None:
    found, _ = pairs_of(*artifacts(fixture))
    assert found == expected


def test_a_gemm_pair_with_transposed_weights() -> None:
    model = forward_model()
    found, unmatched = pairs_of(
        model.graph, {i.name: tuple(i.dims) for i in model.graph.initializer if i.name in WEIGHTS}
    )
    assert found == [("fc1.weight", "Relu", "fc2.weight", "fc1.bias", 6)] and unmatched == []


@pytest.mark.parametrize("value", [0, -2, 1.5, True, "2"])
def test_a_bad_size_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="tensor_parallel_size: expected an int >= 1"):
        check_tensor_parallel_size(value)


def test_tensor_parallel_needs_a_process_group_and_eager_steps() -> None:
    with pytest.raises(DistributedError, match="tensor_parallel_size=2: expected an initialised process group"):
        EngineOptions.of(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="expected eager steps"):
        EngineOptions.of(tensor_parallel_size=2, compile=True)
    assert EngineOptions.of(tensor_parallel_size=1).tensor_parallel is None


def test_horizontal_parallel_size_is_no_longer_refused_and_needs_its_ranks() -> None:
    assert "horizontal_parallel_size" not in UNSUPPORTED_SETTINGS
    with pytest.raises(NotImplementedError, match="data_parallel_size \\* horizontal_parallel_size == world_size"):
        session(params_for(horizontal_parallel_size=2))


@pytest.mark.parametrize("name", ["sliced_schema", "sliced_axes", "sliced_tensor_names"])
def test_sliced_settings_are_refused_naming_what_they_describe(name: str) -> None:
    value = ["x"] if name == "sliced_tensor_names" else {"x": [0]}
    with pytest.raises(NotImplementedError, match="pipeline cuts into micro-batches"):
        session(params_for(**{name: value}))
    assert UNSUPPORTED_SETTINGS[name][1] == SLICED_REASON


@pytest.mark.parametrize("linear", LINEARS)
def test_a_converted_pair_is_found_in_either_linear_form(linear: object) -> None:
    """Large products are converted to oneDNN's ``linear``, small ones stay ``F.linear``: both are a pair's."""
    graph = fx.Graph()
    x, w1, b1, w2, b2 = (graph.placeholder(name) for name in ("x", "w1", "b1", "w2", "b2"))
    hidden = graph.call_function(linear, (x, w1, b1))
    activation = graph.call_function(torch.relu, (hidden,))
    graph.output(graph.call_function(linear, (activation, w2, b2)))
    pair = WeightPair(LinearLayer("w1", "b1", "h", "x", 8), "Relu", LinearLayer("w2", "b2", "y", "r", 4))
    by_name = {"x": x, "w1": w1, "b1": b1, "w2": w2, "b2": b2}
    assert _converted_pair(pair, by_name) == (hidden, activation, list(activation.users)[0])
    activation.target = torch.exp  # not an activation of the pattern: the pair is named as lost
    with pytest.raises(ModelError, match="w1 -> Relu -> w2 of the ONNX graph is not two linear layers"):
        _converted_pair(pair, by_name)
