"""Inputs that used to raise bare builtin errors now raise the project's exceptions, naming the input."""

from __future__ import annotations

import onnx
import pytest

from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.cli.main import build_parser
from ort_torch_train.errors import ModelError, PropertyError


def test_eval_output_produced_by_no_node_is_refused_at_construction(mlp_case):
    evaluation = onnx.load(mlp_case.artifact("eval_model.onnx"))
    evaluation.graph.output.append(onnx.helper.make_tensor_value_info("ghost", onnx.TensorProto.FLOAT, [1]))
    with pytest.raises(ModelError, match="graph output 'ghost' is produced by no node"):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), evaluation.SerializeToString())


def test_initializer_dims_that_do_not_match_the_data_are_refused(mlp_case):
    evaluation = onnx.load(mlp_case.artifact("eval_model.onnx"))
    evaluation.graph.initializer.append(onnx.helper.make_tensor("bad", onnx.TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]))
    evaluation.graph.initializer[-1].dims[0] = 5
    with pytest.raises(ModelError, match=r"initializer 'bad' holds 3 values but dims \[5\] need 5"):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), evaluation.SerializeToString())


def test_lone_surrogate_property_is_refused_and_saves_keep_working(mlp_case, tmp_path):
    state = mlp_case.load_state()
    with pytest.raises(PropertyError, match="'tag' value cannot be stored"):
        state.properties["tag"] = "a\udc80b"
    assert "tag" not in state.properties
    CheckpointState.save_checkpoint(state, tmp_path / "ckpt")


def test_cli_steps_beyond_int64_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["train", "artifacts", "--data", "d.npz", "--steps", "9" * 20])
    assert exit_info.value.code == 2 and "below 2**63" in capsys.readouterr().err
