"""The legacy TrainingSession's configuration, state, providers and errors."""

from __future__ import annotations

import re
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from ort_torch_train.errors import (
    CheckpointError,
    InputError,
    ModelError,
)
from ort_torch_train.legacy import RunOptions, TrainingParameters, TrainingSession
from ort_torch_train.legacy.parameters import UNSUPPORTED_SETTINGS
from ort_torch_train.legacy.providers import choose_provider
from tests.helpers.legacy_models import (
    LR,
    WEIGHTS,
    batches,
    forward_model,
    initial,
    lrs,
    params_for,
    session,
    train,
)
from tests.helpers.paths import FIXTURES


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
        ("x", "tensor(float)", ["N", 4]),
        ("y", "tensor(int64)", ["N"]),
        (LR, "tensor(float)", [1]),
    ]
    assert [a.name for a in sess.get_outputs()] == [
        "logits",
        "loss",
        "Group_Accumulated_Gradients",
        "global_gradient_norm",
    ]
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


@pytest.mark.parametrize(
    "optimizer, stage, expected",
    [
        ("AdamOptimizer", 4, r"stages 0 \(no sharding\)"),
        ("LambOptimizer", 1, "not element-wise"),
        ("LambOptimizer", 3, "not element-wise"),
    ],
)
def test_zero_stages_that_are_not_implemented_raise(optimizer, stage, expected):
    with pytest.raises(NotImplementedError, match=expected):
        session(params_for(optimizer, deepspeed_zero_stage=stage))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_in_one_process_train_unsharded(stage):
    data, rates = batches(3), lrs(3)
    assert train(session(params_for(deepspeed_zero_stage=stage)), data, rates) == train(
        session(params_for()), data, rates
    )


def test_ort_format_is_not_implemented(tmp_path):
    with pytest.raises(NotImplementedError, match="ORT format"):
        TrainingSession(str(tmp_path / "model.ort"), params_for())
    ort_format = (FIXTURES / "mlp_ce_adamw_sched" / "artifacts_ort" / "eval_model.ort").read_bytes()
    renamed = tmp_path / "model.onnx"  # told by its content, not its name
    renamed.write_bytes(ort_format)
    for source in (str(renamed), ort_format):
        with pytest.raises(NotImplementedError, match="ORT format models are not supported"):
            TrainingSession(source, params_for())


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
