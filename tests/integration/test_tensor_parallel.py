"""Tensor parallel (``Module(tensor_parallel_size=N)``, legacy ``horizontal_parallel_size``) on gloo
ranks (tests/helpers/tensor_parallel_worker.py) against one process on the same batches.

The ranks split the transformer fixture's MLP pair (and the attention model's heads too), each holding
its share of the paired weights, their gradients and moments; their summation order differs from one
process's, so values agree within tolerances, not bitwise; the ranks agree with each other bitwise.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ort_torch_train.state.training_state import TrainingState
from tests.helpers import tensor_parallel_worker as worker
from tests.helpers.attention_model import make_attention_fixture
from tests.helpers.dist_grouped_launch import grouped_launch
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.helpers.paths import ROOT
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import launch, require_success

LOSS_RTOL = 1e-6
PARAM_ATOL = 1e-5
MLP_PAIR = {"enc.linear1.weight", "enc.linear1.bias", "enc.linear2.weight"}  # the transformer's sharded parameters
ATTENTION_MLP = {"block.fc1.weight", "block.fc1.bias", "block.fc2.weight"}


def results(out: Path, run: str, world_size: int) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(out / f"{run}_rank{rank}.npz")) for rank in range(world_size)]


def reference(tmp_path: Path, run: str, legacy: bool = False, recompute: int | None = None) -> dict[str, np.ndarray]:
    """One process on the full batches."""
    one = tmp_path / "one_process"
    one.mkdir(exist_ok=True)
    if legacy:
        worker.legacy_train(one, run, 1)
    else:
        worker.train(one, run, recompute=recompute)
    return dict(np.load(one / f"{run}_rank0.npz"))


def assert_holds_its_share(
    ranks: list[dict[str, np.ndarray]], one: dict[str, np.ndarray], sharded: set[str], tp_size: int
) -> None:
    """Each rank holds 1/tp_size of the ``sharded`` parameters' bytes (tensor, gradient and moments) and
    the whole of every other parameter's, as one process holds them."""
    whole = json.loads(str(one["held"]))
    assert sharded <= set(whole)
    expected = {name: size // tp_size if name in sharded else size for name, size in whole.items()}
    for rank, result in enumerate(ranks):
        assert json.loads(str(result["held"])) == expected, f"rank {rank}"


def assert_checkpoint_is_one_process_save(path: Path, ranks: list[dict[str, np.ndarray]], tmp_path: Path) -> None:
    """The run's checkpoint holds its whole final parameters, and one process that loads and saves it
    again writes the same bytes (moments included)."""
    from ort_torch_train.api import CheckpointState

    state = CheckpointState.load_checkpoint(path)
    for name, param in state.parameters:
        np.testing.assert_array_equal(param.data, ranks[0][f"param/{name}"], err_msg=name)
    again = tmp_path / f"{path.stem}_again.ckpt"
    CheckpointState.save_checkpoint(state, again, include_optimizer_state=True)
    assert again.read_bytes() == path.read_bytes()


def assert_like_one_process(ranks: list[dict[str, np.ndarray]], one: dict[str, np.ndarray], replicas: int) -> None:
    """The ranks hold bitwise the same parameters, within PARAM_ATOL of one process's; the replicas'
    mean loss is one process's within LOSS_RTOL at every step."""
    for key in one:
        if key.startswith("param/"):
            for rank, result in enumerate(ranks[1:], 1):
                assert np.array_equal(result[key], ranks[0][key]), f"rank {rank} differs from rank 0 on {key}"
            np.testing.assert_allclose(ranks[0][key], one[key], rtol=0, atol=PARAM_ATOL, err_msg=key)
    group = len(ranks) // replicas
    losses = np.mean([ranks[replica * group]["losses"] for replica in range(replicas)], axis=0)
    np.testing.assert_allclose(losses, one["losses"], rtol=LOSS_RTOL, atol=0)


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One launch of 2 ranks: the MLP pair's runs, the attention model's and the bad-input cases
    (tests/helpers/tensor_parallel_worker.py's ``two_ranks`` scenario)."""

    def prepare(out: Path) -> None:
        make_attention_fixture(out / worker.ATTENTION)  # 4 heads: 2 per rank
        make_attention_fixture(out / worker.ODD_HEADS, hidden=12, heads=3)

    def launch_ranks(scenarios: list[str], out: Path) -> list[subprocess.CompletedProcess]:
        return launch(",".join(scenarios), out, timeout=scaled(240), worker_module=worker.__name__)

    # made once for every pytest-xdist worker of the run (dist_grouped_launch)
    group = grouped_launch(tmp_path_factory, "tensor_parallel_2_ranks", ["two_ranks"], 2, launch_ranks, prepare=prepare)
    return group.folder("two_ranks")


@pytest.mark.distributed
def test_two_ranks_split_the_mlp_pair_and_train_like_one_process(two_ranks: Path, tmp_path: Path) -> None:
    ranks = results(two_ranks, "tensor_parallel", 2)
    one = reference(tmp_path, "tensor_parallel")
    assert_like_one_process(ranks, one, replicas=1)
    assert_holds_its_share(ranks, one, MLP_PAIR, tp_size=2)
    # get_contiguous_parameters gives every rank the whole flat buffer; copy_buffer_to_parameters takes a whole
    # one (each rank its shard): read back, every rank has one process's values
    for key in ("contiguous/first", "contiguous/copied"):
        for rank in ranks:
            np.testing.assert_array_equal(rank[key], one[key], err_msg=key)
    # a step all-reduces the pair's output and its input's gradient; the gradients of its three sharded
    # parameters (the column weight and bias, the row weight) stay sharded: nothing is gathered
    assert json.loads(str(one["collectives"])) == {}
    collectives = json.loads(str(ranks[0]["collectives"]))
    moved = {op: collectives.get(f"_c10d_functional.{op}") for op in ("all_reduce", "all_gather_into_tensor")}
    assert moved == {"all_reduce": 2, "all_gather_into_tensor": None}, collectives
    for rank in ranks:  # eval runs the whole graph on every rank
        np.testing.assert_allclose(rank["eval_loss"], ranks[0]["eval_loss"], rtol=0, atol=0)
    # the attention and head layers match no pattern: named in one warning
    (warning,) = ranks[0]["warnings"]
    assert "enc.self_attn.in_proj_weight" in warning and "head.weight" in warning
    assert "enc.linear1.weight" not in warning


@pytest.mark.distributed
def test_two_ranks_split_the_attention_heads_and_the_mlp_and_train_like_one_process(
    two_ranks: Path, tmp_path: Path
) -> None:
    out = two_ranks
    ranks = results(out, "attention", 2)
    one_process = tmp_path / "one_process"
    one_process.mkdir()
    worker.train(one_process, "attention", fixture=out / worker.ATTENTION)
    one = dict(np.load(one_process / "attention_rank0.npz"))
    assert_like_one_process(ranks, one, replicas=1)
    # the 7 + 3 sharded parameters: the projections' weights and biases, the output projection's weight;
    # the MLP's column weight and bias and row weight
    projections = {f"block.{layer}.{kind}" for layer in ("query", "key", "value") for kind in ("weight", "bias")}
    assert_holds_its_share(ranks, one, projections | {"block.output.weight", *ATTENTION_MLP}, tp_size=2)
    # a step all-reduces the attention's and the MLP's outputs and their inputs' gradients (the three
    # projections share one input); the sharded parameters' gradients stay sharded
    collectives = json.loads(str(ranks[0]["collectives"]))
    moved = {op: collectives.get(f"_c10d_functional.{op}") for op in ("all_reduce", "all_gather_into_tensor")}
    assert moved == {"all_reduce": 4, "all_gather_into_tensor": None}, collectives
    (warning,) = ranks[0]["warnings"]  # only the classifier's head runs replicated
    assert "['head.weight']" in warning
    assert_checkpoint_is_one_process_save(out / "attention.ckpt", ranks, tmp_path)


@pytest.mark.distributed
def test_tensor_parallel_checkpoint_is_the_one_process_file(two_ranks: Path, tmp_path: Path) -> None:
    ranks = results(two_ranks, "tensor_parallel", 2)
    assert_checkpoint_is_one_process_save(two_ranks / "tensor_parallel.ckpt", ranks, tmp_path)
    # saved after the Optimizer is built, before its first step: one process's bytes (zero moments, step 0),
    # the loaded checkpoint's parameters
    from ort_torch_train.api import CheckpointState

    reference(tmp_path, "tensor_parallel")
    step0 = (two_ranks / "tensor_parallel_step0.ckpt").read_bytes()
    assert step0 == (tmp_path / "one_process" / "tensor_parallel_step0.ckpt").read_bytes()
    state = CheckpointState.load_checkpoint(worker.TRANSFORMER / "artifacts" / "checkpoint")
    for name, param in CheckpointState.load_checkpoint(two_ranks / "tensor_parallel_step0.ckpt").parameters:
        np.testing.assert_array_equal(param.data, state.parameters[name].data)


@pytest.mark.distributed
def test_export_bakes_the_whole_trained_weights_in(two_ranks: Path) -> None:
    import onnx
    from onnx import numpy_helper

    ranks = results(two_ranks, "tensor_parallel", 2)
    for rank in range(2):
        model = onnx.load(two_ranks / f"tensor_parallel_inference_rank{rank}.onnx")
        baked = {tensor.name: numpy_helper.to_array(tensor) for tensor in model.graph.initializer}
        for name in MLP_PAIR:  # the split weights, gathered whole
            np.testing.assert_array_equal(baked[name], ranks[0][f"param/{name}"], err_msg=f"rank {rank}: {name}")


@pytest.mark.distributed
def test_a_checkpoint_with_moments_loaded_into_tensor_parallel_ranks_is_sharded(
    two_ranks: Path, tmp_path: Path
) -> None:
    """The ranks resume from their own checkpoint (parameters and AdamW's moments), as one process resumes."""
    one = tmp_path / "one_process"
    one.mkdir()
    worker.train(one, "resumed", checkpoint=two_ranks / "tensor_parallel.ckpt")
    resumed = dict(np.load(one / "resumed_rank0.npz"))
    ranks = results(two_ranks, "resumed", 2)
    assert_like_one_process(ranks, resumed, replicas=1)
    assert_holds_its_share(ranks, resumed, MLP_PAIR, tp_size=2)
    saved = TrainingState.load(two_ranks / "resumed.ckpt")
    assert saved.optimizer is not None and saved.optimizer.step == 2 * worker.STEPS
    assert_checkpoint_is_one_process_save(two_ranks / "resumed.ckpt", ranks, tmp_path)


@pytest.mark.distributed
def test_recompute_and_sharded_optimizer_state_compose_with_tensor_parallel(two_ranks: Path, tmp_path: Path) -> None:
    """With SGD and a gradient clip that bites: the clip's norm counts each shard and each whole gradient once."""
    ranks = results(two_ranks, "recompute_sharded", 2)
    one = reference(tmp_path, "recompute_sharded", recompute=2)
    assert_like_one_process(ranks, one, replicas=1)
    assert_holds_its_share(ranks, one, MLP_PAIR, tp_size=2)
    saved = TrainingState.load(two_ranks / "recompute_sharded.ckpt")  # whole values, moments gathered
    for name, param in saved.params.items():
        np.testing.assert_array_equal(param.detach().numpy(), ranks[0][f"param/{name}"])
        assert all(moment.shape == param.shape for moment in saved.optimizer.momentums[name].values()), name


@pytest.mark.distributed
def test_legacy_horizontal_parallel_size_trains_like_one_process(two_ranks: Path, tmp_path: Path) -> None:
    assert_like_one_process(results(two_ranks, "legacy", 2), reference(tmp_path, "legacy", legacy=True), replicas=1)


@pytest.mark.distributed
def test_four_ranks_tensor_by_data_parallel_train_like_one_process(tmp_path: Path) -> None:
    out = tmp_path / "ranks"
    out.mkdir()
    require_success(
        launch("tensor_and_data_parallel", out, timeout=scaled(120), worker_module=worker.__name__, world_size=4)
    )
    ranks = results(out, "tensor_and_data_parallel", 4)
    one = reference(tmp_path, "tensor_and_data_parallel")
    assert_like_one_process(ranks, one, replicas=2)
    assert_holds_its_share(ranks, one, MLP_PAIR, tp_size=2)
    assert_checkpoint_is_one_process_save(out / "tensor_and_data_parallel.ckpt", ranks, tmp_path)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "case, expected",
    [
        ("different_settings", "different tensor parallel settings"),
        ("size_not_dividing", "expected a world size of a multiple of 3, got 2"),
        ("no_pattern", "no weight pair or attention block to shard"),
        ("hidden_not_dividing", "has 5 hidden features, expected a multiple of 2"),
        ("heads_not_dividing", "-> attention -> block.output.weight has 3 heads, expected a multiple of 2"),
        ("nominal_state", "NominalStateError: Cannot perform sharded or tensor-parallel training with a nominal"),
    ],
)
def test_bad_input_raises_on_every_rank_before_the_first_step(two_ranks: Path, case: str, expected: str) -> None:
    for rank in range(2):
        errors = json.loads((two_ranks / f"errors_rank{rank}.json").read_text())
        assert expected in errors[case], f"rank {rank}: {errors[case]}"


@pytest.mark.distributed
def test_the_example_under_torchrun_splits_the_mlp_and_trains_like_one_process(tmp_path: Path) -> None:
    from tests.helpers import distributed_worker
    from tests.integration.test_distributed_launch import assert_same_parameters, json_objects, torchrun

    launched = torchrun(
        ROOT / "examples" / "train_ddp.py", distributed_worker.MLP, "--tensor-parallel", 2, "--out", tmp_path
    )
    summaries = sorted(json_objects(launched.stdout), key=lambda s: s["rank"])
    assert [s["last_loss"] for s in summaries[1:]] == [summaries[0]["last_loss"]]  # one replica: the same loss
    reference = distributed_worker.train("mlp_adamw_sched")  # 1 process, the same batches and schedule
    params = {k.removeprefix("param/"): v for k, v in reference.items() if k.startswith("param/")}
    assert_same_parameters(tmp_path / "checkpoint", params)


@pytest.mark.distributed
@pytest.mark.ort_peer
@requires_ort[1]
def test_ort_reads_the_tensor_parallel_checkpoint_bit_for_bit(two_ranks: Path) -> None:
    script = (
        "import sys, json\nfrom onnxruntime.training.api import CheckpointState\n"
        "s = CheckpointState.load_checkpoint(sys.argv[1])\n"
        "print(json.dumps({n: p.data.tobytes().hex() for n, p in s.parameters}))"
    )
    theirs = run_ort(script, two_ranks / "tensor_parallel.ckpt")
    ours = results(two_ranks, "tensor_parallel", 2)[0]
    assert sorted(theirs) == sorted(key.removeprefix("param/") for key in ours if key.startswith("param/"))
    for name, data in theirs.items():
        assert bytes.fromhex(data) == ours[f"param/{name}"].astype(np.float32).tobytes(), name
