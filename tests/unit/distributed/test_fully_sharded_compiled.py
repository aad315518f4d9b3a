"""Compiled sharded steps (``Module(sharding=..., compile=...)``): each layer unit's stretch of the graph compiled
on its own inside FSDP2's hooks, on 2 gloo ranks (tests/helpers/sharding_worker.py) against one process's
compiled and eager runs of the same artifacts and batches, with recompute and without; the settings compiled
sharding refuses; the legacy session's ``gelu_recompute``, ``attn_dropout_recompute`` and
``transformer_layer_recompute`` with ZeRO stages 2 and 3. Every 2-rank scenario of the file runs in one launch
shared by its tests, and each one-process reference once, in the test process (``launched``)."""

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
    rank_results,
    sharding_launch,
)

COMPILED = "compile"  # sharding_worker.OPTIONS: aot_eager, whose graphs Dynamo counts as inductor's
LEGACY_BERT = "bert.onnx"  # made in the shared folder before the ranks start (``export_legacy_bert``)

ONE_PROCESS = tuple(  # run in the test process, before the ranks start
    f"{run_name}:none{option}" for run_name in ("mlp", "transformer") for option in ("", f":{COMPILED}", ":recompute")
)
TWO_RANKS = (
    f"mlp:zero2:{COMPILED}",
    f"mlp:zero2:{COMPILED}_recompute",
    f"transformer:zero3:{COMPILED}",
    f"transformer:zero3:{COMPILED}_recompute",
    "mlp:zero3:inductor",
    "mlp:zero3:inductor_recompute",
    f"fit:zero2:{COMPILED}",
    "legacy:2:gelu",
    "legacy:3:gelu",
    "legacy:2:layers",
    "legacy:3:layers",
    "legacy:3:dropout",
    "legacy:3:attn_dropout",
)


def export_legacy_bert(out: Path) -> None:
    """``out/bert.onnx``: a ``Bert`` without dropout (seeded), its batch axis dynamic."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        export_bert(Bert(dropout=0.0), out / LEGACY_BERT, dynamic_batch=True)


def launched(tmp_path_factory: pytest.TempPathFactory, scenario: str) -> Path:
    """The folder holding ``scenario``'s results: the run's one set of one-process runs and its one launch of
    2 ranks ran every scenario above; the test fails when ``scenario`` failed."""
    group = sharding_launch(
        tmp_path_factory, "fully_sharded_compiled_2_ranks", ONE_PROCESS, TWO_RANKS, 2, prepare=export_legacy_bert
    )
    return group.folder(scenario)


def shared_run(tmp_path_factory: pytest.TempPathFactory, scenario: str) -> list[dict[str, np.ndarray]]:
    """Each rank's results of ``scenario`` of the run's shared launch (one process: "<run>:none[:<option>]")."""
    return rank_results(launched(tmp_path_factory, scenario), scenario, 1 if scenario in ONE_PROCESS else 2)


def assert_compiled_once(ranks: list[dict[str, np.ndarray]]) -> None:
    """Every rank traced its graphs in the scenario's first step and none after it (no recompilation per
    step; the counts start at the scenario's start, whatever ran before it in the rank's process)."""
    for result in ranks:
        graphs = result["traced_graphs"]
        assert graphs[0] > 0 and (graphs == graphs[0]).all(), graphs
    assert len({int(r["traced_graphs"][0]) for r in ranks}) == 1


@pytest.mark.compile
@pytest.mark.distributed
@pytest.mark.parametrize(("run_name", "sharding"), [("mlp", "zero2"), ("transformer", "zero3")])
def test_compiled_sharded_steps_train_like_one_process(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, run_name: str, sharding: str
) -> None:
    """Without recompute against one process's compiled and eager runs; with ``recompute=True`` against one process's eager run with recompute: each unit's checkpoint inside its compiled
    graphs, whose forward keeps fewer tensors and fewer activation bytes for the backward than without it."""
    compiled = shared_run(tmp_path_factory, f"{run_name}:none:{COMPILED}")[0]
    eager = shared_run(tmp_path_factory, f"{run_name}:none")[0]
    recomputed = shared_run(tmp_path_factory, f"{run_name}:none:recompute")[0]
    plain, with_recompute = f"{run_name}:{sharding}:{COMPILED}", f"{run_name}:{sharding}:{COMPILED}_recompute"
    ranks, folder = shared_run(tmp_path_factory, plain), launched(tmp_path_factory, plain)
    assert_matches_one_process(compiled, ranks)
    assert_matches_one_process(eager, ranks)
    assert_compiled_once(ranks)
    assert_checkpoint_is_one_process_save(folder / f"{plain}.ckpt", ranks, tmp_path)
    ranks_recomputing = shared_run(tmp_path_factory, with_recompute)
    assert_matches_one_process(recomputed, ranks_recomputing)
    assert_compiled_once(ranks_recomputing)
    assert_checkpoint_is_one_process_save(folder / f"{with_recompute}.ckpt", ranks_recomputing, tmp_path)
    for without, within in zip(ranks, ranks_recomputing):
        assert within["saved_activation_bytes"] < without["saved_activation_bytes"]
        assert within["saved_tensors"] <= without["saved_tensors"]


@pytest.mark.slow
@pytest.mark.compile
@pytest.mark.distributed
def test_inductor_compiled_sharded_step_trains_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``compile=True`` (inductor, this project's CPU defaults) on the mlp under ZeRO-3, with ``recompute=True``
    too (inductor without its C++ wrapper), against one process's eager runs without and with
    recompute (a one-process inductor run would cost a compilation here; it trains like eager far inside the
    tolerances)."""
    for sharded, one_process in (("inductor", "mlp:none"), ("inductor_recompute", "mlp:none:recompute")):
        ranks = shared_run(tmp_path_factory, f"mlp:zero3:{sharded}")
        assert_matches_one_process(shared_run(tmp_path_factory, one_process)[0], ranks)
        assert_compiled_once(ranks)


@pytest.mark.compile
@pytest.mark.distributed
def test_fit_with_a_compiled_sharded_module_trains_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    single = sharding_worker.fit_run("none", 0, 1)
    ranks = shared_run(tmp_path_factory, f"fit:zero2:{COMPILED}")
    for result in ranks:
        np.testing.assert_allclose(result["losses"], single["losses"], rtol=LOSS_TOLERANCE, atol=0)
    assert_matches_one_process(single, ranks)


def test_compiled_sharding_refuses_adasum_by_name() -> None:
    with pytest.raises(ValueError, match="sharding: 'zero2' averages the gradients; got gradient_combination='adasum'"):
        EngineOptions.of(sharding="zero2", compile=True, gradient_combination="adasum")


@pytest.mark.distributed
def test_legacy_recompute_with_zero_stages_trains_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``gelu_recompute`` and ``transformer_layer_recompute`` with ``deepspeed_zero_stage`` 2 and 3:
    the GELU region (inside one sharding unit) is checkpointed on every rank; with whole transformer layers
    recomputed each numbered layer is one unit, so a layer's region gathers its parameters together; each
    run trains as one process with the same setting does."""
    bert = launched(tmp_path_factory, "legacy:3:layers") / LEGACY_BERT
    references = {"gelu": legacy_train(recompute="gelu"), "layers": sharded_layers_train(bert)}
    scenarios = [f"legacy:{stage}:{setting}" for setting in references for stage in (2, 3)]
    for scenario in scenarios:
        reference, ranks = references[scenario.rsplit(":", 1)[1]], shared_run(tmp_path_factory, scenario)
        regions = int(reference["recomputed_segments"])
        assert regions == (1 if scenario.endswith("gelu") else 2)  # every BERT layer but the last
        assert all(int(r["recomputed_segments"]) == regions for r in ranks)
        mean = np.mean([r["losses"] for r in ranks], axis=0)
        np.testing.assert_allclose(mean, reference["losses"], rtol=LOSS_TOLERANCE, err_msg=scenario)
        for key, value in reference.items():
            if key.startswith(("param/", "moment/")):
                for result in ranks:
                    np.testing.assert_allclose(result[key], value, rtol=0, atol=PARAMETER_TOLERANCE, err_msg=key)
    units = [str(unit) for unit in shared_run(tmp_path_factory, "legacy:3:layers")[0]["units"]]
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
def test_legacy_attn_dropout_recompute_with_zero_stage_3_replays_the_masks(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``attn_dropout_recompute`` with ``deepspeed_zero_stage`` 3: the Softmax's dropout region (inside one unit)
    is checkpointed, and its rerun draws the masks of the forward: each rank trains as the same sharded
    session without the setting does (ranks draw their own masks, so one process is no reference)."""
    plain, recomputed = (
        shared_run(tmp_path_factory, "legacy:3:dropout"),
        shared_run(tmp_path_factory, "legacy:3:attn_dropout"),
    )
    for without, within in zip(plain, recomputed):
        assert int(without["recomputed_segments"]) == 0 and int(within["recomputed_segments"]) == 1
        np.testing.assert_allclose(within["losses"], without["losses"], rtol=LOSS_TOLERANCE, atol=0)
        for key in (key for key in without if key.startswith("param/")):
            np.testing.assert_allclose(within[key], without[key], rtol=0, atol=PARAMETER_TOLERANCE, err_msg=key)
