"""Bad input to Module gets a clear error naming the input, what was expected and what came."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.errors import (
    DistributedError,
    InputError,
    InputTypeError,
    ModelError,
    NominalStateError,
    UnsupportedOperatorError,
)
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.recompute_patterns import RecomputePlan


@pytest.fixture
def module(mlp_case):
    return mlp_case.module()


def test_wrong_number_of_inputs(module, mlp_case):
    x, y = mlp_case.train_inputs(0)
    with pytest.raises(InputError, match=r"expected 2 user inputs \('input', 'labels'\).*got 1"):
        module(x)
    with pytest.raises(InputError, match="got 3"):
        module(x, y, y)


def test_wrong_dtype_is_not_cast(module, mlp_case):
    x, y = mlp_case.train_inputs(0)
    with pytest.raises(
        InputTypeError, match=r"input 'input'.*Actual: \(tensor\(double\)\), expected: \(tensor\(float\)\)"
    ):
        module(x.astype(np.float64), y)
    with pytest.raises(
        InputTypeError, match=r"input 'labels'.*Actual: \(tensor\(int32\)\), expected: \(tensor\(int64\)\)"
    ):
        module(x, y.astype(np.int32))


def test_wrong_rank_and_dimension(module, mlp_case):
    x, y = mlp_case.train_inputs(0)
    with pytest.raises(InputError, match="Invalid rank for input: input Got: 3 Expected: 2"):
        module(x[None], y)
    with pytest.raises(InputError, match="indices index: 1 Got: 21 Expected: 20"):
        module(np.zeros((x.shape[0], 21), np.float32), y)


def test_none_and_non_arrays_are_named(module, mlp_case):
    x, _ = mlp_case.train_inputs(0)
    with pytest.raises(InputTypeError, match=r"input 'labels' \(position 1\).*got None"):
        module(x, None)
    with pytest.raises(InputTypeError, match=r"input 'input' \(position 0\).*got list"):
        module([[0.0] * 20], np.zeros(1, np.int64))


def test_out_of_range_labels_raise(module, mlp_case):
    x, y = mlp_case.train_inputs(0)
    bad = y.copy()
    bad[0] = 99
    with pytest.raises(IndexError, match=r"input 'labels': class index 99 is out of range"):
        module(x, bad)


def test_dynamic_batch_respecialises(module, mlp_case):
    x, y = mlp_case.train_inputs(0)
    full = float(module.eval()(x, y))
    half = float(module(x[:4], y[:4]))
    assert np.isfinite(full) and np.isfinite(half) and full != half
    assert float(module(x, y)) == full


def test_eval_without_eval_model_is_a_clear_error(mlp_case):
    module = mlp_case.module(eval_model=False)
    module.eval()
    with pytest.raises(ModelError, match="Eval model was not provided"):
        module(*mlp_case.eval_inputs())
    with pytest.raises(ModelError, match="Eval model was not provided. Cannot export"):
        module.export_model_for_inferencing("unused.onnx", ["logits"])


def test_unsupported_operator_is_named_at_construction(mlp_case, tmp_path):
    model = onnx.load(mlp_case.artifact("eval_model.onnx"))
    node = model.graph.node[0]
    node.op_type, node.domain = "TotallyUnknownOp", "com.example"
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 3))
    path = tmp_path / "eval.onnx"
    onnx.save(model, path)
    with pytest.raises(UnsupportedOperatorError, match="TotallyUnknownOp of domain com.example at opset 3"):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), path)


def test_missing_and_unreadable_model_files(mlp_case, tmp_path):
    state = mlp_case.load_state()
    with pytest.raises(FileNotFoundError, match="training model not found"):
        Module(tmp_path / "nope.onnx", state)
    with pytest.raises(IsADirectoryError):
        Module(tmp_path, state)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00garbage")
    with pytest.raises(ModelError, match=r"training model '.*junk\.onnx' is not a readable ONNX model .*, nor an ORT"):
        Module(junk, state)


def test_bad_device(mlp_case):
    with pytest.raises(ValueError, match="device: expected 'cpu', 'cuda' or 'cuda:N', got 'tpu'"):
        mlp_case.module(device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            mlp_case.module(device="cuda")


def test_nominal_checkpoint_is_completed_by_copy_buffer(mlp_case):
    nominal = mlp_case.artifact("nominal_checkpoint")
    if not nominal.exists():
        pytest.skip("this case has no nominal checkpoint")
    state = CheckpointState.load_checkpoint(nominal)
    module = mlp_case.module(state)
    x, y = mlp_case.train_inputs(0)
    assert len(state.parameters) == len(mlp_case.param_names) and mlp_case.param_names[0] in state.parameters
    assert module.get_parameters_size() == mlp_case.expected["parameters_size"]["trainable_only_True"]
    with pytest.raises(NominalStateError, match="TrainStep with a nominal state"):
        module(x, y)
    with pytest.raises(NominalStateError, match="Cannot copy parameters from a nominal checkpoint state"):
        module.get_contiguous_parameters()
    buffer = mlp_case.arrays["init_contiguous_all"]
    with pytest.raises(
        NominalStateError, match=r"all parameters need to be loaded into the model \(trainable_only = false\)"
    ):
        module.copy_buffer_to_parameters(buffer, trainable_only=True)
    with pytest.raises(InputError, match=f"Parameters buffer size incorrect. Expected:{buffer.size}, Actual:5"):
        module.copy_buffer_to_parameters(buffer[:5], trainable_only=False)
    module.copy_buffer_to_parameters(buffer, trainable_only=False)
    loss = float(module(x, y))
    assert abs(loss - mlp_case.expected["gradient_semantics"]["loss_call1"]) <= 1e-5
    for name in mlp_case.param_names:
        np.testing.assert_array_equal(state.parameters[name].data, mlp_case.arrays[f"init__{name}"])


def test_engine_options_refuse_combinations_that_cannot_work():
    with pytest.raises(ValueError, match=r"loss_scale: 128.0 needs mixed_precision 'fp16'; got 'bf16'"):
        EngineOptions.of(mixed_precision="bf16", loss_scale=128.0)
    with pytest.raises(ValueError, match=r"loss_scale: expected a number >= 0 \(0: dynamic\), got -1"):
        EngineOptions.of(mixed_precision="fp16", loss_scale=-1)
    with pytest.raises(DistributedError, match="process_group is given but distributed is False"):
        EngineOptions.of(process_group=object())
    with pytest.raises(ValueError, match="mixed_precision: expected 'bf16', 'fp16' or None; got 'fp8'"):
        EngineOptions.of(mixed_precision="fp8")


def test_engine_options_compile_the_forward_alone_under_recompute():
    whole = EngineOptions.of(compile=True)
    assert whole.compiles_whole_step and whole.train_forward_compile_arguments is None
    for recompute in (2, RecomputePlan(gelu=True)):
        alone = EngineOptions.of(compile=True, recompute=recompute)
        assert not alone.compiles_whole_step
        assert alone.train_forward_compile_arguments == {"options": {"cpp_wrapper": False}}
    assert EngineOptions.of(compile="max-autotune", recompute=True).train_forward_compile_arguments == {
        "mode": "max-autotune"
    }
    # another backend takes no inductor options (torch warns it ignores them)
    aot_eager = EngineOptions.of(compile={"backend": "aot_eager"}, recompute=True)
    assert aot_eager.train_forward_compile_arguments == {"backend": "aot_eager"}
    assert EngineOptions.of(recompute=RecomputePlan()).recompute is None  # a plan of nothing is off
