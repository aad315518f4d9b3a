"""One rank of the pipeline-parallel tests (tests/unit/distributed/test_pipeline.py launches them).

``python -m tests.helpers.pipeline_worker SCENARIOS OUT_DIR`` (scenarios joined by ",", run in turn and marked
done: ``dist_rank_scenarios``) with torchrun's env (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). ``train``: the 2-stage runs of ``RUNS`` with ``Module(pipeline=...)`` on every
rank, each on the full batch (the tied runs' fixture made in OUT_DIR first); ``train4``: the 4-stage one
on 4 ranks; ``fit``: the trainer's ``fit`` through a pipeline; ``legacy``: the legacy session with ``pipeline_parallel_size``; ``misuse``: the
error each rank saw. Each rank writes ``OUT_DIR/<run>_rank<r>.npz`` (losses, final parameters, and for
each run a checkpoint saved at the end, the eval loss after training, the bytes of parameters, gradients and
moments the rank holds, in all and per parameter) or ``OUT_DIR/misuse_rank<r>.json``; ``train`` also writes
what each rank holds once ``LOADED_RUN``'s checkpoint is loaded back (``<run>_loaded_rank<r>.npz``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tests.helpers.dist_rank_scenarios import run_scenarios
from tests.helpers.distributed_worker import CLIP_MODEL, MLP, MLP_OPTIMIZERS, TRANSFORMER, batches, gloo_group
from tests.helpers.sharding_worker import TIED_LM

STEPS = 4
FIT_RUN = "transformer_1f1b"  # the pipeline the ``fit`` scenario trains through
# name -> (fixture, PipelineOptions' arguments); a relative fixture is made in OUT_DIR (``make_tied_lm``: a GPT-2
# whose embedding, read by stage 0, is also the output projection, read by stage 1)
RUNS: dict[str, tuple[Path, dict[str, Any]]] = {
    "mlp_gpipe_clip": (MLP_OPTIMIZERS, {"stages": 2, "micro_batches": 4, "schedule": "gpipe"}),
    "mlp_1f1b_cut": (MLP, {"stages": 2, "micro_batches": 2, "schedule": "1f1b", "cuts": "/1/Relu_output_0"}),
    "transformer_1f1b": (TRANSFORMER, {"stages": 2, "micro_batches": 2, "schedule": "1f1b"}),
    "transformer_1f1b_4": (TRANSFORMER, {"stages": 4, "micro_batches": 4, "schedule": "1f1b"}),
    "transformer_gpipe_cut": (
        TRANSFORMER,
        {"stages": 2, "micro_batches": 4, "schedule": "gpipe", "cuts": "/enc/norm1/LayerNormalization_output_0"},
    ),
    "tied_gpipe_clip": (Path(TIED_LM), {"stages": 2, "micro_batches": 2, "schedule": "gpipe"}),
    "tied_1f1b": (Path(TIED_LM), {"stages": 2, "micro_batches": 2, "schedule": "1f1b"}),
}
OPTIMIZERS = {
    "mlp_gpipe_clip": CLIP_MODEL,
    "tied_gpipe_clip": CLIP_MODEL,
}  # run -> optimizer model other than the fixture's (AdamW clipping the norm)
LOADED_RUN = "tied_1f1b"  # the run whose checkpoint the ``train`` scenario loads back into its pipeline
ACCUMULATED = ("tied_1f1b",)  # runs whose steps accumulate the gradients of two batches (this step's and the next)


def fixture_of(run: str, out: Path) -> Path:
    """``run``'s fixture folder (a relative one is made in ``out`` before the ranks start)."""
    fixture = RUNS[run][0]
    return fixture if fixture.is_absolute() else out / fixture


def train(run: str, pipelined: bool, out: Path, checkpoint_out: Path | None = None) -> dict[str, np.ndarray]:
    """``run`` for STEPS steps on the fixture's full batches, through the pipeline or in one process; then
    an eval step on the first batch. ``local/<name>``: the values this rank holds itself."""
    from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
    from ort_torch_train.distributed.pipeline_plan import PipelineOptions

    fixture, settings = fixture_of(run, out), RUNS[run][1]
    artifacts = fixture / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    pipeline = PipelineOptions(**settings) if pipelined else None
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", pipeline=pipeline)
    optimizer = Optimizer(OPTIMIZERS.get(run, artifacts / "optimizer_model.onnx"), module)
    scheduler = LinearLRScheduler(optimizer, 2, STEPS, 0.01)
    losses = []
    for step in range(STEPS):
        loss = module(*batches(fixture, step))
        if run in ACCUMULATED:
            loss = module(*batches(fixture, step + 1))
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.step()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    held = held_bytes(state.training_state)
    local = {
        f"local/{name}": param.detach().numpy().copy()
        for name, param in state.training_state.params.items()
        if param.device.type != "meta"
    }
    if checkpoint_out is not None:
        CheckpointState.save_checkpoint(state, checkpoint_out, include_optimizer_state=True)
    module.eval()
    eval_loss = module(*batches(fixture, 0))
    return {
        "losses": np.array(losses, dtype=np.float64),
        "eval_loss": np.asarray(eval_loss, dtype=np.float64),
        "param/contiguous": module.get_contiguous_parameters().numpy(),  # whole values, gathered from the stages
        **held,
        **local,
        **{f"param/{n}": p.data.copy() for n, p in state.parameters},
    }


def held_after_loading(run: str, out: Path) -> dict[str, np.ndarray]:
    """The values this rank holds (``local/<name>``) once ``run``'s saved checkpoint is loaded into its pipeline."""
    from ort_torch_train.api import CheckpointState, Module
    from ort_torch_train.distributed.pipeline_plan import PipelineOptions

    state = CheckpointState.load_checkpoint(out / f"{run}.ckpt")
    artifacts = fixture_of(run, out) / "artifacts"
    Module(artifacts / "training_model.onnx", state, pipeline=PipelineOptions(**RUNS[run][1]))
    return {
        f"local/{name}": param.detach().numpy().copy()
        for name, param in state.training_state.params.items()
        if param.device.type != "meta"
    }


def held_bytes(state: Any) -> dict[str, np.ndarray]:
    """The bytes of parameters, gradients and moments the state holds: ``held_bytes`` in all, ``bytes/<name>``
    for each parameter (0 for another stage's)."""
    from ort_torch_train.distributed.pipeline_state import held_bytes as total

    moments = state.optimizer.momentums if state.optimizer is not None else {}
    per_name = {}
    for name, param in state.params.items():
        tensors = [param, *([] if param.grad is None else [param.grad]), *moments.get(name, {}).values()]
        per_name[f"bytes/{name}"] = np.array(
            sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")
        )
    return {"held_bytes": np.array(total(state)), **per_name}


def fit_run(pipelined: bool) -> dict[str, np.ndarray]:
    """The trainer's ``fit`` on the transformer through ``FIT_RUN``'s pipeline (or one process), STEPS
    steps on the full batches: the losses it reports and the final parameters."""
    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.distributed.pipeline_plan import PipelineOptions
    from ort_torch_train.trainer import fit

    fixture, settings = RUNS[FIT_RUN]
    artifacts = fixture / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    pipeline = PipelineOptions(**settings) if pipelined else None
    module = Module(artifacts / "training_model.onnx", state, pipeline=pipeline)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    result = fit(module, optimizer, [tuple(batches(fixture, step)) for step in range(STEPS)], max_steps=STEPS)
    return {
        "losses": np.array(result.losses, dtype=np.float64),
        **{f"param/{n}": p.data.copy() for n, p in state.parameters},
    }


def legacy_train(pipelined: bool, rank: int = 0) -> dict[str, np.ndarray]:
    """The legacy TrainingSession (Adam, 2-run accumulation) on 8 batches of 6 rows, with 2 pipeline
    stages cut at the hidden activation and 2 micro-batches per run, or in one process: the losses, the
    weights and the optimizer state."""
    from tests.helpers.legacy_models import LR, params_for, session

    settings: dict[str, Any] = {"gradient_accumulation_steps": 2}
    if pipelined:
        settings |= {
            "world_rank": rank,
            "world_size": 2,
            "pipeline_parallel_size": 2,
            "num_pipeline_micro_batches": 2,
            "pipeline_cut_info_string": "r",
        }
    sess = session(params_for("AdamOptimizer", **settings))
    rng = np.random.default_rng(3)
    losses = []
    for _ in range(8):
        x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6).astype(np.int64)
        losses.append(float(sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.02], np.float32)})[0]))
    state = sess.get_model_state()["full_precision"]  # gathered from the stages, as the optimizer state
    moments = {
        f"opt/{w}/{key}": np.asarray(v) for w, values in sess.get_optimizer_state().items() for key, v in values.items()
    }
    return {"losses": np.array(losses), **{f"param/{n}": np.asarray(v) for n, v in state.items()}, **moments}


def misuse(rank: int) -> dict[str, str]:
    """The error each bad setting raises on this rank, before any step."""
    from ort_torch_train.api import CheckpointState, Module
    from ort_torch_train.distributed.pipeline_plan import PipelineOptions

    artifacts = MLP / "artifacts"
    cases: dict[str, dict[str, Any]] = {
        "not_an_edge": {"stages": 2, "cuts": "no_such_tensor"},
        "too_many_stages": {"stages": 2 + 6},  # checked against the world size first
        "different_settings": {"stages": 2, "micro_batches": 2 + rank},
    }
    errors = {}
    for case, settings in cases.items():
        try:
            state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
            Module(artifacts / "training_model.onnx", state, pipeline=PipelineOptions(**settings))
        except Exception as error:
            errors[case] = f"{type(error).__name__}: {error}"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, pipeline=PipelineOptions(stages=2, micro_batches=3))
    try:
        module(*batches(MLP, 0))
    except Exception as error:
        errors["micro_batches_not_dividing"] = f"{type(error).__name__}: {error}"
    return errors


def main() -> None:
    scenarios, out = sys.argv[1], Path(sys.argv[2])
    with gloo_group() as (rank, _):

        def run_one(scenario: str) -> None:
            if scenario == "train4":  # 4 ranks
                run = "transformer_1f1b_4"
                np.savez(out / f"{run}_rank{rank}.npz", **train(run, True, out, out / f"{run}.ckpt"))
            elif scenario == "train":
                for run in (run for run, (_, settings) in RUNS.items() if settings["stages"] == 2):
                    checkpoint = out / f"{run}.ckpt"
                    np.savez(out / f"{run}_rank{rank}.npz", **train(run, True, out, checkpoint))
                np.savez(out / f"{LOADED_RUN}_loaded_rank{rank}.npz", **held_after_loading(LOADED_RUN, out))
            elif scenario == "fit":
                np.savez(out / f"fit_rank{rank}.npz", **fit_run(True))
            elif scenario == "legacy":
                np.savez(out / f"legacy_rank{rank}.npz", **legacy_train(True, rank))
            elif scenario == "misuse":
                (out / f"misuse_rank{rank}.json").write_text(json.dumps(misuse(rank)))
            else:
                raise ValueError(f"unknown scenario {scenario!r}")

        run_scenarios(scenarios.split(","), out, rank, run_one)


if __name__ == "__main__":
    main()
