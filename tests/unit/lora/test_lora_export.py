"""LoRA exports in onnxruntime: merged model, unmerged model + .onnx_adapter files, adapters swapped per run."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from ort_torch_train.errors import ModelError
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.export import check_adapter, export_adapter, export_unmerged_model, load_adapter, read_adapter
from tests.unit.lora.helpers import data, make_artifacts, mlp, trained

ort = pytest.importorskip("onnxruntime")
if not hasattr(ort, "LoraAdapter"):
    pytest.skip("onnxruntime without LoraAdapter (< 1.20)", allow_module_level=True)


def run(path, x: np.ndarray, adapter=None) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    options = None
    if adapter is not None:
        loaded = ort.LoraAdapter()
        loaded.Load(str(adapter))
        options = ort.RunOptions()
        options.add_active_adapter(loaded)
    return session.run(["logits"], {"features": x}, options)[0]


def test_adapters_round_trip_through_onnxruntime(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, alpha=4, targets=["all-linear"]))
    x, _ = data(7)
    base = mlp()(torch.from_numpy(x)).detach().numpy()
    first, second = trained(tmp_path, seed=0), trained(tmp_path, seed=1)  # two adapters on one base
    for index, module in enumerate((first, second)):
        module.export_model_for_inferencing(tmp_path / f"merged{index}.onnx", ["logits"])
        export_adapter(module, tmp_path / f"a{index}.onnx_adapter")
    export_unmerged_model(first, tmp_path / "unmerged.onnx", ["logits"])

    alone = run(tmp_path / "unmerged.onnx", x)
    np.testing.assert_allclose(alone, base, atol=1e-5)  # rank-0 defaults: the base model
    outputs = []
    for index in range(2):
        with_adapter = run(tmp_path / "unmerged.onnx", x, tmp_path / f"a{index}.onnx_adapter")
        np.testing.assert_allclose(with_adapter, run(tmp_path / f"merged{index}.onnx", x), atol=1e-5)
        check_adapter(tmp_path / "unmerged.onnx", tmp_path / f"a{index}.onnx_adapter")
        outputs.append(with_adapter)
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-3
    assert np.abs(outputs[0] - base).max() > 1e-3


def test_trained_defaults_and_genai_layout(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, alpha=4, targets=["0.weight"]))
    module = trained(tmp_path)
    export_unmerged_model(module, tmp_path / "unmerged.onnx", ["logits"], adapter_defaults="trained")
    module.export_model_for_inferencing(tmp_path / "merged.onnx", ["logits"])
    x, _ = data(3)
    np.testing.assert_allclose(run(tmp_path / "unmerged.onnx", x), run(tmp_path / "merged.onnx", x), atol=1e-5)
    model = onnx.load(tmp_path / "unmerged.onnx")
    assert not [node for node in model.graph.node if node.op_type == "Mul"]  # the scale is folded into B
    inputs = {value.name: value for value in model.graph.input}
    dims = [d.dim_param or d.dim_value for d in inputs["0.lora_A.weight"].type.tensor_type.shape.dim]
    assert dims == [8, "lora_rank"]
    assert not [n for n in onnx.load(tmp_path / "merged.onnx").graph.node if "lora" in n.name]


def test_adapter_for_another_model_is_refused(tmp_path) -> None:
    make_artifacts(tmp_path / "one", LoraConfig(r=2, targets=["0.weight"]))
    make_artifacts(tmp_path / "two", LoraConfig(r=2, targets=["2.weight"]))
    one, two = trained(tmp_path / "one"), trained(tmp_path / "two")
    export_unmerged_model(one, tmp_path / "one.onnx", ["logits"])
    export_adapter(two, tmp_path / "two.onnx_adapter")
    with pytest.raises(ModelError, match="does not fit the model: missing adapter tensors \\['0.lora_A.weight'"):
        check_adapter(tmp_path / "one.onnx", tmp_path / "two.onnx_adapter")
    with pytest.raises(ModelError, match="does not fit the model"):
        load_adapter(one, tmp_path / "two.onnx_adapter")
    with pytest.raises(ModelError, match="has no LoRA adapter inputs"):
        check_adapter(tmp_path / "one" / "eval_model.onnx", tmp_path / "two.onnx_adapter")


def test_load_adapter_restores_the_trained_adapters(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=2, alpha=6, targets=["all-linear"]))
    source, target = trained(tmp_path, seed=0), trained(tmp_path, steps=0)
    export_adapter(source, tmp_path / "a.onnx_adapter")
    load_adapter(target, tmp_path / "a.onnx_adapter")
    for name in source.trainable_parameter_names:
        np.testing.assert_allclose(
            target.training_state.params[name].detach().numpy(),
            source.training_state.params[name].detach().numpy(),
            rtol=1e-6,
        )
    assert set(read_adapter(tmp_path / "a.onnx_adapter")) == set(source.trainable_parameter_names)


def test_load_adapter_refuses_a_tensor_whose_rank_differs_from_the_module_s(tmp_path) -> None:
    make_artifacts(tmp_path, LoraConfig(r=4, targets=["0.weight"]))
    module = trained(tmp_path, steps=0)
    export_adapter(module, tmp_path / "a.onnx_adapter")
    tensors = read_adapter(tmp_path / "a.onnx_adapter")
    name_b = next(name for name in tensors if "lora_B" in name)
    assert tensors[name_b].shape[0] == 4
    tensors[name_b] = np.ascontiguousarray(tensors[name_b][:1])  # B of rank 1 beside A of rank 4
    crafted = ort.AdapterFormat()
    crafted.set_parameters({name: ort.OrtValue.ortvalue_from_numpy(value) for name, value in tensors.items()})
    crafted.export_adapter(str(tmp_path / "b.onnx_adapter"))
    before = module.training_state.params[name_b].detach().clone()
    with pytest.raises(ModelError, match=rf"tensor '{name_b}' has shape \[1, 16\], the model expects \[4, 16\]"):
        load_adapter(module, tmp_path / "b.onnx_adapter")
    assert torch.equal(module.training_state.params[name_b], before)
