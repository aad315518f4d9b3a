"""The training model is what trains; the eval model must match it; the ONNX checker runs on both."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from ort_torch_train.api import Module
from ort_torch_train.errors import ModelError


def _eval_model(mlp_case) -> onnx.ModelProto:
    return onnx.load(mlp_case.artifact("eval_model.onnx"))


def test_train_step_runs_the_training_graph_not_an_eval_graph_with_the_same_interface(mlp_case):
    evaluation = _eval_model(mlp_case)
    gemm = [node for node in evaluation.graph.node if node.op_type == "Gemm"][-1]
    kept = [attribute for attribute in gemm.attribute if attribute.name != "alpha"]
    del gemm.attribute[:]
    gemm.attribute.extend([*kept, onnx.helper.make_attribute("alpha", 10.0)])
    module = Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), evaluation.SerializeToString())
    loss = float(np.asarray(module(*mlp_case.train_inputs(0))))
    np.testing.assert_allclose(loss, mlp_case.expected["train"]["losses"][0], rtol=1e-5)
    module.eval()
    assert abs(float(np.asarray(module(*mlp_case.eval_inputs()))) - loss) > 0.1  # the eval graph is the altered one


def test_eval_model_with_a_different_parameter_is_refused(mlp_case):
    evaluation = _eval_model(mlp_case)
    parameter = next(value for value in evaluation.graph.input if value.name in mlp_case.param_names)
    parameter.type.tensor_type.shape.dim[0].dim_value += 1
    with pytest.raises(
        ModelError, match=rf"eval model does not match the training model: parameter '{parameter.name}'"
    ):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), evaluation.SerializeToString())


def test_eval_model_with_a_different_input_type_is_refused(mlp_case):
    evaluation = _eval_model(mlp_case)
    user_input = next(value for value in evaluation.graph.input if value.name not in mlp_case.param_names)
    user_input.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    with pytest.raises(ModelError, match=rf"user input '{user_input.name}' is declared DOUBLE"):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), evaluation.SerializeToString())


def test_model_rejected_by_the_onnx_checker_is_refused(mlp_case):
    evaluation = _eval_model(mlp_case)
    gemm = next(node for node in evaluation.graph.node if node.op_type == "Gemm")
    gemm.attribute.extend([onnx.helper.make_attribute("beta", 1.0), onnx.helper.make_attribute("beta", 1.0)])
    with pytest.raises(ModelError, match="eval model fails the ONNX checker"):
        Module(mlp_case.artifact("training_model.onnx"), mlp_case.load_state(), evaluation.SerializeToString())


def test_simplified_layer_norm_in_the_onnx_domain_passes_the_checker_and_unknown_ops_do_not():
    """ORT's generate_artifacts fuses a Llama RMSNorm into SimplifiedLayerNormalization in the ONNX domain,
    which ORT registers and ONNX does not: the checker accepts it (and leaves the model as it was)."""
    from ort_torch_train.graph.model_checks import check_model

    def model(op_type: str) -> onnx.ModelProto:
        x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])
        y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])
        scale = onnx.numpy_helper.from_array(np.ones(4, np.float32), "scale")
        node = onnx.helper.make_node(op_type, ["x", "scale"], ["y"], axis=-1, epsilon=1e-6)
        graph = onnx.helper.make_graph([node], "g", [x], [y], [scale])
        return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])

    ort_model = model("SimplifiedLayerNormalization")
    check_model(ort_model, "training model")
    assert ort_model.graph.node[0].domain == "" and len(ort_model.opset_import) == 1
    with pytest.raises(ModelError, match="training model fails the ONNX checker: No Op registered for NoSuchNorm"):
        check_model(model("NoSuchNorm"), "training model")
