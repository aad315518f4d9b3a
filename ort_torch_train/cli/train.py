"""``ort-torch-train train``: train ORT artifacts on a data file with ``trainer.fit``, save a resumable checkpoint.

The options are defined in ``cli/train_options.py``; this module turns them into a Module, an
Optimizer, a scheduler, data loaders and fit's callbacks, and reports the run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from ort_torch_train.api import (
    CheckpointState,
    ConstantWithWarmupLRScheduler,
    CosineLRScheduler,
    LinearLRScheduler,
    Module,
    Optimizer,
    Properties,
)
from ort_torch_train.cli.common import (
    CliError,
    existing_file,
    find_artifacts,
    load_onnx,
    load_training_state,
    trainable_names_of,
)
from ort_torch_train.cli.config import save_options
from ort_torch_train.cli.data import check_arrays, check_batch_size, input_specs, load_data, select_arrays
from ort_torch_train.cli.distributed import Launch, launch_from_environment, pipeline_setting
from ort_torch_train.cli.export import lora_setting
from ort_torch_train.cli.train_checks import check_total_steps, check_writable_output
from ort_torch_train.cli.train_options import run_threads
from ort_torch_train.cli.train_report import best_path, end_of_run, report, summarize
from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.graph.layout import eval_layout, training_layout
from ort_torch_train.progress import Phase, phases_shown, status_line
from ort_torch_train.trainer import (
    ArrayDataset,
    Callback,
    EarlyStopping,
    JsonlLogger,
    Logger,
    LogMetrics,
    MlflowLogger,
    SaveBest,
    SaveCheckpoints,
    TensorBoardLogger,
    array_loader,
    evaluate,
    fit,
    metric_named,
    with_model_outputs,
)
from ort_torch_train.trainer.data import data_position, keep_batch
from ort_torch_train.trainer.metrics import BUILT_IN
from ort_torch_train.training.threads import process_threads

NEEDS_MODEL_OUTPUTS = ("loss", "perplexity")  # metrics that need only the loss
CHECKING = "reading the artifacts and the data and checking them against the models"
log = logging.getLogger(__name__)


@dataclass
class TrainingJob:
    """What a ``train`` run works on, checked before any model is converted."""

    state: CheckpointState
    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto | None
    optimizer_model: Path
    train_arrays: list[np.ndarray]
    evaluation: list[np.ndarray] | None
    batch_size: int
    seed: int


def run_train(args: argparse.Namespace) -> None:
    """Train, report (text or --json), save the checkpoint with its optimizer state; under torchrun
    data-parallel, with rank 0 reporting and saving (``cli/distributed.py``)."""
    if args.shard_state and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        raise CliError(
            "--shard-state shards the optimizer state across ranks: launch 2 or more processes with "
            "`torchrun --nproc_per_node=N -m ort_torch_train train ...`"
        )
    if args.sharding and (int(os.environ.get("WORLD_SIZE", "1")) <= 1 or args.shard_state):
        raise CliError(
            f"--sharding {args.sharding} shards across ranks: launch 2 or more processes with "
            "`torchrun --nproc_per_node=N -m ort_torch_train train ...`, without --shard-state (implied)"
        )
    if args.adasum and (int(os.environ.get("WORLD_SIZE", "1")) <= 1 or args.compile):
        raise CliError(
            "--adasum combines the ranks' gradients in eager steps: launch 2, 4, 8... processes with "
            "`torchrun --nproc_per_node=N -m ort_torch_train train ...`, without --compile"
        )
    check_option_combinations(args)
    launch, device = launch_from_environment(args.device)
    try:
        train(args, launch, device)
    except BaseException:
        launch.close(finished=False)
        raise
    launch.close(finished=True)


def check_option_combinations(args: argparse.Namespace) -> None:
    """Refuse options that need another one."""
    for option, value in (("--eval-every", args.eval_every), ("--save-best", args.save_best)):
        if value and not args.eval_data:
            raise CliError(f"{option} evaluates: give the eval data with --eval-data")
    if args.early_stop and not args.eval_data:
        raise CliError("--early-stop watches an eval metric: give the eval data with --eval-data")
    if args.keep_last and not args.save_every:
        raise CliError("--keep-last keeps the newest periodic checkpoints: give --save-every N")
    known = {"loss", args.metric}
    if args.save_best and args.save_best not in known and metric_name(args.save_best) not in known:
        raise CliError(f"--save-best {args.save_best!r}: expected an evaluated metric ({', '.join(sorted(known))})")


def metric_name(text: str) -> str:
    """The name a --metric is reported under: the function's name for package.module:function."""
    return text.rpartition(":")[2]


def train(args: argparse.Namespace, launch: Launch, device: str) -> None:
    """``run_train`` on this rank."""
    process_threads().choose(*run_threads(args.threads, args.deterministic))
    check_writable_output(Path(args.output))
    shown = launch.is_main and not (args.quiet or args.json)
    with phases_shown(shown and sys.stderr.isatty()):  # to a person watching; a user error's log stays one line
        with Phase(log, CHECKING, done="read the artifacts and the data and checked them against the models"):
            with phases_shown(False):  # the checkpoint read within it only logs
                job = prepare(args)
    if launch.is_main:
        save_options(args)  # OUTPUT.options.json: --resume OUTPUT reads them back
    metric_named(args.metric)  # a --metric that does not name one fails before any graph is converted
    with phases_shown(shown):  # conversion, passes, compilation
        train_job(args, launch, device, job)


def train_job(args: argparse.Namespace, launch: Launch, device: str, job: TrainingJob) -> None:
    """Train ``job`` (its inputs checked) on this rank, then report and save."""
    pipeline = pipeline_setting(args, launch)  # its stages are the ranks: each reads the whole batch
    module = Module(
        job.training_model,
        job.state,
        job.eval_model,
        device=device,
        compile=args.compile,
        distributed=launch.distributed and pipeline is None,
        pipeline=pipeline,
        mixed_precision=args.mixed_precision,
        recompute=args.recompute,
        lora=lora_setting(args.lora, job.state.training_state, job.training_model),
        compile_cache=False if args.no_compile_cache else args.compile_cache,
        gradient_combination="adasum" if args.adasum else "average",
        sharding=args.sharding,
    )
    optimizer = Optimizer(job.optimizer_model, module, shard_state=args.shard_state)
    optimizer_state = job.state.training_state.optimizer
    assert optimizer_state is not None, "the Optimizer gives the state its optimizer state"
    start = optimizer_state.step
    loader = array_loader(
        job.train_arrays,
        job.batch_size,
        batched=args.batched,
        shuffle=not args.no_shuffle,
        seed=job.seed,
        workers=args.workers,
        rank=0 if pipeline else launch.rank,
        world_size=1 if pipeline else launch.world_size,
    )
    max_steps = target_step(args, start, len(loader))
    check_total_steps(args.total_steps, max_steps)
    lr = args.lr if args.lr is not None else optimizer_state.initial_learning_rate
    total = args.total_steps or max(max_steps, 1)
    scheduler = make_scheduler(optimizer, args.schedule, args.warmup, total, lr) if start < max_steps else None
    eval_batches = chunks(job.evaluation, job.batch_size) if job.evaluation is not None else None
    metrics = ["loss"] + ([args.metric] if args.metric != "loss" else [])
    checked = [metric_named(text) for text in metrics if text in BUILT_IN]  # one that does not fit fails now
    eval_before = evaluate(module, eval_batches, checked)["loss"] if eval_batches else None
    say = (lambda text: None) if args.json or args.quiet or not launch.is_main else status_line
    if args.resume:
        say(f"resumed from {args.resume} at step {start}")
    if args.steps and args.resume:
        say(f"--steps {args.steps} trains steps {start + 1}-{start + args.steps} (--max-steps N sets the total)")
    if args.grad_accum > 1:
        how = (
            "averaged"
            if args.grad_accum_mode == "mean"
            else "summed (ORT's semantics; --grad-accum-mode mean averages)"
        )
        say(f"gradient accumulation: {args.grad_accum} micro-batches per step, gradients {how}")
    callbacks = make_callbacks(args, launch, say)
    torch.manual_seed((job.seed + start) % 2**63)
    module.train()
    where = f"training on {device}" + (f" x {launch.world_size} ranks" if launch.distributed else "")
    result = fit(
        module,
        optimizer,
        loader,
        max_steps=max_steps,
        grad_accum=args.grad_accum,
        grad_accum_reduction=args.grad_accum_mode,
        scheduler=scheduler,
        eval_data=eval_batches,
        eval_every=args.eval_every,
        metrics=[metric_named(text) for text in metrics],
        callbacks=callbacks,
        progress=False if args.quiet or not launch.is_main else where,
    )
    samples = len(job.evaluation[0]) if job.evaluation is not None else None
    early = next((callback for callback in callbacks if isinstance(callback, EarlyStopping)), None)
    summary = summarize(args, result, device, launch, eval_before, optimizer, samples)
    summary["ended"], summary["end"] = end_of_run(args, result, max_steps, early)
    if launch.is_main and args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.summary, (json.dumps(summary, indent=2) + "\n").encode())
    if launch.is_main and args.json:
        print(json.dumps(summary, indent=2))
    elif launch.is_main:
        report(say, summary, result)
    if result.interrupted:
        raise KeyboardInterrupt


def target_step(args: argparse.Namespace, start: int, batches_per_epoch: int) -> int:
    """The optimizer step count the run ends at: --max-steps, or the start plus --steps or --epochs' steps."""
    if args.max_steps is not None:
        return int(args.max_steps)
    if args.steps is not None:
        return start + int(args.steps)
    return start + max(args.epochs * batches_per_epoch // args.grad_accum, 1)


def chunks(arrays: list[np.ndarray], batch_size: int) -> list[list[torch.Tensor]]:
    """Eval batches: the arrays in chunks of ``batch_size`` rows, the last one partial."""
    tensors = ArrayDataset(arrays).tensors
    count = tensors[0].shape[0]
    return [
        keep_batch([tensor[begin : begin + batch_size] for tensor in tensors]) for begin in range(0, count, batch_size)
    ]


def make_callbacks(args: argparse.Namespace, launch: Launch, say: Any) -> list[Callback]:
    """Checkpoints (every rank: saves are collective), best checkpoint, early stopping, and rank 0's loggers."""
    output = Path(args.output)
    callbacks: list[Callback] = []
    if launch.is_main:
        loggers: list[Logger] = []
        if args.metrics:
            loggers.append(JsonlLogger(args.metrics))
        if args.tensorboard:
            loggers.append(TensorBoardLogger(args.tensorboard))
        if args.mlflow:
            parameters = {k: v for k, v in vars(args).items() if k != "run" and v is not None}
            loggers.append(MlflowLogger(args.mlflow, args.mlflow_experiment, output.name, parameters))
        if loggers:
            callbacks.append(LogMetrics(loggers, args.metrics_every, first_step_compiles=bool(args.compile)))
    callbacks.append(SaveCheckpoints(output, args.save_every, args.keep_last, report=say))
    if args.save_best:
        callbacks.append(SaveBest(best_path(output), metric_name(args.save_best), report=say))
    if args.early_stop:
        more = bool(args.steps or args.epochs)  # counted from the checkpoint: a resumed run asks for more steps
        metric = metric_name(args.save_best or args.metric)
        callbacks.append(EarlyStopping(metric, args.early_stop, train_on=more, report=say))
    return callbacks


def prepare(args: argparse.Namespace) -> TrainingJob:
    """Find the artifacts, load the checkpoint and the data, and check the data against the models."""
    source = args.artifacts
    paths = find_artifacts(source)
    training_model = load_onnx(paths.require("training_model", source), "training model")
    optimizer_model = paths.require("optimizer_model", source)
    if args.resume:
        checkpoint = existing_file(args.resume, "checkpoint to resume")
    else:
        checkpoint = paths.require("checkpoint", source)
    if args.eval_data and paths.eval_model is None:
        raise CliError(f"--eval-data needs the eval model, but {source!r} holds no eval_model.onnx")
    eval_model = load_onnx(paths.eval_model, "eval model") if paths.eval_model else None
    state = CheckpointState(load_training_state(checkpoint))
    if state.training_state.is_nominal:
        raise CliError(f"{str(checkpoint)!r} is a nominal checkpoint (no parameter values): train from a complete one")

    param_names = list(state.training_state.params)
    missing = [name for name in trainable_names_of(training_model) if name not in state.training_state.params]
    if missing:
        raise CliError(
            f"{str(checkpoint)!r} is not a checkpoint of these artifacts: the training model trains "
            f"{missing[0]!r}, which it does not hold (it holds {', '.join(param_names[:4]) or 'nothing'}"
            f"{', ...' if len(param_names) > 4 else ''})"
        )
    train_specs = input_specs(training_model, list(training_layout(training_model, param_names).user_inputs))
    batch_size = args.batch_size or 32
    if not args.batched:
        check_batch_size(train_specs, batch_size)
    loaded, table = load_data(args.data)
    if table and args.batched:
        raise CliError("--batched reads [steps, batch, ...] arrays from an .npz file; a table holds one row per sample")
    arrays = select_arrays(loaded, train_specs, args.inputs, repr(args.data), "--inputs", table)
    units = check_arrays(arrays, train_specs, repr(args.data), batched=args.batched)
    if units < (1 if args.batched else batch_size):
        what = "no batches" if args.batched else f"{units} samples, fewer than the batch size {batch_size}"
        raise CliError(f"the training data holds {what}")
    evaluation = None
    if args.eval_data and eval_model is not None:  # checked above: eval data comes with an eval model
        if args.metric not in NEEDS_MODEL_OUTPUTS:
            eval_model = with_model_outputs(eval_model, param_names)
        eval_specs = input_specs(eval_model, list(eval_layout(eval_model, param_names).user_inputs))
        loaded, table = load_data(args.eval_data)
        keys = args.eval_inputs or args.inputs
        selected = select_arrays(loaded, eval_specs, keys, repr(args.eval_data), "--eval-inputs", table)
        if check_arrays(selected, eval_specs, repr(args.eval_data)) == 0:
            raise CliError(f"--eval-data {str(args.eval_data)!r} holds no samples")
        evaluation = list(selected.values())
    seed = args.seed
    stored = data_position(Properties(state.training_state))
    if seed is None:
        seed = int(stored.seed) if args.resume and stored is not None and stored.seed is not None else 0
    return TrainingJob(
        state, training_model, eval_model, optimizer_model, list(arrays.values()), evaluation, batch_size, seed
    )


def make_scheduler(
    optimizer: Optimizer, schedule: str, warmup: int, total: int, lr: float
) -> LinearLRScheduler | CosineLRScheduler | ConstantWithWarmupLRScheduler:
    """The ORT scheduler for ``schedule``; it sets the checkpointed initial learning rate to ``lr``."""
    if warmup > total:
        raise CliError(f"--warmup {warmup} exceeds the schedule's {total} total steps")
    if schedule == "linear":
        return LinearLRScheduler(optimizer, warmup, total, lr)
    if schedule == "cosine":
        return CosineLRScheduler(optimizer, warmup, total, lr)
    return ConstantWithWarmupLRScheduler(optimizer, warmup, lr)
