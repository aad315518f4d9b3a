"""Bad arguments to generate_artifacts fail with a clear error before any file is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ort_torch_train.artifacts import Block, LossType, OptimType, generate_artifacts
from ort_torch_train.errors import ModelError, UnsupportedOperatorError

PARAMS = ["fc.weight", "fc.bias"]


def linear_model(opset: int = 17) -> onnx.ModelProto:
    """input[batch,3] -> Gemm(fc.weight[2,3], fc.bias[2]) -> logits[batch,2]."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "fc.weight", "fc.bias"], ["logits"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [
            numpy_helper.from_array(rng.standard_normal((2, 3)).astype(np.float32), "fc.weight"),
            numpy_helper.from_array(np.zeros(2, np.float32), "fc.bias"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def generate(directory: Path, model: onnx.ModelProto | None = None, **kwargs) -> None:
    arguments = {
        "requires_grad": PARAMS,
        "loss": LossType.MSELoss,
        "optimizer": OptimType.AdamW,
        "artifact_directory": directory,
        **kwargs,
    }
    generate_artifacts(model if model is not None else linear_model(), **arguments)


def assert_fails_cleanly(directory: Path, error: type[Exception], match: str, **kwargs) -> None:
    with pytest.raises(error, match=match):
        generate(directory, **kwargs)
    assert not directory.exists() or list(directory.iterdir()) == []


def test_the_valid_baseline_writes_four_files(tmp_path: Path) -> None:
    generate(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint",
        "eval_model.onnx",
        "optimizer_model.onnx",
        "training_model.onnx",
    ]


def test_unknown_parameter_is_named_with_valid_ones(tmp_path: Path) -> None:
    assert_fails_cleanly(
        tmp_path,
        ModelError,
        r"requires_grad: 'fc.wieght' is not among .*'fc.weight', 'fc.bias'",
        requires_grad=["fc.wieght"],
    )
    assert_fails_cleanly(tmp_path, ModelError, r"frozen_params: 'nope'", frozen_params=["nope"])


def test_parameter_both_trainable_and_frozen(tmp_path: Path) -> None:
    assert_fails_cleanly(
        tmp_path, ModelError, r"cannot be frozen and require gradient.*fc.bias", frozen_params=["fc.bias"]
    )


def test_a_string_instead_of_a_list(tmp_path: Path) -> None:
    assert_fails_cleanly(tmp_path, TypeError, "must be a list of names", requires_grad="fc.weight")


def test_no_parameter_selected(tmp_path: Path) -> None:
    """ORT reads requires_grad=None as 'none' (then fails with IndexError building the optimizer)."""
    assert_fails_cleanly(tmp_path, ModelError, "no parameters selected", requires_grad=None)


def test_optimizer_without_trainable_parameters(tmp_path: Path) -> None:
    assert_fails_cleanly(
        tmp_path, ModelError, "needs at least one trainable parameter", requires_grad=None, frozen_params=PARAMS
    )


def test_model_without_initializers(tmp_path: Path) -> None:
    model = linear_model()
    model.graph.input.extend(
        helper.make_tensor_value_info(i.name, i.data_type, i.dims) for i in model.graph.initializer
    )
    del model.graph.initializer[:]
    assert_fails_cleanly(tmp_path, ModelError, "has no initializers", model=model)


def test_additional_output_that_does_not_exist(tmp_path: Path) -> None:
    assert_fails_cleanly(
        tmp_path,
        ModelError,
        r"additional_output_names: 'logitz' is not among .*'logits'",
        additional_output_names=["logitz"],
    )


def test_loss_input_that_does_not_exist(tmp_path: Path) -> None:
    assert_fails_cleanly(tmp_path, ModelError, r"loss_input_names: 'scores'", loss_input_names=["scores"])


def test_operator_without_converter_names_domain_and_opset(tmp_path: Path) -> None:
    model = linear_model()
    model.graph.node.append(helper.make_node("FancyOp", ["logits"], ["fancy"], domain="com.example"))
    model.graph.output[0].name = "fancy"
    model.opset_import.append(helper.make_opsetid("com.example", 3))
    with pytest.raises(UnsupportedOperatorError, match=r"FancyOp of domain com.example at opset 3"):
        generate(tmp_path, model=model, loss=None, optimizer=None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("loss", ["mse", LossType, 3])
def test_unsupported_loss(tmp_path: Path, loss) -> None:
    assert_fails_cleanly(tmp_path, ModelError, "Unknown loss provided", loss=loss)


@pytest.mark.parametrize("optimizer", ["AdamW", OptimType, 1])
def test_unsupported_optimizer(tmp_path: Path, optimizer) -> None:
    assert_fails_cleanly(tmp_path, TypeError, "Unknown optimizer provided", optimizer=optimizer)


def test_artifact_directory_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(NotADirectoryError, match="is a file"):
        generate(target)
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_ort_format_and_custom_op_library_are_rejected(tmp_path: Path) -> None:
    assert_fails_cleanly(tmp_path, NotImplementedError, "ort_format=True is not supported", ort_format=True)
    assert_fails_cleanly(
        tmp_path,
        NotImplementedError,
        r"custom_op_library.*ort_torch_train\.adapters\.register",
        custom_op_library="libcustom.so",
    )


def test_unknown_keyword_for_an_onnx_model(tmp_path: Path) -> None:
    assert_fails_cleanly(tmp_path, TypeError, "example_inputs", example_inputs=None)


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        generate_artifacts(str(tmp_path / "missing.onnx"), requires_grad=PARAMS, artifact_directory=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_invalid_custom_loss_is_reported_before_writing(tmp_path: Path) -> None:
    class Broken(Block):
        def build(self, output_name: str) -> str:
            return self.add_node("Add", [output_name, "nowhere"])[0]

    assert_fails_cleanly(tmp_path, ModelError, "loss Broken is not a valid ONNX model", loss=Broken())


def test_duplicate_outputs(tmp_path: Path) -> None:
    assert_fails_cleanly(
        tmp_path, ModelError, "would repeat", loss=None, optimizer=None, additional_output_names=["logits"]
    )
