"""The torch-free description of a checkpoint (``checkpoint/summary``, what ``inspect`` shows) agrees with the
TrainingState loaded from the same file, and refuses what loading refuses, with the same message."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ort_torch_train.checkpoint.odtc import checkpoint_to_bytes, write_checkpoint
from ort_torch_train.checkpoint.records import CheckpointRecord, OptimizerGroupRecord
from ort_torch_train.checkpoint.summary import summarize_checkpoint
from ort_torch_train.dtypes import ONNX_TO_TORCH, dtype_name
from ort_torch_train.elem_types import ELEM_DTYPES
from ort_torch_train.errors import CheckpointError
from ort_torch_train.state.training_state import TrainingState


def _record(**changes: object) -> CheckpointRecord:
    moments = {"w": {"momentum0": torch.ones(4, 3), "momentum1": torch.full((4, 3), 2.0)}}
    fields: dict = {
        "trainable": {"w": torch.randn(4, 3), "b": torch.randn(3, dtype=torch.float64)},
        "frozen": {"ids": torch.arange(5), "mask": torch.tensor([True, False])},
        "optimizer_groups": [OptimizerGroupRecord("group0", 7, 0.25, moments)],
        "properties": {"epoch": 2, "loss": 0.5, "note": "x"},
    }
    return CheckpointRecord(**{**fields, **changes})


def test_elem_types_name_every_torch_dtype_the_checkpoints_hold() -> None:
    assert list(ELEM_DTYPES) == list(ONNX_TO_TORCH)
    for code, dtype in ONNX_TO_TORCH.items():
        assert ELEM_DTYPES[code] == (dtype_name(dtype), dtype.itemsize)


@pytest.mark.parametrize("external", [False, True])
def test_the_summary_describes_what_the_loaded_state_holds(tmp_path: Path, external: bool) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(), path, external_data_threshold=16 if external else 2**40)
    summary, state = summarize_checkpoint(path), TrainingState.load(path)
    assert summary.has_external_data == state.has_external_data == external
    assert [(p.name, p.dtype, p.shape, p.trainable) for p in summary.parameters] == [
        (name, dtype_name(p.dtype), list(p.shape), p.requires_grad) for name, p in state.params.items()
    ]
    assert state.optimizer is not None and summary.optimizer is not None
    assert (summary.optimizer.name, summary.optimizer.step, summary.optimizer.initial_learning_rate) == (
        state.optimizer.group_name,
        state.optimizer.step,
        state.optimizer.initial_learning_rate,
    )
    assert summary.optimizer.momentums == {name: list(m) for name, m in state.optimizer.momentums.items()}
    assert summary.properties == state.properties
    assert not summary.is_nominal


def test_a_nominal_summary_has_dtypes_and_no_shapes() -> None:
    data = checkpoint_to_bytes(_record(optimizer_groups=[], is_nominal=True))
    summary = summarize_checkpoint(data)
    assert summary.is_nominal
    assert [(p.name, p.dtype, p.shape) for p in summary.parameters] == [  # ORT's layout: sorted by name
        ("b", "float64", None),
        ("w", "float32", None),
        ("ids", "int64", None),
        ("mask", "bool", None),
    ]


@pytest.mark.parametrize(
    "changes",
    [
        {"optimizer_groups": [OptimizerGroupRecord("a", 1, 0.1, {}), OptimizerGroupRecord("b", 1, 0.1, {})]},
        {"optimizer_groups": [OptimizerGroupRecord("a", 1, 0.1, {"nothing": {"momentum0": torch.ones(1)}})]},
        {"optimizer_groups": [OptimizerGroupRecord("a", 1, 0.1, {"w": {"momentum0": torch.ones(3, 4)}})]},
        {"trainable": {"count": torch.arange(3)}, "optimizer_groups": []},
    ],
    ids=["two groups", "moments of no parameter", "moments shaped unlike their parameter", "integer trainable"],
)
def test_the_summary_refuses_what_loading_refuses(changes: dict) -> None:
    data = checkpoint_to_bytes(_record(**changes))
    with pytest.raises(CheckpointError) as loading:
        TrainingState.load(data)
    with pytest.raises(CheckpointError) as summarizing:
        summarize_checkpoint(data)
    assert str(summarizing.value) == str(loading.value)


def test_a_damaged_buffer_is_refused_by_both_alike() -> None:
    data = bytearray(checkpoint_to_bytes(_record()))
    data[-40:] = b"\xff" * 40
    with pytest.raises(CheckpointError) as loading:
        TrainingState.load(bytes(data))
    with pytest.raises(CheckpointError) as summarizing:
        summarize_checkpoint(bytes(data))
    assert str(summarizing.value) == str(loading.value)
