"""export_model_for_inferencing: ORT's surgery on the eval model, run by onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime
import pytest

from ort_torch_train.api import CheckpointState
from ort_torch_train.errors import ModelError
from ort_torch_train.export import external_data, inference


def _run(path, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, {name: feeds[name] for name in names})


def _final_module(case):
    return case.module(CheckpointState.load_checkpoint(case.root / "final_checkpoint_no_optimizer"))


def test_exported_model_matches_ort_export(case, tmp_path):
    spec = case.expected["inference_export"]
    module = _final_module(case)
    path = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(path, spec["graph_output_names"])
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == [i["name"] for i in spec["inputs"]]
    assert [o.name for o in model.graph.output] == spec["graph_output_names"]
    ops = Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in model.graph.node)
    assert ops == Counter(spec["op_counts"])
    ort_model = onnx.load(case.root / "inference_model.onnx")
    assert sorted(i.name for i in model.graph.initializer) == sorted(i.name for i in ort_model.graph.initializer)
    assert set(spec["initializers"]) <= {i.name for i in model.graph.initializer}
    assert model.ir_version <= inference.MAX_IR_VERSION
    feeds = dict(zip(case.expected["eval_mode"]["input_names"], case.eval_inputs()))
    reference = np.load(case.root / "inference_outputs.npz")
    for name, value in zip(spec["graph_output_names"], _run(path, feeds)):
        np.testing.assert_allclose(value, reference[name], rtol=0, atol=1e-5)


def test_exported_loss_equals_module_eval_output(case, tmp_path):
    module = case.module()
    module.eval()
    path = tmp_path / "loss.onnx"
    outputs = module.output_names()
    module.export_model_for_inferencing(path, outputs)
    feeds = dict(zip(module.input_names(), case.eval_inputs()))
    expected = module(*case.eval_inputs())
    expected = [expected] if isinstance(expected, np.ndarray) else list(expected)
    for ours, theirs in zip(_run(path, feeds), expected):
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5)


def test_intermediate_values_can_be_exported(mlp_case, tmp_path):
    module = mlp_case.module()
    eval_model = onnx.load(mlp_case.artifact("eval_model.onnx"))
    intermediate = eval_model.graph.node[0].output[0]
    path = tmp_path / "first.onnx"
    module.export_model_for_inferencing(path, [intermediate])
    model = onnx.load(path)
    assert len(model.graph.node) == 1 and [o.name for o in model.graph.output] == [intermediate]
    x = mlp_case.eval_inputs()[0]
    [value] = _run(path, {"input": x})
    assert value.shape[0] == x.shape[0]


def test_unknown_output_name_is_ort_error(mlp_case, tmp_path):
    with pytest.raises(ModelError, match="Expected graph output for inference graph nope could not be found"):
        mlp_case.module().export_model_for_inferencing(tmp_path / "x.onnx", ["nope"])
    assert not (tmp_path / "x.onnx").exists()


def test_large_models_use_external_data(mlp_case, tmp_path, monkeypatch):
    monkeypatch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", 1)
    path = tmp_path / "big.onnx"
    mlp_case.module().export_model_for_inferencing(path, ["logits"])
    assert (tmp_path / "big.onnx.data").stat().st_size > 0
    model = onnx.load(path, load_external_data=False)
    assert any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)
    [logits] = _run(path, {"input": mlp_case.eval_inputs()[0]})
    assert logits.shape == (mlp_case.eval_inputs()[0].shape[0], 5)
