"""Pipeline parallelism (``distributed/pipeline.py``, ``pipeline_plan.py``): ORT's cut grammar, the graph cut
into stages and its errors in one process; then 2 gloo ranks (tests/helpers/pipeline_worker.py), GPipe and 1F1B,
named and balanced cuts, Module and the legacy session, against one process on the same artifacts and batches."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch.distributed as dist

from ort_torch_train.api import CheckpointState, Module
from ort_torch_train.distributed.pipeline_plan import (
    CutEdge,
    PipelineOptions,
    cut_graph,
    loss_reduction,
    parse_cut_info,
)
from ort_torch_train.errors import ModelError
from ort_torch_train.graph.layout import forward_graph, training_layout
from ort_torch_train.training.options import EngineOptions
from tests.helpers import pipeline_worker as worker
from tests.helpers.dist_grouped_launch import grouped_launch
from tests.helpers.distributed_worker import MLP, TRANSFORMER
from tests.helpers.ort_peer import requires_ort, run_ort
from tests.helpers.paths import ROOT
from tests.helpers.sharding_worker import make_tied_lm
from tests.helpers.timeouts import scaled
from tests.integration.test_distributed import launch as launch_ranks
from tests.integration.test_distributed import require_success

LOSS_TOLERANCE = 1e-6  # relative, every step
PARAM_TOLERANCE = 1e-5
EVAL_TOLERANCE = 1e-5  # relative: the eval loss on parameters within PARAM_TOLERANCE


TWO_RANKS = ("train", "fit", "legacy", "misuse")  # the worker's scenarios, in the run's one launch of 2 ranks


def launched(tmp_path_factory: pytest.TempPathFactory, scenario: str) -> Path:
    """The folder of the run's one launch of 2 ranks that ran ``TWO_RANKS`` (the tied runs' fixture made there
    first; see ``dist_grouped_launch``); the test fails when ``scenario`` failed."""

    def launch(scenarios: list[str], out: Path) -> list[subprocess.CompletedProcess]:
        return launch_ranks(
            ",".join(scenarios), out, scaled(240 * len(scenarios)), worker_module=worker.__name__, world_size=2
        )

    return grouped_launch(tmp_path_factory, "pipeline_2_ranks", TWO_RANKS, 2, launch, prepare=make_tied_lm).folder(
        scenario
    )


def forward_of(fixture: Path) -> tuple[onnx.GraphProto, list[str], dict[str, int]]:
    """The fixture's forward training graph, its user inputs and its parameters' element counts."""
    state = CheckpointState.load_checkpoint(fixture / "artifacts" / "checkpoint").training_state
    model = onnx.load(fixture / "artifacts" / "training_model.onnx")
    layout = training_layout(model, list(state.params))
    graph = forward_graph(model, layout)
    return graph, list(layout.user_inputs), {name: state.params[name].numel() for name in layout.params}


# ---- one process ---------------------------------------------------------------------------------------------
def test_the_cut_string_reads_as_ort_reads_it() -> None:
    assert parse_cut_info("") == ()
    assert parse_cut_info("12") == ((CutEdge("12"),),)
    assert parse_cut_info("11,15") == ((CutEdge("11"),), (CutEdge("15"),))
    assert parse_cut_info("a:b-n1/n2,c") == ((CutEdge("a"), CutEdge("b", ("n1", "n2"))), (CutEdge("c"),))
    with pytest.raises(ValueError, match="empty tensor or consumer name in the edge 'b-'"):
        parse_cut_info("a:b-")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"stages": 0}, "pipeline stages: expected an int >= 1, got 0"),
        ({"stages": 2, "micro_batches": 1.5}, "pipeline micro_batches: expected an int >= 1, got 1.5"),
        ({"stages": 2, "schedule": "zb"}, r"pipeline schedule: expected one of \('gpipe', '1f1b'\), got 'zb'"),
        ({"stages": 3, "cuts": "a"}, r"3 stages need 2 cuts, got 1 \('a'\)"),
    ],
)
def test_options_are_checked_when_made(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PipelineOptions(**settings)


def test_cuts_may_be_a_list_of_tensor_names() -> None:
    assert PipelineOptions(stages=3, cuts=["a", "b"]).cuts == "a,b"


def test_a_pipeline_takes_eager_float32_steps_alone() -> None:
    with pytest.raises(ValueError, match=r"pipeline: runs eager float32 steps .* got \['compile', 'recompute'\]"):
        EngineOptions.of(pipeline=PipelineOptions(stages=2), compile=True, recompute=2)
    with pytest.raises(ValueError, match="expected an ort_torch_train.distributed.pipeline_plan.PipelineOptions"):
        EngineOptions.of(pipeline={"stages": 2})  # type: ignore[arg-type]


def test_named_cut_carries_what_later_stages_read() -> None:
    graph, inputs, params = forward_of(MLP)
    first, second = cut_graph(graph, inputs, params, {}, PipelineOptions(stages=2, cuts="/1/Relu_output_0"))
    assert first.inputs == ("input", "labels") and first.params == ("0.weight", "0.bias")
    assert first.outputs == ("labels", "/1/Relu_output_0")  # the labels travel to the loss
    assert second.inputs == first.outputs and second.params == ("2.weight", "2.bias")
    assert second.outputs == tuple(value.name for value in graph.output)


def test_balanced_cut_splits_by_parameter_elements() -> None:
    graph, inputs, params = forward_of(TRANSFORMER)
    stages = cut_graph(graph, inputs, params, {}, PipelineOptions(stages=3))
    held = [sum(params[name] for name in stage.params) for stage in stages]
    assert sum(held) == sum(params.values()) and all(held), held
    assert max(held) < 0.6 * sum(held), held


def test_bad_cuts_and_stage_counts_name_the_problem() -> None:
    graph, inputs, params = forward_of(MLP)
    with pytest.raises(
        ModelError, match=r"'nope' is not an edge of the graph .* valid ones include \['/0/Gemm_output_0'"
    ):
        cut_graph(graph, inputs, params, {}, PipelineOptions(stages=2, cuts="nope"))
    with pytest.raises(ModelError, match=r"\['x'\] do not consume '/0/Gemm_output_0'"):
        cut_graph(graph, inputs, params, {}, PipelineOptions(stages=2, cuts="/0/Gemm_output_0-x"))
    with pytest.raises(ModelError, match="cut 1 .* comes before or at cut 0"):
        cut_graph(graph, inputs, params, {}, PipelineOptions(stages=3, cuts="/1/Relu_output_0,/0/Gemm_output_0"))
    with pytest.raises(ModelError, match="3 stages need at least 3 nodes that read parameters; the graph has 2"):
        cut_graph(graph, inputs, params, {}, PipelineOptions(stages=3))


def test_the_loss_reduction_is_read_from_the_graph() -> None:
    graph, _, _ = forward_of(MLP)
    assert loss_reduction(graph, graph.output[0].name) == "mean"
    with pytest.raises(ModelError, match="the loss '/1/Relu_output_0' comes from Relu node"):
        loss_reduction(graph, "/1/Relu_output_0")
    loss = onnx.helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss"], ignore_index=-1)
    ignoring = onnx.helper.make_graph([loss], "g", [], [])
    with pytest.raises(ModelError, match="SoftmaxCrossEntropyLoss node .* without weights or ignore_index"):
        loss_reduction(ignoring, "loss")  # a mean over the rows kept: micro-batches keep other counts


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A gloo process group of this process alone, destroyed after the test."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_micro_batches_accumulate_like_whole_batches_of_any_size(one_rank: None) -> None:
    """One stage, 2 micro-batches, batches of 8, 4 and 8 rows without a reset: the losses and the
    accumulated gradients of one plain Module, within float rounding."""
    artifacts = MLP / "artifacts"
    data = np.load(MLP / "data.npz")
    x, y = data["x_train"][0], data["y_train"][0]
    plain = Module(artifacts / "training_model.onnx", CheckpointState.load_checkpoint(artifacts / "checkpoint"))
    piped = Module(
        artifacts / "training_model.onnx",
        CheckpointState.load_checkpoint(artifacts / "checkpoint"),
        pipeline=PipelineOptions(stages=1, micro_batches=2, schedule="1f1b"),
    )
    for rows in (8, 4, 8):
        np.testing.assert_allclose(piped(x[:rows], y[:rows]), plain(x[:rows], y[:rows]), rtol=LOSS_TOLERANCE)
    for name, param in plain.training_state.params.items():
        other = piped.training_state.params[name]
        np.testing.assert_allclose(other.grad.numpy(), param.grad.numpy(), rtol=0, atol=1e-6, err_msg=name)


# ---- two ranks -----------------------------------------------------------------------------------------------
@pytest.fixture
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return launched(tmp_path_factory, "train")


def assert_trains_like_one_process(out: Path, run: str, world_size: int) -> None:
    """Every rank's losses (each step), final parameters and eval loss match one process's; the ranks agree
    bitwise; each rank holds the parameters, gradients and moments of its stage's parameters and no other (a
    parameter two stages read on both, with the same values)."""
    reference = worker.train(run, pipelined=False, out=out)
    graph, inputs, params = forward_of(worker.fixture_of(run, out))
    stages = cut_graph(graph, inputs, params, {}, PipelineOptions(**worker.RUNS[run][1]))
    ranks = [dict(np.load(out / f"{run}_rank{rank}.npz")) for rank in range(world_size)]
    for stage, result in zip(stages, ranks):
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=LOSS_TOLERANCE, atol=0, err_msg=run)
        np.testing.assert_allclose(result["eval_loss"], reference["eval_loss"], rtol=EVAL_TOLERANCE, err_msg=run)
        for key in reference:
            if key.startswith("param/"):
                np.testing.assert_array_equal(result[key], ranks[0][key], err_msg=f"ranks differ on {key}")
                np.testing.assert_allclose(result[key], reference[key], rtol=0, atol=PARAM_TOLERANCE, err_msg=key)
        held = {name: int(result[f"bytes/{name}"]) for name in params}
        assert held == {name: int(reference[f"bytes/{name}"]) if name in stage.params else 0 for name in params}
        assert int(result["held_bytes"]) == sum(held.values()) > 0, (run, stage.params)
    holders = {name: [rank for rank, stage in enumerate(stages) if name in stage.params] for name in params}
    repeated = sum(int(reference[f"bytes/{name}"]) * (len(held_by) - 1) for name, held_by in holders.items() if held_by)
    assert sum(int(result["held_bytes"]) for result in ranks) == int(reference["held_bytes"]) + repeated
    shared = [name for name, held_by in holders.items() if len(held_by) > 1]
    assert bool(shared) == run.startswith("tied"), shared
    for name in shared:  # updated identically on each holder
        first, *others = holders[name]
        for rank in others:
            np.testing.assert_array_equal(ranks[rank][f"local/{name}"], ranks[first][f"local/{name}"], err_msg=name)


@pytest.mark.distributed
@pytest.mark.parametrize("run", [run for run, (_, settings) in worker.RUNS.items() if settings["stages"] == 2])
def test_two_stages_train_like_one_process(trained: Path, run: str) -> None:
    assert_trains_like_one_process(trained, run, 2)


@pytest.mark.distributed
@pytest.mark.slow
def test_four_stages_train_like_one_process(tmp_path: Path) -> None:
    require_success(launch_ranks("train4", tmp_path, scaled(240), worker_module=worker.__name__, world_size=4))
    assert_trains_like_one_process(tmp_path, "transformer_1f1b_4", 4)


@pytest.mark.distributed
@pytest.mark.parametrize("run", ["transformer_1f1b", "tied_1f1b"])
def test_the_checkpoint_is_the_one_a_single_process_writes(trained: Path, tmp_path: Path, run: str) -> None:
    """Rank 0 wrote the whole state, gathered from the stages (a tied embedding once): read back it holds the
    ranks' parameters, and one process saving what it read writes the same bytes."""
    saved = trained / f"{run}.ckpt"
    state = CheckpointState.load_checkpoint(saved)
    ranks = dict(np.load(trained / f"{run}_rank0.npz"))
    for name, param in state.parameters:
        np.testing.assert_array_equal(param.data, ranks[f"param/{name}"], err_msg=name)
    CheckpointState.save_checkpoint(state, tmp_path / "again.ckpt", include_optimizer_state=True)
    assert (tmp_path / "again.ckpt").read_bytes() == saved.read_bytes()
    if run == worker.LOADED_RUN:  # loaded back into the pipeline: every stage holds its parameters, tied ones on each
        whole = dict(state.parameters)
        for rank in range(2):
            held = dict(np.load(trained / f"{run}_loaded_rank{rank}.npz"))
            assert held
            for key, value in held.items():
                np.testing.assert_array_equal(value, whole[key.removeprefix("local/")].data, err_msg=key)
        shared = set(dict(np.load(trained / f"{run}_loaded_rank0.npz"))) & set(
            dict(np.load(trained / f"{run}_loaded_rank1.npz"))
        )
        assert shared == {"local/model.transformer.wte.weight"}, shared


@pytest.mark.distributed
@pytest.mark.ort_peer
@requires_ort[1]
def test_ort_reads_the_pipeline_checkpoint(trained: Path) -> None:
    script = (
        "import sys, json\nfrom onnxruntime.training.api import CheckpointState\n"
        "s = CheckpointState.load_checkpoint(sys.argv[1])\n"
        "print(json.dumps({n: p.data.tolist() for n, p in s.parameters}))"
    )
    saved = trained / "mlp_1f1b_cut.ckpt"
    theirs = run_ort(script, saved)
    for name, param in CheckpointState.load_checkpoint(saved).parameters:
        np.testing.assert_array_equal(np.asarray(theirs[name], dtype=np.float32), param.data, err_msg=name)


@pytest.mark.distributed
def test_legacy_pipeline_settings_train_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = launched(tmp_path_factory, "legacy")
    reference = worker.legacy_train(pipelined=False)
    for rank in range(2):
        result = dict(np.load(out / f"legacy_rank{rank}.npz"))
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=LOSS_TOLERANCE, atol=0)
        assert sorted(result) == sorted(reference) and any(key.startswith("opt/") for key in reference)
        for key in reference:  # every stage's weights and optimizer state, on every rank
            if key.startswith(("param/", "opt/")):
                np.testing.assert_allclose(result[key], reference[key], rtol=0, atol=PARAM_TOLERANCE, err_msg=key)


@pytest.mark.distributed
def test_bad_settings_raise_on_every_rank_before_the_first_step(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = launched(tmp_path_factory, "misuse")
    expected = {
        "not_an_edge": "'no_such_tensor' is not an edge of the graph",
        "too_many_stages": "pipeline stages=8: expected one rank per stage, the process group has 2 ranks",
        "different_settings": "ranks start from different pipeline settings",
        "micro_batches_not_dividing": "input 0 holds a batch of 8; every input's axis 0 must divide into 3",
    }
    for rank in range(2):
        errors = json.loads((out / f"misuse_rank{rank}.json").read_text())
        for case, message in expected.items():
            assert message in errors.get(case, ""), f"rank {rank} {case}: {errors.get(case)}"


def test_legacy_pipeline_settings_are_checked() -> None:
    from tests.helpers.legacy_models import params_for, session

    with pytest.raises(ValueError, match="num_pipeline_micro_batches = 2 .* need pipeline_parallel_size > 1"):
        session(params_for(num_pipeline_micro_batches=2))
    with pytest.raises(NotImplementedError, match="only a pipeline alone"):
        session(params_for(pipeline_parallel_size=2, world_size=4, data_parallel_size=2))


@pytest.mark.distributed
def test_the_example_under_torchrun_trains_like_one_process(tmp_path: Path) -> None:
    from tests.helpers import distributed_worker
    from tests.integration.test_distributed_launch import assert_same_parameters, json_objects, torchrun

    example = ROOT / "examples" / "train_pipeline.py"
    launched = torchrun(example, MLP, "--schedule", "1f1b", "--out", tmp_path, timeout=scaled(120))
    summaries = sorted(json_objects(launched.stdout), key=lambda summary: summary["rank"])
    assert [s["world_size"] for s in summaries] == [2, 2] and summaries[1]["checkpoint"] is None
    reference = distributed_worker.train("mlp_adamw_sched")  # 1 process, the same batches and schedule
    params = {key.removeprefix("param/"): value for key, value in reference.items() if key.startswith("param/")}
    assert_same_parameters(tmp_path / "checkpoint", params)


@pytest.mark.distributed
def test_fit_through_a_pipeline_trains_like_one_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    out = launched(tmp_path_factory, "fit")
    reference = worker.fit_run(pipelined=False)
    for rank in range(2):  # fit reports the batch's loss on every stage
        result = dict(np.load(out / f"fit_rank{rank}.npz"))
        np.testing.assert_allclose(result["losses"], reference["losses"], rtol=LOSS_TOLERANCE, atol=0)
        for key in (key for key in reference if key.startswith("param/")):
            np.testing.assert_allclose(result[key], reference[key], rtol=0, atol=PARAM_TOLERANCE, err_msg=key)


def cli_arguments(tmp_path: Path, name: str) -> list[object]:
    return [
        "train", MLP / "artifacts", "--data", MLP / "data.npz", "--inputs", "x_train,y_train", "--batched",
        "--steps", 4, "--lr", 0.01, "--json", "--metrics", tmp_path / f"{name}.jsonl", "--output", tmp_path / name,
    ]  # fmt: skip


@pytest.mark.distributed
def test_train_cli_pipeline_stages_train_like_one_process(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    from ort_torch_train.state.training_state import TrainingState
    from tests.integration.test_distributed_launch import assert_same_parameters, torchrun
    from tests.unit.cli.test_cli import run_cli

    code, _, err = run_cli(capsys, *cli_arguments(tmp_path, "one"))
    assert code == 0, err
    pipeline = ["--pipeline-stages", 2, "--micro-batches", 2, "--pipeline-schedule", "1f1b"]
    launched = torchrun("-m", "ort_torch_train", *cli_arguments(tmp_path, "two"), *pipeline)
    assert json.loads(launched.stdout)["last_step"] == 4  # rank 0's summary
    losses = {
        name: [json.loads(line)["loss"] for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        for name in ("one", "two")
    }
    np.testing.assert_allclose(losses["two"], losses["one"], rtol=LOSS_TOLERANCE, atol=0)
    reference = {name: tensor.numpy() for name, tensor in TrainingState.load(tmp_path / "one").state_dict().items()}
    assert_same_parameters(tmp_path / "two", reference)  # the whole state, saved by rank 0


@pytest.mark.parametrize(
    "options, message",
    [
        (["--micro-batches", "2"], "--micro-batches shapes a pipeline: give --pipeline-stages N too"),
        (["--pipeline-stages", "2"], "--pipeline-stages 2 runs one stage per rank: launch 2 processes"),
    ],
)
def test_train_cli_pipeline_options_are_checked(
    capsys: pytest.CaptureFixture, tmp_path: Path, options: list[str], message: str
) -> None:
    from tests.unit.cli.test_cli import run_cli

    code, _, err = run_cli(capsys, *cli_arguments(tmp_path, "run"), *options)
    assert code != 0 and message in err, err
