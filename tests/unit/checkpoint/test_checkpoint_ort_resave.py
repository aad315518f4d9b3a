"""A checkpoint with external data that ORT 1.19.2 re-saves in place (ignoring our manifest) still loads."""

from __future__ import annotations

from pathlib import Path

from ort_torch_train.checkpoint.odtc import read_checkpoint, write_checkpoint
from ort_torch_train.checkpoint.pair import manifest_path
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.unit.checkpoint.test_checkpoint_atomic import _generation, _record

pytestmark = requires_ort

ORT_RESAVE = """
import json, sys
from onnxruntime.training.api import CheckpointState
state = CheckpointState.load_checkpoint(sys.argv[1])
state.properties["resaved_by"] = "ort"
CheckpointState.save_checkpoint(state, sys.argv[1], True)
print(json.dumps("saved"))
"""


def test_ort_resave_in_place_with_unchanged_parameters_loads(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(_record(5, True), path)
    assert run_ort(ORT_RESAVE, path) == "saved"
    assert manifest_path(path).exists()  # ORT ignores the manifest and leaves it stale
    record = read_checkpoint(path)
    assert record.properties["resaved_by"] == "ort" and _generation(path) == 5
    write_checkpoint(_record(6, True), path)  # and our next save takes the pair over again
    assert _generation(path) == 6
