"""Sharded training on FSDP2 (``distributed/fully_sharded.py``): 2 and 4 gloo ranks (tests/helpers/sharding_worker.py)
against one process on the same artifacts and batches; the per-layer cut of the graph; bad settings refused."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from ort_torch_train.api import CheckpointState
from ort_torch_train.checkpoint.odtc import read_checkpoint
from ort_torch_train.distributed.fully_sharded import check_sharding
from ort_torch_train.distributed.layer_units import LayerPlan, layer_of
from ort_torch_train.errors import DistributedError
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.options import EngineOptions
from ort_torch_train.training.recompute_patterns import RecomputePlan
from tests.helpers import sharding_worker
from tests.helpers.dist_grouped_launch import GroupedLaunch, grouped_launch
from tests.helpers.distributed_worker import MLP, legacy_train
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import launch as launch_ranks
from tests.integration.test_distributed_launch import torchrun
from tests.unit.cli.test_cli import run_cli

LOSS_TOLERANCE = 1e-6  # relative, each step
PARAMETER_TOLERANCE = 1e-5


ONE_PROCESS = (  # run in the test process, before the ranks start ("resume" continues "mlp:none"'s step 3)
    "mlp:none",
    "mlp:none:recompute",
    "transformer:none",
    "transformer:none:recompute",
    "transformer:none:bf16",
    "transformer:none:fp16",
    f"{sharding_worker.TIED_LM}:none",
    "mlp_clip_accumulate:none",
)
TWO_RANKS = (
    "mlp:zero2",
    "transformer:zero3",
    "transformer:zero3:recompute",
    "mlp:zero2:recompute",
    "transformer:zero3:bf16",
    "transformer:zero2:fp16",
    "legacy:3:fp16",
    f"{sharding_worker.TIED_LM}:zero3",
    "mlp_clip_accumulate:zero3",
    "fit:zero3",
    "resume:zero2",
    "legacy:2",
    "legacy:3",
    "misuse",  # last: its ranks start from different parameters on purpose
)
FOUR_RANKS = ("mlp:zero3",)


def sharding_launch(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    one_process: tuple[str, ...],
    scenarios: tuple[str, ...],
    world_size: int,
    prepare: Callable[[Path], None] | None = None,
) -> GroupedLaunch:
    """``sharding_worker``'s ``one_process`` scenarios ("<run>:none[:<option>]") in this process, then its
    ``scenarios`` in one launch of ``world_size`` ranks, once per test run under the shared folder ``name``
    (see ``dist_grouped_launch``)."""

    def launch(launched: list[str], out: Path) -> list[subprocess.CompletedProcess]:
        return launch_ranks(
            ",".join(launched),
            out,
            scaled(120 * len(launched)),
            worker_module=sharding_worker.__name__,
            world_size=world_size,
        )

    def in_process(scenario: str, out: Path) -> bool:
        if scenario not in one_process:
            return False
        np.savez(out / f"{scenario}_rank0.npz", **sharding_worker.train(scenario, 0, 1, out))
        return True

    return grouped_launch(tmp_path_factory, name, one_process + scenarios, world_size, launch, in_process, prepare)


def launched(tmp_path_factory: pytest.TempPathFactory, scenario: str) -> tuple[Path, int]:
    """The folder holding ``scenario``'s results and its world size: the run's one set of one-process runs and
    its one launch of each world size ran every scenario above; the test fails when ``scenario`` failed."""
    if scenario in FOUR_RANKS:
        return sharding_launch(tmp_path_factory, "fully_sharded_4_ranks", (), FOUR_RANKS, 4).folder(scenario), 4
    group = sharding_launch(
        tmp_path_factory, "fully_sharded_2_ranks", ONE_PROCESS, TWO_RANKS, 2, prepare=sharding_worker.make_tied_lm
    )
    return group.folder(scenario), 1 if scenario in ONE_PROCESS else 2


def rank_results(out: Path, scenario: str, world_size: int) -> list[dict[str, np.ndarray]]:
    """Each of ``world_size`` ranks' results of ``scenario``, saved under ``out``."""
    return [dict(np.load(out / f"{scenario}_rank{rank}.npz")) for rank in range(world_size)]


def shared_run(tmp_path_factory: pytest.TempPathFactory, scenario: str) -> list[dict[str, np.ndarray]]:
    """Each rank's results of ``scenario`` of the run's shared launches (one process: "<run>:none[:<option>]")."""
    out, world_size = launched(tmp_path_factory, scenario)
    return rank_results(out, scenario, world_size)


def assert_matches_one_process(single: dict[str, np.ndarray], ranks: list[dict[str, np.ndarray]]) -> None:
    """The ranks' mean loss each step is the one process's (each rank saw an equal share of the batch), and
    every rank reads the same whole final parameters and last gradients, those of the one process."""
    mean = np.mean([r["losses"] for r in ranks], axis=0)
    np.testing.assert_allclose(mean, single["losses"], rtol=LOSS_TOLERANCE, atol=0)
    names = [key for key in single if key.startswith(("param/", "grad/"))]
    assert names and names == [key for key in ranks[0] if key.startswith(("param/", "grad/"))]
    for name in names:
        for result in ranks:
            np.testing.assert_array_equal(result[name], ranks[0][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], single[name], rtol=0, atol=PARAMETER_TOLERANCE, err_msg=name)


def assert_checkpoint_is_one_process_save(path: Path, ranks: list[dict[str, np.ndarray]], tmp_path: Path) -> None:
    """The sharded run's checkpoint holds its whole final parameters, and one process that loads and saves it
    again writes the same bytes (moments included)."""
    state = CheckpointState.load_checkpoint(path)
    for name, param in state.parameters:
        np.testing.assert_array_equal(param.data, ranks[0][f"param/{name}"], err_msg=name)
    record = read_checkpoint(path.read_bytes())
    assert record.optimizer_groups and record.optimizer_groups[0].step == sharding_worker.STEPS
    again = tmp_path / "again.ckpt"
    CheckpointState.save_checkpoint(state, again, include_optimizer_state=True)
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.distributed
@pytest.mark.parametrize(("sharding", "world_size"), [("zero2", 2), ("zero3", 4)])
def test_mlp_sharded_trains_like_one_process(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, sharding: str, world_size: int
) -> None:
    """On 4 ranks the last layer's 5 rows are cut unevenly (2, 2, 1, 0): FSDP2 pads the shards."""
    single = shared_run(tmp_path_factory, "mlp:none")[0]
    ranks = shared_run(tmp_path_factory, f"mlp:{sharding}")
    assert len(ranks) == world_size
    assert_matches_one_process(single, ranks)
    sharded_folder, single_folder = (
        launched(tmp_path_factory, f"mlp:{sharding}")[0],
        launched(tmp_path_factory, "mlp:none")[0],
    )
    assert_checkpoint_is_one_process_save(sharded_folder / f"mlp:{sharding}.ckpt", ranks, tmp_path)
    # saved after the Optimizer is built, before its first step: one process's bytes (zero moments, step 0)
    step0 = (sharded_folder / f"mlp:{sharding}.step0.ckpt").read_bytes()
    assert step0 == (single_folder / "mlp:none.step0.ckpt").read_bytes()
    # get_contiguous_parameters gives every rank the whole flat buffer; copy_buffer_to_parameters takes a whole
    # one (each rank its shard): read back, every rank has one process's values
    for key in ("contiguous/first", "contiguous/copied"):
        for result in ranks:
            np.testing.assert_array_equal(result[key], single[key], err_msg=key)
    # eval gathers the parameters: each rank's eval loss on its half averages to the whole batch's
    np.testing.assert_allclose(np.mean([r["eval_loss"] for r in ranks]), single["eval_loss"], rtol=1e-6)


@pytest.mark.distributed
def test_transformer_zero3_trains_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    assert_matches_one_process(
        shared_run(tmp_path_factory, "transformer:none")[0], shared_run(tmp_path_factory, "transformer:zero3")
    )


@pytest.mark.distributed
@pytest.mark.parametrize(("run_name", "sharding"), [("transformer", "zero3"), ("mlp", "zero2")])
def test_recompute_per_layer_unit_trains_like_one_process(
    tmp_path_factory: pytest.TempPathFactory, run_name: str, sharding: str
) -> None:
    """``recompute=True`` under sharding checkpoints each layer unit: the same losses, parameters and gradients
    as one process with recompute, and each rank keeps fewer activation bytes for its backward than half of
    what one process without recompute keeps on the whole batch (the parameters a checkpoint keeps to rerun
    its unit are FSDP2's gathered ones, freed and gathered again under ZeRO-3: not counted)."""
    single = shared_run(tmp_path_factory, f"{run_name}:none:recompute")[0]
    ranks = shared_run(tmp_path_factory, f"{run_name}:{sharding}:recompute")
    assert_matches_one_process(single, ranks)
    whole_batch_kept = shared_run(tmp_path_factory, f"{run_name}:none")[0]["saved_activation_bytes"]
    assert all(0 < r["saved_activation_bytes"] < whole_batch_kept / 2 for r in ranks)


# Mixed precision: the ranks' matmuls see half the rows, so the weight gradients' low-precision sums differ
# from one process's by the dtype's rounding. Losses: within the dtype's machine epsilon relative (bf16
# 2**-7, fp16 2**-10). Parameters: AdamW moves a weight by at most about the learning rate each step, so two
# runs whose gradients differ by rounding drift apart by at most twice the learning rates' sum.
MIXED_LOSS_TOLERANCE = {"bf16": 2.0**-7, "fp16": 2.0**-10}


@pytest.mark.distributed
@pytest.mark.parametrize(("sharding", "precision"), [("zero3", "bf16"), ("zero2", "fp16")])
def test_mixed_precision_trains_like_one_process_under_the_same_autocast(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, sharding: str, precision: str
) -> None:
    single = shared_run(tmp_path_factory, f"transformer:none:{precision}")[0]
    ranks = shared_run(tmp_path_factory, f"transformer:{sharding}:{precision}")
    mean = np.mean([r["losses"] for r in ranks], axis=0)
    np.testing.assert_allclose(mean, single["losses"], rtol=MIXED_LOSS_TOLERANCE[precision], atol=0)
    float32 = shared_run(tmp_path_factory, "transformer:none")[0]["losses"]
    assert not np.allclose(mean, float32, rtol=1e-6, atol=0)  # the sharded forward ran under autocast
    drift = 2 * sharding_worker.LEARNING_RATES_SUM
    for name in (key for key in single if key.startswith("param/")):
        for result in ranks:
            np.testing.assert_array_equal(result[name], ranks[0][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], single[name], rtol=0, atol=drift, err_msg=name)
    scenario = f"transformer:{sharding}:{precision}"
    assert_checkpoint_is_one_process_save(launched(tmp_path_factory, scenario)[0] / f"{scenario}.ckpt", ranks, tmp_path)


@pytest.mark.distributed
def test_legacy_session_with_zero_stage_and_mixed_precision_trains_like_one_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``deepspeed_zero_stage`` 3 with ``use_mixed_precision`` (fp16, dynamic loss scale) against one process's
    fp16 session; Adam's 5 updates at learning rate 0.02 bound the parameters' drift (see above)."""
    reference = legacy_train(mixed_precision=True)
    ranks = shared_run(tmp_path_factory, "legacy:3:fp16")
    mean = np.mean([r["losses"] for r in ranks], axis=0)
    np.testing.assert_allclose(mean, reference["losses"], rtol=MIXED_LOSS_TOLERANCE["fp16"], atol=0)
    assert not np.allclose(mean, legacy_train()["losses"], rtol=1e-6, atol=0)  # the sharded session ran fp16
    for key in (key for key in reference if key.startswith("param/")):
        for result in ranks:
            np.testing.assert_allclose(result[key], reference[key], rtol=0, atol=2 * 5 * 0.02, err_msg=key)


@pytest.mark.distributed
def test_tied_embeddings_get_a_unit_of_their_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A GPT-2 whose token embedding is also its output projection: the embedding, read by the graph's
    first and last nodes, is a shared unit gathered for each of the two stretches (freed between them
    under ZeRO-3), and the run trains as one process does."""
    folder = launched(tmp_path_factory, f"{sharding_worker.TIED_LM}:zero3")[0]  # made there before the ranks started
    artifacts = folder / sharding_worker.TIED_LM / "artifacts"
    graph = onnx.load(artifacts / "training_model.onnx").graph
    plan = LayerPlan.of(graph, [i.name for i in graph.input][2:])
    assert plan.shared_unit and plan.owner[0] is None and plan.unit_count == len(plan.units) + 1
    single = shared_run(tmp_path_factory, f"{sharding_worker.TIED_LM}:none")[0]
    assert_matches_one_process(single, shared_run(tmp_path_factory, f"{sharding_worker.TIED_LM}:zero3"))


@pytest.mark.distributed
def test_clipping_and_accumulation_see_every_rank(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A clipping AdamW (the global norm of every rank's shards) with two micro-batches per step, the first
    under ``no_sync``."""
    single = shared_run(tmp_path_factory, "mlp_clip_accumulate:none")[0]
    assert_matches_one_process(single, shared_run(tmp_path_factory, "mlp_clip_accumulate:zero3"))


@pytest.mark.distributed
def test_fit_with_averaged_accumulation_trains_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    single = sharding_worker.fit_run("none", 0, 1)
    ranks = shared_run(tmp_path_factory, "fit:zero3")
    for result in ranks:  # fit reports the ranks' mean loss on every rank
        np.testing.assert_allclose(result["losses"], single["losses"], rtol=LOSS_TOLERANCE, atol=0)
    assert_matches_one_process(single, ranks)


@pytest.mark.distributed
def test_a_checkpoint_loaded_into_a_sharded_run_is_sharded(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One process's checkpoint after 3 steps (moments included) resumed on 2 sharded ranks: the last 3
    steps as the one process ran them."""
    single = shared_run(tmp_path_factory, "mlp:none")[0]
    ranks = shared_run(tmp_path_factory, "resume:zero2")
    assert_matches_one_process({**single, "losses": single["losses"][3:]}, ranks)


@pytest.mark.distributed
def test_ranks_launched_with_different_settings_are_refused_on_every_rank(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = launched(tmp_path_factory, "misuse")[0]
    for rank in range(2):
        errors = json.loads((out / f"misuse_rank{rank}.json").read_text())
        assert "different sharding settings" in errors["settings"] and f"rank {rank}" in errors["settings"]
        assert errors["nominal"].startswith("Cannot perform sharded or tensor-parallel training with a nominal state")
        assert "different parameters" in errors["parameters"] and f"rank {rank}" in errors["parameters"]


def test_layers_are_named_by_prefix() -> None:
    assert layer_of("model.layers.3.self_attn.q_proj.weight") == "model.layers.3.self_attn"
    assert layer_of("transformer.h.11.mlp.c_fc.bias") == "transformer.h.11.mlp"
    assert layer_of("transformer.h.0.ln_1.weight") == "transformer.h.0.ln_1"
    assert layer_of("h.0.weight") == "h.0"
    assert layer_of("enc.linear1.weight") == "enc.linear1"
    assert layer_of("0.weight") == "0"
    assert layer_of("scale") == "scale"
    # whole transformer layers recomputed: a numbered layer is one unit
    assert layer_of("model.layers.3.self_attn.q_proj.weight", whole_layers=True) == "model.layers.3"
    assert layer_of("transformer.h.0.ln_1.weight", whole_layers=True) == "transformer.h.0"
    assert layer_of("enc.linear1.weight", whole_layers=True) == "enc.linear1"


def test_a_parameter_read_across_layers_belongs_to_the_root() -> None:
    """Tied embeddings: read by the first layer's node and the last one's, so no layer's unit owns them."""
    nodes = [
        onnx.helper.make_node("Gather", ["wte", "ids"], ["h0"]),
        onnx.helper.make_node("MatMul", ["h0", "h.0.w"], ["h1"]),
        onnx.helper.make_node("Add", ["h1", "h.0.b"], ["h2"]),
        onnx.helper.make_node("MatMul", ["h2", "h.1.w"], ["h3"]),
        onnx.helper.make_node("MatMul", ["h3", "wte"], ["logits"]),
    ]
    graph = onnx.helper.make_graph(nodes, "g", [], [])
    plan = LayerPlan.of(graph, ["wte", "h.0.w", "h.0.b", "h.1.w"])
    assert plan.units == ("h.0", "h.1")
    assert plan.owner == (None, 0, 0, 1)
    assert plan.shared_unit and plan.unit_count == 3 and plan.unit_of(0) == 2  # its own unit, after the layers
    nodes.append(onnx.helper.make_node("Mul", ["wte", "h.1.w"], ["scaled"]))  # read with a layer's parameter
    mixed = LayerPlan.of(onnx.helper.make_graph(nodes, "g", [], []), ["wte", "h.0.w", "h.0.b", "h.1.w"])
    assert not mixed.shared_unit and mixed.unit_of(0) is None and mixed.unit_count == 2  # the root holds it


def test_the_option_is_checked_once() -> None:
    assert check_sharding("zero3") == "zero3" and check_sharding(None) is None
    with pytest.raises(ValueError, match=r"sharding: expected None, 'zero2' or 'zero3'; got 'zero4'"):
        check_sharding("zero4")
    with pytest.raises(ValueError, match="recomputes per layer unit: expected recompute=True .* got 2"):
        EngineOptions.of(sharding="zero3", recompute=2)
    with pytest.raises(ValueError, match="got 1"):
        EngineOptions.of(sharding="zero3", recompute=1, compile=True)
    for recompute in (True, RecomputePlan(transformer_layers=0)):  # taken, eager or compiled: a group is next
        for compile in (False, True):
            with pytest.raises(DistributedError, match="process group"):
                EngineOptions.of(sharding="zero2", recompute=recompute, compile=compile)


CLI_ARGS = ["--inputs", "x_train,y_train", "--steps", 4, "--batch-size", 64, "--no-shuffle", "--json"]


def test_train_cli_sharding_needs_a_launch(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    data = ["train", MLP / "artifacts", "--data", MLP / "data.npz", "--batched", *CLI_ARGS[:-1]]
    code, _, err = run_cli(capsys, *data, "--sharding", "zero3", "--output", tmp_path / "out")
    assert code != 0 and "--sharding zero3" in err and "torchrun" in err


@pytest.mark.distributed
def test_train_cli_with_sharding_trains_like_one_process(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """``torchrun ... train --sharding zero3``: each of 2 ranks feeds 32 of every 64 rows."""
    assert_cli_sharded_trains_like_one_process(capsys, tmp_path, "zero3")


def assert_cli_sharded_trains_like_one_process(
    capsys: pytest.CaptureFixture, tmp_path: Path, sharding: str, *options: str
) -> None:
    """``train`` in one process and ``torchrun ... train --sharding SHARDING`` on 2 ranks (with ``options`` both)
    end at step 4 with the same parameters."""
    common = ["train", MLP / "artifacts", "--data", MLP / "data.npz", "--batched", *CLI_ARGS, *options]
    code, _, err = run_cli(capsys, *common, "--output", tmp_path / "one")
    assert code == 0, err
    launched = torchrun("-m", "ort_torch_train", *common, "--sharding", sharding, "--output", tmp_path / "sharded")
    assert json.loads(launched.stdout)["world_size"] == 2
    one, sharded = TrainingState.load(tmp_path / "one"), TrainingState.load(tmp_path / "sharded")
    assert sharded.optimizer is not None and sharded.optimizer.step == 4
    for name, param in one.params.items():
        np.testing.assert_allclose(sharded.params[name].detach(), param.detach(), rtol=0, atol=PARAMETER_TOLERANCE)


@pytest.mark.distributed
@pytest.mark.parametrize("stage", [2, 3])
def test_legacy_session_with_zero_stage_trains_like_one_process(
    tmp_path_factory: pytest.TempPathFactory, stage: int
) -> None:
    """Adam with clipping and 2-step accumulation reduced once; its state read and loaded into a new session
    at step 8 (gathered, then cut again)."""
    reference = legacy_train()
    ranks = shared_run(tmp_path_factory, f"legacy:{stage}")
    np.testing.assert_allclose(np.mean([r["losses"] for r in ranks], axis=0), reference["losses"], rtol=1e-6)
    for key, value in reference.items():
        if key.startswith(("param/", "moment/")):
            for result in ranks:
                np.testing.assert_allclose(result[key], value, rtol=0, atol=PARAMETER_TOLERANCE, err_msg=key)
    full = int(reference["held_moment_elements"])
    assert sum(int(r["held_moment_elements"]) for r in ranks) == full  # each rank holds its shards only
