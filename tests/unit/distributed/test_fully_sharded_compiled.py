"""Compiled sharded steps (``Module(sharding=..., compile=...)``): each layer unit's stretch of the graph compiled
on its own inside FSDP2's hooks, on 2 gloo ranks (tests/helpers/sharding_worker.py) against one process's
compiled and eager runs of the same artifacts and batches, with recompute and without; the settings compiled
sharding refuses; the legacy session's ``gelu_recompute``, ``attn_dropout_recompute`` and
``transformer_layer_recompute`` with ZeRO stages 2 and 3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ort_torch_train.training.options import EngineOptions
from tests.helpers import sharding_worker
from tests.helpers.distributed_worker import legacy_train
from tests.helpers.legacy_bert import Bert, export_bert, sharded_layers_train
from tests.unit.distributed.test_fully_sharded import (
    LOSS_TOLERANCE,
    PARAMETER_TOLERANCE,
    assert_checkpoint_is_one_process_save,
    assert_cli_sharded_trains_like_one_process,
    assert_matches_one_process,
    run,
    run_in_one_launch,
)

COMPILED = "compile"  # sharding_worker.OPTIONS: aot_eager, whose graphs Dynamo counts as inductor's


def assert_compiled_once(ranks: list[dict[str, np.ndarray]]) -> None:
    """Every rank traced its graphs in the first step and none after it (no recompilation per step)."""
    for result in ranks:
        graphs = result["traced_graphs"]
        assert graphs[0] > 0 and (graphs == graphs[0]).all(), graphs
    assert len({int(r["traced_graphs"][0]) for r in ranks}) == 1


@pytest.mark.compile
@pytest.mark.distributed
@pytest.mark.parametrize(("run_name", "sharding"), [("mlp", "zero2"), ("transformer", "zero3")])
def test_compiled_sharded_steps_train_like_one_process(tmp_path: Path, run_name: str, sharding: str) -> None:
    """Without recompute against one process's compiled and eager runs; with ``recompute=True`` (the same
    launch) against one process's eager run with recompute: each unit's checkpoint inside its compiled
    graphs, whose forward keeps fewer tensors and fewer activation bytes for the backward than without it."""
    compiled = run(f"{run_name}:none:{COMPILED}", tmp_path, 1)[0]
    eager = run(f"{run_name}:none", tmp_path, 1)[0]
    recomputed = run(f"{run_name}:none:recompute", tmp_path, 1)[0]
    plain, with_recompute = f"{run_name}:{sharding}:{COMPILED}", f"{run_name}:{sharding}:{COMPILED}_recompute"
    launched = run_in_one_launch([plain, with_recompute], tmp_path, 2)
    ranks = launched[plain]
    assert_matches_one_process(compiled, ranks)
    assert_matches_one_process(eager, ranks)
    assert_compiled_once(ranks)
    assert_checkpoint_is_one_process_save(tmp_path / f"{plain}.ckpt", ranks, tmp_path)
    ranks_recomputing = launched[with_recompute]
    assert_matches_one_process(recomputed, ranks_recomputing)
    assert_compiled_once(ranks_recomputing)
    assert_checkpoint_is_one_process_save(tmp_path / f"{with_recompute}.ckpt", ranks_recomputing, tmp_path)
    for without, within in zip(ranks, ranks_recomputing):
        assert within["saved_activation_bytes"] < without["saved_activation_bytes"]
        assert within["saved_tensors"] <= without["saved_tensors"]


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.distributed
def test_inductor_compiled_sharded_step_trains_like_one_process(tmp_path: Path) -> None:
    """``compile=True`` (inductor, this project's CPU defaults) on the mlp under ZeRO-3, with ``recompute=True``
    too (the same launch; inductor without its C++ wrapper), against one process's eager runs without and with
    recompute (a one-process inductor run would cost a compilation here; it trains like eager far inside the
    tolerances)."""
    launched = run_in_one_launch(["mlp:zero3:inductor", "mlp:zero3:inductor_recompute"], tmp_path, 2)
    assert_matches_one_process(run("mlp:none", tmp_path, 1)[0], launched["mlp:zero3:inductor"])
    assert_compiled_once(launched["mlp:zero3:inductor"])
    assert_matches_one_process(run("mlp:none:recompute", tmp_path, 1)[0], launched["mlp:zero3:inductor_recompute"])
    assert_compiled_once(launched["mlp:zero3:inductor_recompute"])


@pytest.mark.compile
@pytest.mark.distributed
def test_fit_with_a_compiled_sharded_module_trains_like_one_process(tmp_path: Path) -> None:
    single = sharding_worker.fit_run("none", 0, 1)
    ranks = run(f"fit:zero2:{COMPILED}", tmp_path, 2)
    for result in ranks:
        np.testing.assert_allclose(result["losses"], single["losses"], rtol=LOSS_TOLERANCE, atol=0)
    assert_matches_one_process(single, ranks)


def test_compiled_sharding_refuses_adasum_by_name() -> None:
    with pytest.raises(ValueError, match="sharding: 'zero2' averages the gradients; got gradient_combination='adasum'"):
        EngineOptions.of(sharding="zero2", compile=True, gradient_combination="adasum")


@pytest.mark.distributed
def test_legacy_recompute_with_zero_stages_trains_like_one_process(tmp_path: Path) -> None:
    """``gelu_recompute`` and ``transformer_layer_recompute`` with ``deepspeed_zero_stage`` 2 and 3 (one launch):
    the GELU region (inside one sharding unit) is checkpointed on every rank; with whole transformer layers
    recomputed each numbered layer is one unit, so a layer's region gathers its parameters together; each
    run trains as one process with the same setting does."""
    torch.manual_seed(0)
    bert = export_bert(Bert(dropout=0.0), tmp_path / "bert.onnx", dynamic_batch=True)
    references = {"gelu": legacy_train(recompute="gelu"), "layers": sharded_layers_train(bert)}
    scenarios = [f"legacy:{stage}:{setting}" for setting in references for stage in (2, 3)]
    launched = run_in_one_launch(scenarios, tmp_path, 2)
    for scenario in scenarios:
        reference, ranks = references[scenario.rsplit(":", 1)[1]], launched[scenario]
        regions = int(reference["recomputed_segments"])
        assert regions == (1 if scenario.endswith("gelu") else 2)  # every BERT layer but the last
        assert all(int(r["recomputed_segments"]) == regions for r in ranks)
        mean = np.mean([r["losses"] for r in ranks], axis=0)
        np.testing.assert_allclose(mean, reference["losses"], rtol=LOSS_TOLERANCE, err_msg=scenario)
        for key, value in reference.items():
            if key.startswith(("param/", "moment/")):
                for result in ranks:
                    np.testing.assert_allclose(result[key], value, rtol=0, atol=PARAMETER_TOLERANCE, err_msg=key)
    units = [str(unit) for unit in launched["legacy:3:layers"][0]["units"]]
    assert units == ["ln0", "layers.0", "layers.1", "layers.2", "head"]


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.distributed
def test_train_cli_with_sharding_and_compile_trains_like_one_process(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    """``torchrun ... train --sharding zero2 --compile`` against one compiled process: each of 2 ranks feeds 32 of
    every 64 rows."""
    assert_cli_sharded_trains_like_one_process(capsys, tmp_path, "zero2", "--compile")


@pytest.mark.distributed
def test_legacy_attn_dropout_recompute_with_zero_stage_3_replays_the_masks(tmp_path: Path) -> None:
    """``attn_dropout_recompute`` with ``deepspeed_zero_stage`` 3: the Softmax's dropout region (inside one unit)
    is checkpointed, and its rerun draws the masks of the forward: each rank trains as the same sharded
    session without the setting does (ranks draw their own masks, so one process is no reference)."""
    plain, recomputed = run("legacy:3:dropout", tmp_path, 2), run("legacy:3:attn_dropout", tmp_path, 2)
    for without, within in zip(plain, recomputed):
        assert int(without["recomputed_segments"]) == 0 and int(within["recomputed_segments"]) == 1
        np.testing.assert_allclose(within["losses"], without["losses"], rtol=LOSS_TOLERANCE, atol=0)
        for key in (key for key in without if key.startswith("param/")):
            np.testing.assert_allclose(within[key], without[key], rtol=0, atol=PARAMETER_TOLERANCE, err_msg=key)
