"""Checkpoints written by this project, read by onnxruntime-training 1.19.2 itself.

ORT (in its own venv, see tests/helpers/ort_peer.py) loads each file, reports what it sees, trains the refcorpus
mlp from them, and re-saves them; its re-saves must equal our files byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.checkpoint.odtc import CheckpointRecord, external_data_path, read_checkpoint, write_checkpoint
from ort_torch_train.state.training_state import TrainingState
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.helpers.paths import REFCORPUS

pytestmark = requires_ort

ORT_SCRIPT = r"""
import json, sys
import numpy as np
from onnxruntime.training.api import CheckpointState, Module, Optimizer

work, mlp = sys.argv[1], sys.argv[2]
report = {}
for name in ("full", "with_optimizer", "external_mixed", "artifact_external"):
    state = CheckpointState.load_checkpoint(f"{work}/{name}")
    params = list(state.parameters)
    np.savez(f"{work}/{name}.ort.npz", **{n: p.data for n, p in params})
    report[name] = {"params": [[n, p.requires_grad] for n, p in params],
                    "properties": dict(state.properties)}
    CheckpointState.save_checkpoint(state, f"{work}/{name}.ort_saved", True)

nominal = CheckpointState.load_checkpoint(f"{work}/nominal")
report["nominal"] = {"names": nominal._state.parameter_names(), "len": len(nominal.parameters)}
CheckpointState.save_checkpoint(nominal, f"{work}/nominal.ort_saved")

data = np.load(f"{mlp}/data.npz")
def train(checkpoint, steps, lr=None):
    state = CheckpointState.load_checkpoint(checkpoint)
    module = Module(f"{mlp}/artifacts/training_model.onnx", state, f"{mlp}/artifacts/eval_model.onnx")
    optimizer = Optimizer(f"{mlp}/artifacts/optimizer_model.onnx", module)
    if lr is not None:
        optimizer.set_learning_rate(lr)
    losses = []
    for _ in range(steps):
        module.train()
        losses.append(float(module(data["x_train"][0], data["y_train"][0])))
        optimizer.step()
        module.lazy_reset_grad()
    return losses
report["full_losses"] = train(f"{work}/full", 1)
report["resume_losses"] = train(f"{work}/with_optimizer", 2, lr=0.01)
print(json.dumps(report))
"""


@pytest.fixture(scope="session")
def peer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, dict]:
    """Our checkpoints in a work directory, and ORT's report on them."""
    refcorpus = REFCORPUS
    if not (refcorpus / "mlp").is_dir():
        pytest.skip(f"reference corpus not found at {refcorpus}")
    mlp = refcorpus / "mlp"
    work = tmp_path_factory.mktemp("ort_peer")

    full = TrainingState.load(mlp / "artifacts" / "checkpoint")
    full.set_parameter_data("2.bias", np.linspace(-1, 1, 5, dtype=np.float32))
    for name, value in {"epoch": 7, "best_loss": 0.125, "tag": "ours ✓", "big": -(2**40)}.items():
        full.set_property(name, value)
    full.save(work / "full")

    with_optimizer = TrainingState.load(mlp / "final_checkpoint_with_optimizer")
    with_optimizer.save(work / "with_optimizer", include_optimizer_state=True)
    TrainingState.load(mlp / "artifacts" / "nominal_checkpoint").save(work / "nominal")

    mixed = CheckpointRecord(
        {"w": torch.randn(3, 2, generator=torch.Generator().manual_seed(0))},
        {
            "b": torch.tensor([True, False]),
            "d": torch.arange(3, dtype=torch.float64),
            "i": torch.arange(-2, 3),
            "s": torch.tensor(2.5),
            "u": torch.arange(3, dtype=torch.uint8),
        },
    )
    write_checkpoint(mixed, work / "external_mixed", external_data_threshold=0)
    mixed.trainable["big"] = torch.arange(40.0)  # >= 64 bytes: external in the artifact layout
    write_checkpoint(mixed, work / "artifact_external", external_data_threshold=0, artifact=True)

    report = run_ort(ORT_SCRIPT, work, mlp)
    expected = json.loads((mlp / "expected.json").read_text())
    return work, report, expected


def ours(work: Path, name: str) -> dict[str, np.ndarray]:
    record = read_checkpoint(work / name)
    return {n: t.numpy() for n, t in {**record.trainable, **record.frozen}.items()}


@pytest.mark.parametrize("name", ["full", "with_optimizer", "external_mixed", "artifact_external"])
def test_ort_reads_our_parameters_exactly(peer: tuple[Path, dict, dict], name: str) -> None:
    work, report, _ = peer
    record = read_checkpoint(work / name)
    assert report[name]["params"] == [[n, n in record.trainable] for n in sorted({**record.trainable, **record.frozen})]
    theirs = np.load(work / f"{name}.ort.npz")
    for param, value in ours(work, name).items():
        assert theirs[param].dtype == value.dtype and np.array_equal(theirs[param], value), param


def test_ort_reads_our_properties(peer: tuple[Path, dict, dict]) -> None:
    _, report, expected = peer
    assert report["full"]["properties"] == {"best_loss": 0.125, "big": -(2**40), "epoch": 7, "tag": "ours ✓"}
    assert report["with_optimizer"]["properties"] == expected["properties_readback"]


@pytest.mark.parametrize("name", ["full", "with_optimizer", "external_mixed"])
def test_ort_resaves_our_files_byte_identical(peer: tuple[Path, dict, dict], name: str) -> None:
    work, _, _ = peer
    assert (work / f"{name}.ort_saved").read_bytes() == (work / name).read_bytes()
    side = external_data_path(work / name)
    if side.exists():  # a state loaded with external data is saved with it, by ORT and by us
        assert external_data_path(work / f"{name}.ort_saved").read_bytes() == side.read_bytes()


def test_ort_reads_our_nominal_checkpoint_and_we_read_its(peer: tuple[Path, dict, dict]) -> None:
    work, report, expected = peer
    assert report["nominal"] == {"names": expected["checkpoint_parameter_order"], "len": 4}
    resaved = read_checkpoint(work / "nominal.ort_saved")  # ORT writes 4 bytes per nominal tensor
    assert resaved.is_nominal and sorted(resaved.trainable) == report["nominal"]["names"]
    assert all(t.numel() == 0 and t.dtype == torch.float32 for t in resaved.trainable.values())


def test_ort_trains_from_our_checkpoints(peer: tuple[Path, dict, dict]) -> None:
    _, report, expected = peer
    assert len(report["full_losses"]) == 1 and np.isfinite(report["full_losses"][0])
    # our re-save of the final state carries the optimizer state: ORT resumes exactly as from its own
    assert report["resume_losses"] == expected["resume"]["reloaded_with_optimizer_losses"]
