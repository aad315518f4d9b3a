"""generate_artifacts past 2 GB, shown on a small model with a lowered external-data threshold.

Every loss: the weights stay in external data (the base's own file, memory-mapped), the models and the
checkpoint are written with external data, the artifacts train, export (external again) and run in
onnxruntime, and ORT 1.19.2 loads the checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from torch import nn

from ort_torch_train.api.checkpoint_state import CheckpointState
from ort_torch_train.api.module import Module
from ort_torch_train.api.optimizer import Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.checkpoint.odtc import read_checkpoint
from ort_torch_train.errors import ModelError
from ort_torch_train.export import external_data
from ort_torch_train.lora import LoraConfig
from tests.helpers.ort_peer import requires_ort, run_ort

THRESHOLD = 100  # bytes: far below any real model, so these tiny ones take the >2 GB path
LOSSES = [LossType.MSELoss, LossType.L1Loss, LossType.BCEWithLogitsLoss]
pytestmark = [
    pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _base_with_external_data(directory: Path) -> tuple[Path, Net]:
    torch.manual_seed(0)
    net = Net()
    path = directory / "base.onnx"
    torch.onnx.export(
        net, (torch.zeros(2, 16),), str(path), dynamo=False, input_names=["x"], output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
    )  # fmt: skip
    model = onnx.load(path)
    onnx.save_model(model, path, save_as_external_data=True, location="base.onnx.data", size_threshold=0)
    return path, net


def _external_names(path: Path) -> set[str]:
    model = onnx.load(path, load_external_data=False)
    return {init.name for init in model.graph.initializer if external_data.is_external(init)}


def _batch(loss: LossType) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(0)
    x = generator.standard_normal((4, 16)).astype(np.float32)
    target = generator.random((4, 8)).astype(np.float32)
    return x, (target > 0.5).astype(np.float32) if loss is LossType.BCEWithLogitsLoss else target


@pytest.mark.parametrize("loss", LOSSES, ids=lambda loss: loss.name)
def test_external_data_artifacts_train_and_export(loss: LossType, tmp_path: Path) -> None:
    base, net = _base_with_external_data(tmp_path)
    out = tmp_path / "artifacts"
    generate_artifacts(
        base, requires_grad=["fc2.weight", "fc2.bias"], loss=loss, optimizer=OptimType.AdamW,
        artifact_directory=out, external_data_threshold=THRESHOLD,
    )  # fmt: skip

    # fc1 is neither trained nor frozen: it stays an initializer of both models, in their external data
    assert _external_names(out / "training_model.onnx") == {"fc1.weight"}
    assert _external_names(out / "eval_model.onnx") == {"fc1.weight"}
    assert (out / "training_model.onnx.data").stat().st_size >= 16 * 32 * 4
    record = read_checkpoint(out / "checkpoint")
    assert record.has_external_data and (out / "checkpoint.data").exists()
    torch.testing.assert_close(record.trainable["fc2.weight"], net.fc2.weight.detach())

    state = CheckpointState.load_checkpoint(str(out / "checkpoint"))
    module = Module(str(out / "training_model.onnx"), state, str(out / "eval_model.onnx"))
    optimizer = Optimizer(str(out / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(0.05)
    x, target = _batch(loss)
    losses = []
    for _ in range(5):
        module.train()
        losses.append(float(module(x, target)))
        optimizer.step()
        module.lazy_reset_grad()
    assert losses[-1] < losses[0], losses

    exported = tmp_path / "inference.onnx"
    module.export_model_for_inferencing(str(exported), ["y"])
    assert not (tmp_path / "inference.onnx.data").exists()  # under 2 GB: one file, as before
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(external_data, "EXTERNAL_DATA_THRESHOLD", THRESHOLD)
        module.export_model_for_inferencing(str(tmp_path / "large.onnx"), ["y"])
    assert _external_names(tmp_path / "large.onnx") == {"fc1.weight", "fc2.weight"}
    outputs = []
    for path in (exported, tmp_path / "large.onnx"):
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs.append(session.run(None, {"x": x})[0])
    np.testing.assert_array_equal(outputs[0], outputs[1])
    with torch.no_grad():
        assert not np.allclose(outputs[0], net(torch.from_numpy(x)).numpy())  # trained: fc2 moved


def test_in_memory_model_is_left_untouched_and_gives_the_same_artifacts(tmp_path: Path) -> None:
    base, _ = _base_with_external_data(tmp_path)
    model = onnx.load(base)
    before = model.SerializeToString()
    for name, threshold in (("small", None), ("large", THRESHOLD)):
        generate_artifacts(
            model, requires_grad=["fc2.weight"], frozen_params=["fc1.weight"], loss=LossType.MSELoss,
            artifact_directory=tmp_path / name, external_data_threshold=threshold,
        )  # fmt: skip
    assert model.SerializeToString() == before
    small, large = (read_checkpoint(tmp_path / name / "checkpoint") for name in ("small", "large"))
    assert large.has_external_data and not small.has_external_data
    for part in ("trainable", "frozen"):
        torch.testing.assert_close(getattr(large, part), getattr(small, part), rtol=0, atol=0)
    assert _external_names(tmp_path / "large" / "eval_model.onnx") == set()  # fc1, fc2 are parameters: inputs
    assert not (tmp_path / "large" / "eval_model.onnx.data").exists()


def test_torch_module_goes_through_a_file(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Net()
    net.fc1.requires_grad_(False)
    generate_artifacts(
        net, loss=LossType.L1Loss, artifact_directory=tmp_path, example_inputs=(torch.zeros(2, 16),),
        external_data_threshold=THRESHOLD,
    )  # fmt: skip
    record = read_checkpoint(tmp_path / "checkpoint")
    assert record.has_external_data
    assert sorted(record.trainable) == ["fc2.bias", "fc2.weight"]
    assert sorted(record.frozen) == ["fc1.bias", "fc1.weight"]
    torch.testing.assert_close(record.frozen["fc1.weight"], net.fc1.weight.detach(), rtol=0, atol=0)


@requires_ort[0]
@requires_ort[1]
def test_ort_loads_the_external_data_checkpoints(tmp_path: Path) -> None:
    base, net = _base_with_external_data(tmp_path)
    checkpoints = []
    for loss in LOSSES:
        out = tmp_path / loss.name
        generate_artifacts(
            base, requires_grad=["fc2.weight", "fc2.bias"], frozen_params=["fc1.weight", "fc1.bias"], loss=loss,
            optimizer=OptimType.AdamW, artifact_directory=out, external_data_threshold=THRESHOLD,
        )  # fmt: skip
        assert (out / "checkpoint.data").exists()
        checkpoints.append(out / "checkpoint")
    script = """
import json, sys
from onnxruntime.training.api import CheckpointState
names = ["fc1.weight", "fc2.weight", "fc2.bias"]
states = [CheckpointState.load_checkpoint(path) for path in sys.argv[1:]]
print(json.dumps([{name: state.parameters[name].data.ravel().tolist() for name in names} for state in states]))
"""
    loaded = run_ort(script, *checkpoints)  # one interpreter for all three: ORT's start-up is the cost
    assert isinstance(loaded, list) and len(loaded) == len(LOSSES)
    for values in loaded:
        for name in ("fc1.weight", "fc2.weight", "fc2.bias"):
            expected = dict(net.named_parameters())[name].detach().numpy().ravel()
            np.testing.assert_array_equal(np.asarray(values[name], dtype=np.float32), expected)


def test_refusals_name_the_way_out(tmp_path: Path) -> None:
    base, _ = _base_with_external_data(tmp_path)
    with pytest.raises(ModelError, match="cannot locate: pass the model's path"):
        generate_artifacts(
            onnx.load(base, load_external_data=False), requires_grad=["fc2.weight"], artifact_directory=tmp_path / "a"
        )
    lora = LoraConfig(r=2, targets=("fc1.weight",), frozen_dtype=torch.bfloat16)
    with pytest.raises(ModelError, match=r"give Module\(\.\.\., lora=LoraConfig\(frozen_dtype=\.\.\.\)\)"):
        generate_artifacts(
            base, requires_grad=["fc2.weight"], lora=lora, artifact_directory=tmp_path / "b",
            external_data_threshold=THRESHOLD,
        )  # fmt: skip
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
