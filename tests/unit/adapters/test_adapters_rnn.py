"""RNN/GRU/LSTM converters: onnxruntime parity over directions, states, sequence lengths, clip,
peepholes and activations; the fused and per-timestep paths agree; float64 gradients."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ort_torch_train.adapters.rnn import Recurrent
from ort_torch_train.errors import ModelError, UnsupportedOperatorError
from tests.helpers.adapter_harness import check, check_gradients, convert_model, one_node_model, rand

SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 3
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def rnn_inputs(
    op_type: str,
    directions: int,
    *,
    bias=True,
    lengths=False,
    initial=False,
    peepholes=False,
    layout=0,
    dtype=np.float32,
) -> list:
    """X, W, R, B, sequence_lens, initial_h[, initial_c, P] (None where absent)."""
    gates = GATES[op_type]
    x = rand(SEQ, BATCH, INPUT, seed=1) if layout == 0 else rand(BATCH, SEQ, INPUT, seed=1)
    state = (directions, BATCH, HIDDEN) if layout == 0 else (BATCH, directions, HIDDEN)
    values = [
        x,
        rand(directions, gates * HIDDEN, INPUT, seed=2) * 0.5,
        rand(directions, gates * HIDDEN, HIDDEN, seed=3) * 0.5,
        rand(directions, 2 * gates * HIDDEN, seed=4) * 0.5 if bias else None,
        np.array([5, 0, 2], dtype=np.int32) if lengths else None,
        rand(*state, seed=5) if initial else None,
    ]
    if op_type == "LSTM":
        values += [
            rand(*state, seed=6) if initial else None,
            rand(directions, 3 * HIDDEN, seed=7) if peepholes else None,
        ]
    while values[-1] is None:
        values.pop()
    return [None if v is None else (v.astype(dtype) if v.dtype.kind == "f" else v) for v in values]


def _outputs(op_type: str) -> int:
    return 3 if op_type == "LSTM" else 2


CASES = [
    ("plain", {}, {}),
    ("states", {"initial": True}, {}),
    ("no_bias", {"bias": False, "initial": True}, {}),
    ("lengths", {"lengths": True, "initial": True}, {}),
    ("clip", {}, {"clip": 0.4}),
]


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("case, input_options, attrs", CASES, ids=[case[0] for case in CASES])
@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_matches_onnxruntime(op_type, case, input_options, attrs, direction):
    pytest.importorskip("onnxruntime")
    directions = 2 if direction == "bidirectional" else 1
    inputs = rnn_inputs(op_type, directions, **input_options)
    variants = [{"linear_before_reset": 0}, {"linear_before_reset": 1}] if op_type == "GRU" else [{}]
    for variant in variants:
        check(
            op_type,
            inputs,
            outputs=_outputs(op_type),
            opset=14,
            atol=1e-5,
            reference="ort",
            hidden_size=HIDDEN,
            direction=direction,
            **attrs,
            **variant,
        )


@pytest.mark.parametrize(
    "op_type, attrs, input_options",
    [
        ("LSTM", {}, {"peepholes": True, "initial": True, "lengths": True}),
        ("LSTM", {"input_forget": 1}, {"initial": True}),
        (
            "LSTM",
            {
                "activations": ["HardSigmoid", "LeakyRelu", "ScaledTanh"] * 2,
                "activation_alpha": [0.3, 0.1, 0.9, 0.25, 0.05, 1.1],
                "activation_beta": [0.4, 1.2, 0.6, 0.8],
            },
            {},
        ),
        (
            "GRU",
            {
                "activations": ["Softsign", "Elu", "Affine", "Softplus"],
                "activation_alpha": [0.7, 0.5],
                "activation_beta": [0.1],
            },
            {},
        ),
        ("RNN", {"activations": ["Relu", "ThresholdedRelu"], "activation_alpha": [0.1]}, {}),
        ("RNN", {"activations": ["Relu", "Relu"]}, {"initial": True}),
    ],
)
def test_activations_peepholes_input_forget_match_onnxruntime(op_type, attrs, input_options):
    pytest.importorskip("onnxruntime")
    inputs = rnn_inputs(op_type, 2, **input_options)
    check(
        op_type,
        inputs,
        outputs=_outputs(op_type),
        opset=14,
        atol=1e-5,
        reference="ort",
        hidden_size=HIDDEN,
        direction="bidirectional",
        **attrs,
    )


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_fused_and_looped_paths_agree(op_type, layout, direction):
    """The fused torch kernel and the per-timestep loop give the same outputs in both layouts."""
    directions = 2 if direction == "bidirectional" else 1
    inputs = rnn_inputs(op_type, directions, initial=True, layout=layout)
    attrs = {"linear_before_reset": 1} if op_type == "GRU" else {}
    model = one_node_model(
        op_type,
        inputs,
        outputs=_outputs(op_type),
        opset=14,
        hidden_size=HIDDEN,
        direction=direction,
        layout=layout,
        **attrs,
    )
    gm, tensors = convert_model(model, inputs)
    (node,) = [m for m in gm.modules() if isinstance(m, Recurrent)]
    assert node.config.fused
    fused = gm(*tensors)
    node.config = dataclasses.replace(node.config, fused=False)
    looped = gm(*tensors)
    expected_y = (BATCH, SEQ, directions, HIDDEN) if layout else (SEQ, directions, BATCH, HIDDEN)
    assert fused[0].shape == expected_y
    for got, expected in zip(fused, looped):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


def test_only_the_read_outputs_are_returned():
    inputs = rnn_inputs("LSTM", 1, initial=True)
    y = check("LSTM", inputs, outputs=1, opset=14, hidden_size=HIDDEN, atol=1e-5)
    assert y[0].shape == (SEQ, 1, BATCH, HIDDEN)


def test_unknown_activation_is_refused_naming_the_attribute():
    inputs = rnn_inputs("GRU", 1)
    model = one_node_model("GRU", inputs, outputs=2, opset=14, hidden_size=HIDDEN, activations=["Sigmoid", "Gelu"])
    with pytest.raises(UnsupportedOperatorError, match=r"activations.*'Gelu'"):
        convert_model(model, inputs)


@pytest.mark.parametrize(
    "op_type, attrs, input_options",
    [
        ("RNN", {"direction": "bidirectional"}, {"initial": True}),  # fused
        ("RNN", {"direction": "reverse"}, {"lengths": True}),  # looped
        ("GRU", {"direction": "bidirectional", "linear_before_reset": 1}, {"initial": True}),  # fused
        ("GRU", {"direction": "forward"}, {"lengths": True, "initial": True}),  # looped
        ("LSTM", {"direction": "bidirectional", "layout": 1}, {"initial": True, "layout": 1}),  # fused
        ("LSTM", {"direction": "forward"}, {"peepholes": True, "initial": True}),  # looped
    ],
)
def test_gradients(op_type, attrs, input_options):
    directions = 2 if attrs["direction"] == "bidirectional" else 1
    inputs = rnn_inputs(op_type, directions, **input_options)
    check_gradients(op_type, inputs, opset=14, hidden_size=HIDDEN, **attrs)


@pytest.mark.parametrize("op_type", ["RNN", "GRU", "LSTM"])
def test_opset_7_matches_onnxruntime(op_type):
    pytest.importorskip("onnxruntime")
    inputs = rnn_inputs(op_type, 1, initial=True, lengths=True)
    check(op_type, inputs, outputs=_outputs(op_type), opset=7, atol=1e-5, reference="ort", hidden_size=HIDDEN)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "looped"])
@pytest.mark.parametrize("op_type", ["GRU", "LSTM"])
def test_gradients_of_every_output(op_type, fused):
    """gradcheck (float64) of Y, Y_h (and Y_c) w.r.t. X, W, R, B and the initial states."""
    inputs = rnn_inputs(op_type, 2, initial=True, dtype=np.float64)
    attrs = {"linear_before_reset": 1} if op_type == "GRU" else {}
    model = one_node_model(
        op_type, inputs, outputs=_outputs(op_type), opset=14, hidden_size=HIDDEN, direction="bidirectional", **attrs
    )
    gm, tensors = convert_model(model, inputs, training=True)
    (node,) = [m for m in gm.modules() if isinstance(m, Recurrent)]
    node.config = dataclasses.replace(node.config, fused=fused)
    leaves = [t.requires_grad_() for t in tensors]
    assert torch.autograd.gradcheck(lambda *args: tuple(gm(*args)), leaves, eps=1e-6, atol=1e-5)


def test_a_misshapen_weight_is_named():
    inputs = rnn_inputs("LSTM", 1)
    inputs[2] = inputs[2][:, :, :2]  # R with hidden 2 while W has 4 * 3 rows
    model = one_node_model("LSTM", inputs, outputs=3, opset=14)
    with pytest.raises(ModelError, match=r"LSTM: input W must have shape \[1, 8, 4\].*got \[1, 12, 4\]"):
        convert_model(model, inputs)
