"""The legacy ``TrainingSession`` against the Module/Optimizer path, a float64 re-implementation of
ORT's legacy optimizer formulas, and ORT's configuration rules."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.api import Module, Optimizer
from ort_torch_train.checkpoint.state import TrainingState
from ort_torch_train.errors import CheckpointError, InputError, InputTypeError, ModelError
from ort_torch_train.legacy import RunOptions, TrainingParameters, TrainingSession
from ort_torch_train.legacy.parameters import UNSUPPORTED_SETTINGS
from ort_torch_train.legacy.providers import choose_provider

F32 = lambda x: float(np.float32(x))  # noqa: E731
WEIGHTS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
LR = "Learning_Rate"


# ---- fixtures: a forward model with its loss as an output ---------------------------------------
def forward_model(seed: int = 0) -> onnx.ModelProto:
    """x -> Gemm -> Relu -> Gemm -> Mul(scale) -> Reshape(shape) -> logits; loss = CE(logits, y).

    ``scale`` is a scalar float initializer (1.0), ``shape`` an int64 one read at Reshape's
    stop-gradient input, ``unused.weight`` is read by no node. Outputs: [logits, loss].
    """
    rng = np.random.default_rng(seed)
    init = lambda name, shape: numpy_helper.from_array(  # noqa: E731
        (rng.standard_normal(shape) * 0.4).astype(np.float32), name)
    nodes = [helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["z"], transB=1),
             helper.make_node("Mul", ["z", "scale"], ["zs"]),
             helper.make_node("Reshape", ["zs", "shape"], ["logits"]),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "y"], ["loss"], reduction="mean")]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("y", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3]),
         helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
        [init("fc1.weight", (6, 4)), init("fc1.bias", (6,)), init("fc2.weight", (3, 6)), init("fc2.bias", (3,)),
         numpy_helper.from_array(np.array(1.0, np.float32), "scale"),
         numpy_helper.from_array(np.array([-1, 3], np.int64), "shape"),
         init("unused.weight", (2,))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.metadata_props.add(key="author", value="legacy-tests")
    return model


def batches(count: int, seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((5, 4)).astype(np.float32), rng.integers(0, 3, 5).astype(np.int64))
            for _ in range(count)]


def lrs(count: int) -> list[float]:
    return [F32(0.05 - 0.004 * i) for i in range(count)]


def params_for(optimizer: str = "AdamOptimizer", weights=WEIGHTS, floats=None, ints=None,
               **settings) -> TrainingParameters:
    p = TrainingParameters()
    p.loss_output_name = "loss"
    p.immutable_weights = {"Mul": [(1, 1.0)]}  # keep `scale` a constant: the trained set is WEIGHTS
    p.training_optimizer_name = optimizer
    p.optimizer_attributes_map = {w: dict(floats or {}) for w in weights}
    p.optimizer_int_attributes_map = {w: dict(ints or {}) for w in weights}
    for name, value in settings.items():
        setattr(p, name, value)
    return p


def session(parameters: TrainingParameters, **kwargs) -> TrainingSession:
    return TrainingSession(forward_model().SerializeToString(), parameters, **kwargs)


def train(sess: TrainingSession, data, rates, lr_name: str = LR) -> list[float]:
    return [float(sess.run(["loss"], {"x": x, "y": y, lr_name: np.array([lr], np.float32)})[0])
            for (x, y), lr in zip(data, rates)]


def initial(name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in forward_model().graph.initializer if i.name == name)


# ---- the Module/Optimizer path on hand-built equivalent artifacts ------------------------------------
def training_artifact(forward: onnx.ModelProto) -> onnx.ModelProto:
    """The forward graph with WEIGHTS as graph inputs and the loss as first output."""
    model = onnx.ModelProto()
    model.CopyFrom(forward)
    graph = model.graph
    moved = [i for i in graph.initializer if i.name in WEIGHTS]
    kept = [i for i in graph.initializer if i.name not in WEIGHTS]
    graph.input.extend(helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in moved)
    del graph.initializer[:]
    graph.initializer.extend(kept)
    logits, loss = list(graph.output)
    del graph.output[:]
    graph.output.extend([loss, logits])
    return model


def optimizer_artifact(op: str, **attributes) -> bytes:
    seq = lambda n: helper.make_tensor_sequence_value_info(n, TensorProto.FLOAT, None)  # noqa: E731
    inputs = [helper.make_tensor_value_info("learning_rate", TensorProto.FLOAT, [1]),
              helper.make_tensor_value_info("step", TensorProto.INT64, [1]),
              seq("params"), seq("gradients"), seq("first_order_moments")]
    if op == "AdamWOptimizer":
        inputs.append(seq("second_order_moments"))
        node_inputs = ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"]
    else:
        node_inputs = ["learning_rate", "params", "gradients"]
    node = helper.make_node(op, node_inputs, ["flag"], domain="com.microsoft", **attributes)
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [1])
    graph = helper.make_graph([node], "optimizer", inputs, [flag])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def module_losses(optimizer_bytes: bytes, data, rates) -> tuple[list[float], dict[str, np.ndarray]]:
    forward = forward_model()
    state = TrainingState({n: torch.nn.Parameter(torch.from_numpy(initial(n).copy())) for n in WEIGHTS})
    model = training_artifact(forward)
    module = Module(model, state, model)
    optimizer = Optimizer(optimizer_bytes, module)
    losses = []
    for (x, y), lr in zip(data, rates):
        losses.append(float(module(x, y)[0]))
        optimizer.set_learning_rate(lr)
        optimizer.step()
        module.lazy_reset_grad()
    return losses, {n: state.params[n].detach().numpy().copy() for n in WEIGHTS}


def test_sgd_matches_the_module_path():
    data, rates = batches(6), lrs(6)
    sess = session(params_for("SGDOptimizer"))
    losses = train(sess, data, rates)
    expected, weights = module_losses(optimizer_artifact("SGDOptimizerV2"), data, rates)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-6)
    for name, value in sess.get_model_state()["full_precision"].items():
        np.testing.assert_allclose(value, weights[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", [0, 1])
def test_adam_matches_the_module_path(mode):
    data, rates = batches(8), lrs(8)
    floats = {"alpha": 0.9, "beta": 0.999, "lambda": 0.01, "epsilon": 1e-6}
    sess = session(params_for(floats=floats, ints={"weight_decay_mode": mode}, enable_grad_norm_clip=False))
    losses = train(sess, data, rates)
    adamw = optimizer_artifact("AdamWOptimizer", alpha=0.9, beta=0.999, epsilon=1e-6, weight_decay=0.01,
                               adam_mode=mode, correct_bias=1)
    expected, weights = module_losses(adamw, data, rates)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-6)
    for name, value in sess.get_model_state()["full_precision"].items():
        np.testing.assert_allclose(value, weights[name], rtol=0, atol=1e-6)


# ---- a float64 re-implementation of the legacy formulas -----------------------------------------------
def reference_run(data, rates, floats: dict[str, dict], ints: dict[str, dict], steps: int, clip: bool):
    """Forward, backward, accumulation (mean of `steps` gradients), global-norm clipping and ORT's
    legacy AdamOptimizer formulas, all in float64."""
    w = {n: torch.tensor(initial(n), dtype=torch.float64) for n in WEIGHTS}
    m = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    v = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    acc = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    count, t, losses = 0, 1, []
    for (x, y), lr in zip(data, rates):
        leaves = {n: w[n].clone().requires_grad_() for n in WEIGHTS}
        h = torch.relu(torch.from_numpy(x).double() @ leaves["fc1.weight"].T + leaves["fc1.bias"])
        logits = h @ leaves["fc2.weight"].T + leaves["fc2.bias"]
        loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
        grads = torch.autograd.grad(loss, [leaves[n] for n in WEIGHTS])
        losses.append(loss.item())
        for n, g in zip(WEIGHTS, grads):
            acc[n] += g
        count += 1
        if count < steps:
            continue
        g = {n: acc[n] / steps for n in WEIGHTS}
        norm = math.sqrt(sum(float((g[n] ** 2).sum()) for n in WEIGHTS))
        for n in WEIGHTS:
            a = {"alpha": 0.9, "beta": 0.999, "lambda": 0.0, "epsilon": 1e-8, "max_norm_clip": 1.0, **floats[n]}
            a = {k: F32(val) for k, val in a.items()}
            mode, bias = ints[n].get("weight_decay_mode", 0), ints[n].get("do_bias_correction", 1)
            gn = g[n] / (norm / a["max_norm_clip"]) if clip and norm > a["max_norm_clip"] else g[n]
            m[n] = a["alpha"] * m[n] + (1 - a["alpha"]) * gn
            v[n] = a["beta"] * v[n] + (1 - a["beta"]) * gn * gn
            bc1, bc2 = (1 - a["alpha"] ** t, 1 - a["beta"] ** t) if bias else (1.0, 1.0)
            if mode == 0:
                w[n] = w[n] - lr * ((m[n] / bc1) / ((v[n] / bc2).sqrt() + a["epsilon"]) + a["lambda"] * w[n])
            else:
                u = lr * math.sqrt(bc2) / bc1 * m[n] / (v[n].sqrt() + a["epsilon"])
                w[n] = w[n] - u - lr * a["lambda"] * (w[n] - u)
        t += 1
        count = 0
        acc = {n: torch.zeros_like(w[n]) for n in WEIGHTS}
    return losses, w, m, v, t


@pytest.mark.parametrize("mode, bias, clip, steps", [
    (0, 1, False, 1), (1, 1, False, 1), (0, 0, True, 1), (1, 0, True, 2), (0, 1, True, 3)])
def test_adam_matches_the_float64_legacy_formulas(mode, bias, clip, steps):
    data, rates = batches(9), lrs(9)
    floats = {n: {"alpha": 0.85, "beta": 0.99, "epsilon": 1e-6, "max_norm_clip": 0.5} for n in WEIGHTS}
    floats["fc1.weight"]["lambda"] = 0.02  # per-weight attributes
    floats["fc2.bias"]["alpha"] = 0.8
    ints = {n: {"weight_decay_mode": mode, "do_bias_correction": bias} for n in WEIGHTS}
    p = params_for(enable_grad_norm_clip=clip, gradient_accumulation_steps=steps)
    p.optimizer_attributes_map, p.optimizer_int_attributes_map = floats, ints
    sess = session(p)
    losses = train(sess, data, rates)
    expected, w, m, v, t = reference_run(data, rates, floats, ints, steps, clip)
    np.testing.assert_allclose(losses, expected, rtol=0, atol=1e-6)
    state = sess.get_state()
    for n in WEIGHTS:
        np.testing.assert_allclose(state[n], w[n].numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(state[f"Moment_1_{n}"], m[n].numpy(), rtol=1e-4, atol=1e-7)
        np.testing.assert_allclose(state[f"Moment_2_{n}"], v[n].numpy(), rtol=1e-4, atol=1e-9)
        assert state[f"Update_Count_{n}"].tolist() == [t]


# ---- gradient accumulation and the learning-rate feed -----------------------------------------------
def test_gradient_accumulation_updates_every_nth_run_with_the_mean_gradient():
    data = batches(6)
    sess = session(params_for("SGDOptimizer", gradient_accumulation_steps=3))
    before = sess.get_model_state()["full_precision"]
    train(sess, data[:2], [0.1, 0.1])
    assert all(np.array_equal(v, before[k]) for k, v in sess.get_model_state()["full_precision"].items())
    train(sess, data[2:3], [0.1])
    after = sess.get_model_state()["full_precision"]
    assert not np.array_equal(after["fc1.weight"], before["fc1.weight"])
    # SGD on the mean of the three gradients, each taken at the initial weights (lr 0)
    reference = session(params_for("SGDOptimizer"))
    reference_state = reference.training_state
    grads = []
    for x, y in data[:3]:
        reference.run(["loss"], {"x": x, "y": y, LR: np.array([0.0], np.float32)})
        grads.append({n: reference_state.params[n].grad.clone() for n in WEIGHTS})
    for n in WEIGHTS:
        mean = (grads[0][n] + grads[1][n] + grads[2][n]) * F32(1 / 3)
        np.testing.assert_allclose(after[n], initial(n) - np.float32(0.1) * mean.numpy(), rtol=0, atol=1e-6)


def test_accumulation_driven_like_the_ortrainer_gives_the_same_result():
    data = batches(6)
    plain = session(params_for(gradient_accumulation_steps=3))
    plain_losses = train(plain, data, [0.01] * 6)
    driven = session(params_for(gradient_accumulation_steps=3))
    accumulate = RunOptions(only_execute_path_to_fetches=True)
    driven_losses = []
    for step, (x, y) in enumerate(data):
        if (step + 1) % 3:
            loss, flag = driven.run(["loss", "Group_Accumulated_Gradients"], {"x": x, "y": y}, accumulate)
            assert flag.dtype == np.bool_ and bool(flag)
        else:
            (loss,) = driven.run(["loss"], {"x": x, "y": y, LR: np.array([0.01], np.float32)})
        driven_losses.append(float(loss))
    assert driven_losses == plain_losses
    assert all(np.array_equal(a, b) for a, b in zip(plain.get_state().values(), driven.get_state().values()))


def test_learning_rate_feed():
    sess = session(params_for("SGDOptimizer", lr_params_feed_name="lr"))
    x, y = batches(1)[0]
    assert [arg.name for arg in sess.get_inputs()] == ["x", "y", "lr"]
    with pytest.raises(InputError, match="Missing Input: lr"):
        sess.run(["loss"], {"x": x, "y": y})
    with pytest.raises(InputError, match="Invalid Feed Input Name:Learning_Rate"):
        sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.1], np.float32)})
    with pytest.raises(InputTypeError, match=r"Actual: \(tensor\(double\)\), expected: \(tensor\(float\)\)"):
        sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.1])})
    with pytest.raises(InputError, match="expected float"):
        sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.1, 0.2], np.float32)})
    before = sess.get_state()
    sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.0], np.float32)})
    assert all(np.array_equal(before[k], v) for k, v in sess.get_state().items())
    sess.run(["loss"], {"x": x, "y": y, "lr": np.array([0.5], np.float32)})
    assert not np.array_equal(before["fc2.bias"], sess.get_state()["fc2.bias"])


# ---- which weights are trained ----------------------------------------------------------------------
def trained_names(parameters: TrainingParameters) -> set[str]:
    return set(session(parameters).get_model_state()["full_precision"])


def test_default_weights_are_the_float_initializers_reaching_the_loss():
    p = params_for(weights=[*WEIGHTS, "scale"])
    p.immutable_weights = {}
    assert trained_names(p) == {*WEIGHTS, "scale"}  # not `shape` (stop-gradient edge), not `unused.weight`
    assert trained_names(params_for()) == set(WEIGHTS)  # immutable_weights: Mul input 1 == 1.0
    p = params_for()
    p.immutable_weights = {"Mul": [(1, 2.0)]}  # value does not match: still trained
    p.optimizer_attributes_map["scale"] = p.optimizer_int_attributes_map["scale"] = {}
    assert "scale" in trained_names(p)


def test_weights_not_to_train_become_frozen_parameters():
    p = params_for(weights=["fc1.bias", "fc2.weight", "fc2.bias"], weights_not_to_train={"fc1.weight"})
    sess = session(p)
    assert set(sess.get_model_state()["full_precision"]) == {"fc1.bias", "fc2.weight", "fc2.bias"}
    assert not sess.training_state.params["fc1.weight"].requires_grad
    train(sess, batches(3), [0.1] * 3)
    np.testing.assert_array_equal(sess.training_state.params["fc1.weight"].detach().numpy(), initial("fc1.weight"))
    assert not np.array_equal(sess.get_state()["fc1.bias"], initial("fc1.bias"))


def test_weights_to_train_takes_precedence_and_drops_unused_names():
    p = params_for(weights=["fc2.weight"], weights_to_train={"fc2.weight", "unused.weight"})
    p.immutable_weights = {}  # only consulted without weights_to_train
    with pytest.warns(UserWarning, match="unused.weight"):
        sess = session(p)
    assert set(sess.get_model_state()["full_precision"]) == {"fc2.weight"}
    assert set(sess.training_state.params) == {"fc2.weight"}  # the others stay constants of the graph
    train(sess, batches(2), [0.1] * 2)
    assert not np.array_equal(sess.get_state()["fc2.weight"], initial("fc2.weight"))
    p = params_for(weights_to_train={"unused.weight"})  # nothing left: ORT falls back to the default set
    with pytest.warns(UserWarning, match="unused.weight"):
        assert trained_names(p) == set(WEIGHTS)
    with pytest.raises(ModelError, match="not initializers"):
        session(params_for(weights_to_train={"h"}))


# ---- state --------------------------------------------------------------------------------------------
def test_get_state_and_load_state_round_trip():
    data, rates = batches(5), lrs(5)
    first = session(params_for())
    train(first, data[:3], rates[:3])
    state = first.get_state()
    assert sorted(state) == list(state)
    assert set(state) == {*WEIGHTS, *(f"{p}_{w}" for p in ("Moment_1", "Moment_2", "Update_Count") for w in WEIGHTS)}
    assert state["Update_Count_fc1.weight"].dtype == np.int64 and state["Update_Count_fc1.weight"].tolist() == [4]
    optimizer_state = first.get_optimizer_state()
    assert set(optimizer_state["fc2.bias"]) == {"Moment_1", "Moment_2", "Update_Count"}
    np.testing.assert_array_equal(optimizer_state["fc2.bias"]["Moment_2"], state["Moment_2_fc2.bias"])
    assert set(first.get_model_state(include_mixed_precision_weights=True)) == {"full_precision", "mixed_precision"}
    second = session(params_for())
    second.load_state({**state, "not.a.state.tensor": np.zeros(1)})  # unknown names ignored unless strict
    assert train(second, data[3:], rates[3:]) == train(first, data[3:], rates[3:])
    state["fc1.bias"][:] = 0  # get_state returns copies
    assert first.get_state()["fc1.bias"].any()
    with pytest.raises(CheckpointError, match="Checkpoint tensor: nope is not a known state tensor."):
        second.load_state({"nope": np.zeros(1)}, strict=True)
    with pytest.raises(ValueError, match="shape"):
        second.load_state({"fc1.bias": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="Update_Count of 'fc1.bias': expected int64 of shape \\[1\\]"):
        second.load_state({"Update_Count_fc1.bias": np.array([3], np.int32)})


def test_set_optimizer_initial_state_seeds_the_moments_and_counts():
    data, rates = batches(4), lrs(4)
    first = session(params_for())
    train(first, data[:2], rates[:2])
    p = params_for()
    p.set_optimizer_initial_state(first.get_optimizer_state())
    seeded = session(p)
    seeded.load_state({n: v for n, v in first.get_state().items() if n in WEIGHTS})
    assert train(seeded, data[2:], rates[2:]) == train(first, data[2:], rates[2:])
    p.set_optimizer_initial_state({"fc1.bias": {"Moment_1": np.zeros(3, np.float32)}})
    with pytest.raises(ValueError, match="set_optimizer_initial_state: Moment_1 of 'fc1.bias'"):
        session(p)


def test_save_as_onnx_writes_the_trained_weights(tmp_path):
    sess = session(params_for())
    train(sess, batches(3), lrs(3))
    sess.save_as_onnx(tmp_path / "trained.onnx")
    saved = {i.name: numpy_helper.to_array(i) for i in onnx.load(tmp_path / "trained.onnx").graph.initializer}
    assert list(saved) == [i.name for i in forward_model().graph.initializer]
    for name, value in sess.get_model_state()["full_precision"].items():
        np.testing.assert_array_equal(saved[name], value)
    np.testing.assert_array_equal(saved["unused.weight"], initial("unused.weight"))


# ---- run() and metadata --------------------------------------------------------------------------------
def test_run_outputs_inputs_and_metadata():
    sess = session(params_for(gradient_accumulation_steps=2), sess_options="opts")
    assert [(a.name, a.type, a.shape) for a in sess.get_inputs()] == [
        ("x", "tensor(float)", ["N", 4]), ("y", "tensor(int64)", ["N"]), (LR, "tensor(float)", [1])]
    assert [a.name for a in sess.get_outputs()] == ["logits", "loss", "Group_Accumulated_Gradients",
                                                    "global_gradient_norm"]
    x, y = batches(1)[0]
    feed = {"x": x, "y": y, LR: np.array([0.01], np.float32)}
    logits, loss, flag, norm = sess.run(None, feed)
    assert logits.shape == (5, 3) and loss.shape == () and flag and norm > 0
    with pytest.raises(InputError, match="Invalid Output Name:nope"):
        sess.run(["nope"], feed)
    with pytest.raises(InputError, match="Missing Input: y"):
        sess.run(["loss"], {"x": x, LR: feed[LR]})
    assert sess.is_output_fp32_node("loss") and not sess.is_output_fp32_node("Group_Accumulated_Gradients")
    meta = sess.get_modelmeta()
    assert (meta.producer_name, meta.graph_name) == ("tests", "mlp")
    assert meta.custom_metadata_map == {"author": "legacy-tests"}
    assert sess.get_session_options() == "opts"
    assert sess.get_partition_info_map() == {}


def test_forward_only_and_evaluation_runs_leave_the_training_untouched():
    sess = session(params_for())
    x, y = batches(1)[0]
    before = sess.get_state()
    grads = [sess.training_state.params[n].grad.clone() for n in WEIGHTS]
    (train_loss,) = sess.run(["loss"], {"x": x, "y": y}, RunOptions(only_execute_path_to_fetches=True))
    (eval_loss,) = sess.run(["loss"], {"x": x, "y": y}, RunOptions(training_mode=False))
    assert train_loss == eval_loss
    assert all(np.array_equal(before[k], v) for k, v in sess.get_state().items())
    assert all(torch.equal(g, sess.training_state.params[n].grad) for n, g in zip(WEIGHTS, grads))
    (step_loss,) = sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.01], np.float32)})
    assert step_loss == train_loss
    with pytest.raises(ValueError, match="training_mode=False"):
        sess.run(["global_gradient_norm"], {"x": x, "y": y}, RunOptions(training_mode=False))


def test_a_session_without_optimizer_only_computes_the_loss():
    p = params_for("")
    sess = session(p)
    assert [a.name for a in sess.get_inputs()] == ["x", "y"]
    assert [a.name for a in sess.get_outputs()] == ["logits", "loss"]
    before = sess.get_state()
    x, y = batches(1)[0]
    sess.run(["loss"], {"x": x, "y": y})
    assert sess.get_optimizer_state() == {}
    assert all(np.array_equal(before[k], v) for k, v in sess.get_state().items())


# ---- providers -----------------------------------------------------------------------------------------
def test_providers_map_to_a_device(monkeypatch):
    assert choose_provider(["CPUExecutionProvider"], None).device == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(UserWarning, match="'CUDAExecutionProvider' is not in available provider names"):
        choice = choose_provider(["CUDAExecutionProvider", "CPUExecutionProvider"], None)
    assert (choice.device, choice.providers) == (torch.device("cpu"), ["CPUExecutionProvider"])
    assert choose_provider(None, None).providers == ["CPUExecutionProvider"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    choice = choose_provider([("CUDAExecutionProvider", {"device_id": 1})], None)
    assert choice.device == torch.device("cuda", 1)
    assert choice.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert choice.options["CUDAExecutionProvider"]["device_id"] == "1"
    assert choose_provider(["CUDAExecutionProvider"], [{"device_id": "0"}]).device == torch.device("cuda", 0)
    assert choose_provider(None, None).device == torch.device("cuda", 0)
    with pytest.raises(ValueError, match="device_id"):
        choose_provider([("CUDAExecutionProvider", {"device_id": 2})], None)
    with pytest.raises(ValueError, match="same length"):
        choose_provider(["CPUExecutionProvider"], [{}, {}])
    with pytest.raises(ValueError, match="strings or \\(string, dict\\) tuples"):
        choose_provider([42], None)
    with pytest.raises(ValueError, match="should be a sequence"):
        choose_provider("CPUExecutionProvider", None)


def test_session_reports_its_providers():
    sess = session(params_for(), providers=["CPUExecutionProvider"])
    assert sess.get_providers() == ["CPUExecutionProvider"]
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_provider_trains_like_cpu():
    data, rates = batches(5), lrs(5)
    cuda = session(params_for(), providers=[("CUDAExecutionProvider", {"device_id": 0})])
    assert cuda.training_state.params["fc1.weight"].device == torch.device("cuda", 0)
    np.testing.assert_allclose(train(cuda, data, rates), train(session(params_for()), data, rates), rtol=0, atol=1e-5)


# ---- configuration errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(UNSUPPORTED_SETTINGS))
def test_unsupported_settings_raise_not_implemented(name):
    honoured = UNSUPPORTED_SETTINGS[name][0]
    value = {bool: True, int: 2, str: "x", dict: {"w": [0]}, list: ["w"]}[type(honoured)]
    with pytest.raises(NotImplementedError, match=re.escape(f"TrainingParameters.{name} = {value!r} is not supported")):
        session(params_for(**{name: value}))


def test_lamb_and_ort_format_are_not_implemented(tmp_path):
    with pytest.raises(NotImplementedError, match="LambOptimizer"):
        session(params_for("LambOptimizer"))
    with pytest.raises(NotImplementedError, match="ORT format"):
        TrainingSession(str(tmp_path / "model.ort"), params_for())


def test_configuration_errors():
    with pytest.raises(AttributeError):
        TrainingParameters().gradient_accumulation_step = 2  # typo: not a setting
    with pytest.raises(ValueError, match="Failed to get Optimizer builder for 'Adam'"):
        session(params_for("Adam"))
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an int >= 1"):
        session(params_for(gradient_accumulation_steps=0))
    with pytest.raises(ModelError, match="'nope' is not an output of the model"):
        session(params_for(loss_output_name="nope"))
    with pytest.raises(ValueError, match="loss_output_name is empty"):
        session(params_for(loss_output_name=""))
    p = params_for()
    del p.optimizer_int_attributes_map["fc2.bias"]
    with pytest.raises(ValueError, match="Failed to find int attribute map for weight fc2.bias"):
        session(p)
    with pytest.raises(ValueError, match="belong in the other attribute map"):
        session(params_for(floats={"do_bias_correction": 0.0}))
    with pytest.raises(ValueError, match="attribute weight_decay_mode must be 0 or 1"):
        session(params_for(ints={"weight_decay_mode": 2}))
    with pytest.raises(ValueError, match="attribute alpha must be >= 0"):
        session(params_for(floats={"alpha": -0.1}))
    with pytest.warns(UserWarning, match="reads no attribute \\['weight_decay'\\]"):
        session(params_for(floats={"weight_decay": 0.1}))
    with pytest.raises(TypeError, match="Unable to load from type"):
        TrainingSession(forward_model(), params_for())


def test_default_parameters_are_orts():
    p = TrainingParameters()
    assert (p.lr_params_feed_name, p.enable_grad_norm_clip, p.gradient_accumulation_steps) == ("Learning_Rate", True, 1)
    assert (p.world_size, p.deepspeed_zero_stage, p.training_optimizer_name, p.loss_scale) == (1, 0, "", 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "loss_output_name='loss'" in repr(params_for())
