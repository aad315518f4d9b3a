"""Reading a checkpoint leaves nothing of the file behind for the garbage collector."""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from ort_torch_train.checkpoint.odtc import read_checkpoint
from ort_torch_train.graph.fbs_reader import FlatBuffer
from ort_torch_train.state.training_state import TrainingState


def test_the_file_buffer_is_freed_when_reading_ends(tmp_path: Path) -> None:
    params = {f"w{i}": torch.nn.Parameter(torch.randn(4, 4)) for i in range(3)}
    TrainingState(params).save(tmp_path / "checkpoint")
    enabled = gc.isenabled()
    gc.disable()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        record = read_checkpoint(tmp_path / "checkpoint")
        gc.collect()
        cyclic = [type(o).__name__ for o in gc.garbage if isinstance(o, FlatBuffer)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()
    assert sorted(record.trainable) == ["w0", "w1", "w2"]
    # a FlatBuffer in a reference cycle keeps the whole file's bytes until the collector runs
    assert cyclic == []
