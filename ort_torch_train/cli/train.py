"""``ort-torch-train train``: train ORT artifacts on arrays from an .npz file, save a resumable checkpoint."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

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
    set_threads,
)
from ort_torch_train.cli.common import CliError, existing_file, find_artifacts, load_onnx, load_training_state
from ort_torch_train.cli.data import (
    Batches,
    check_arrays,
    check_batch_size,
    input_specs,
    load_npz,
    select_arrays,
    split_keys,
)
from ort_torch_train.cli.distributed import Launch, launch_from_environment
from ort_torch_train.cli.train_loop import MetricsSink, run_loop
from ort_torch_train.graph.layout import eval_layout, training_layout

DESCRIPTION = """\
Train a set of ORT training artifacts (training_model.onnx, optimizer_model.onnx, checkpoint;
eval_model.onnx for --eval-data) with ORT's loop: module(*batch), optimizer.step(),
scheduler.step(), module.lazy_reset_grad(). Shows a progress bar (loss, learning rate, step rate,
ETA) and saves an ORT checkpoint with the optimizer state, from which --resume continues: at the
end, every --save-every steps, and on Ctrl-C (which then exits with status 130). Step rates
exclude compilation (--compile), reported on its own."""

DATA_HELP = """\
data layout:
  DATA.npz holds one array per user input of the training model (see `inspect`), matched by name
  (e.g. `input` and `labels`), or named in the model's input order with --inputs KEY1,KEY2.
  Axis 0 indexes samples: each step feeds --batch-size rows (shuffled each epoch unless
  --no-shuffle; a last partial batch is dropped). With --batched, axis 0 indexes ready-made
  batches instead ([steps, batch, ...], step i feeds x[i]). Dtypes must equal the model's
  (float32 and int64, typically); shapes must fit its declared dims.
  --eval-data works the same way against the eval model's inputs (--eval-inputs, default --inputs),
  always [samples, ...], evaluated in chunks of --batch-size.

learning rate:
  --lr (default: the checkpoint's initial learning rate, 0.001 for fresh artifacts) with
  --schedule constant|linear|cosine and --warmup steps; linear and cosine decay to 0 at
  --total-steps (default: the step count this run ends at). Schedules count the optimizer's steps,
  which the checkpoint keeps: on --resume, pass the first run's --total-steps to continue its
  schedule; batches continue in the same order (same --seed)."""

EXAMPLES = """\
examples:
  ort-torch-train train artifacts/ --data train.npz --epochs 3 --batch-size 32 --output run/ckpt
  ort-torch-train train artifacts/ --data train.npz --inputs x,y --steps 500 --lr 3e-3 \\
      --schedule linear --warmup 50 --eval-data test.npz --output run/ckpt
  ort-torch-train train artifacts/ --data train.npz --steps 500 --resume run/ckpt --output run/ckpt2
  torchrun --nproc_per_node=2 -m ort_torch_train train artifacts/ --data train.npz --batch-size 64 \\
      --steps 500 --shard-state --output run/ckpt      (data-parallel: each rank feeds 32 of the 64 rows)
  ort-torch-train train refcorpus/cnn/artifacts --data refcorpus/cnn/data.npz --inputs x_train,y_train \\
      --batched --steps 20 --eval-data refcorpus/cnn/data.npz --eval-inputs x_eval,y_eval"""


@dataclass
class TrainingJob:
    """What a ``train`` run works on, checked before any model is converted."""

    state: CheckpointState
    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto | None
    optimizer_model: Path
    batches: Batches
    evaluation: dict[str, np.ndarray] | None
    batch_size: int


def run_train(args: argparse.Namespace) -> None:
    """Train, report (text or --json), save the checkpoint with its optimizer state; under torchrun
    data-parallel, with rank 0 reporting and saving (``cli/distributed.py``)."""
    if args.shard_state and int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        raise CliError(
            "--shard-state shards the optimizer state across ranks: launch 2 or more processes with "
            "`torchrun --nproc_per_node=N -m ort_torch_train train ...`"
        )
    launch, device = launch_from_environment(args.device)
    try:
        train(args, launch, device)
    except BaseException:
        launch.close(finished=False)
        raise
    launch.close(finished=True)


def train(args: argparse.Namespace, launch: Launch, device: str) -> None:
    """``run_train`` on this rank."""
    set_threads(args.threads)
    job = prepare(args)
    module = Module(
        job.training_model,
        job.state,
        job.eval_model,
        device=device,
        compile=args.compile,
        distributed=launch.distributed,
    )
    optimizer = Optimizer(job.optimizer_model, module, shard_state=args.shard_state)
    optimizer_state = job.state.training_state.optimizer
    assert optimizer_state is not None, "the Optimizer gives the state its optimizer state"
    start = optimizer_state.step
    steps = args.steps or args.epochs * job.batches.steps_per_epoch
    lr = args.lr if args.lr is not None else optimizer_state.initial_learning_rate
    scheduler = make_scheduler(optimizer, args.schedule, args.warmup, args.total_steps or start + steps, lr)
    eval_before = evaluate(module, job.evaluation, job.batch_size) if job.evaluation else None
    say = (lambda text: None) if args.json or args.quiet or not launch.is_main else print
    if args.resume:
        say(f"resumed from {args.resume} at step {start}")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)

    def save(step: int) -> None:
        CheckpointState.save_checkpoint(job.state, output, include_optimizer_state=True)
        say(f"step {step}: checkpoint saved to {output}")

    def one_step(step: int) -> tuple[float, float]:
        loss = loss_value(module.step(optimizer, *launch.rows(job.batches[step])))  # module(...), step, reset
        loss = launch.mean(loss)
        scheduler.step()
        return loss, optimizer.get_learning_rate()

    torch.manual_seed(args.seed + start)
    module.train()
    sink = (
        MetricsSink(args.metrics, args.tensorboard, args.metrics_every)
        if launch.is_main
        else MetricsSink(None, None, args.metrics_every)
    )
    where = f"training on {device}" + (f" x {launch.world_size} ranks" if launch.distributed else "")
    try:
        result = run_loop(
            one_step,
            range(start, start + steps),
            save,
            sink,
            args.save_every,
            bool(args.compile),
            args.quiet or not launch.is_main,
            where,
        )
        eval_after = evaluate(module, job.evaluation, job.batch_size) if job.evaluation else None
        if eval_after is not None:
            sink.record(start + steps, eval_loss=eval_after)
    finally:
        sink.close()
    CheckpointState.save_checkpoint(job.state, output, include_optimizer_state=True)
    summary = {
        "first_step": start + 1,
        "last_step": start + steps,
        "device": device,
        "world_size": launch.world_size,
        "loss_first": result.losses[0],
        "loss_last": result.losses[-1],
        "steps_per_s": None if math.isnan(result.steps_per_second) else result.steps_per_second,
        "train_seconds": result.seconds,
        "compile_seconds": result.compile_seconds,
        "eval_loss_before": eval_before,
        "eval_loss": eval_after,
        "checkpoint": str(output),
    }
    if args.json:
        if launch.is_main:
            print(json.dumps(summary, indent=2))
        return
    compiling = f" after {result.compile_seconds:.1f} s compiling" if result.compile_seconds is not None else ""
    say(
        f"trained steps {start + 1}-{start + steps} on {device}: {result.steps_per_second:.1f} step/s{compiling}: "
        f"loss {result.losses[0]:.4g} -> {result.losses[-1]:.4g}"
    )
    if job.evaluation:
        samples = len(next(iter(job.evaluation.values())))
        say(f"eval loss {eval_after:.4g} on {samples} samples (before training: {eval_before:.4g})")
    say(f"checkpoint with optimizer state: {output} (continue with --resume {output})")


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
    train_specs = input_specs(training_model, list(training_layout(training_model, param_names).user_inputs))
    batch_size = args.batch_size or 32
    if not args.batched:
        check_batch_size(train_specs, batch_size)
    arrays = select_arrays(load_npz(args.data), train_specs, split_keys(args.inputs), repr(args.data), "--inputs")
    check_arrays(arrays, train_specs, repr(args.data), batched=args.batched)
    batches = Batches(arrays, batch_size, args.batched, shuffle=not args.no_shuffle, seed=args.seed)
    evaluation = None
    if args.eval_data and eval_model is not None:  # checked above: eval data comes with an eval model
        eval_specs = input_specs(eval_model, list(eval_layout(eval_model, param_names).user_inputs))
        keys = split_keys(args.eval_inputs or args.inputs)
        evaluation = select_arrays(load_npz(args.eval_data), eval_specs, keys, repr(args.eval_data), "--eval-inputs")
        check_arrays(evaluation, eval_specs, repr(args.eval_data))
    return TrainingJob(state, training_model, eval_model, optimizer_model, batches, evaluation, batch_size)


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


def loss_value(outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> float:
    """The loss (first output) of a step's outputs, as a float (the mean of an unreduced loss)."""
    loss = outputs[0] if isinstance(outputs, tuple) else outputs
    return float(loss.float().mean())


def evaluate(module: Module, arrays: dict, batch_size: int) -> float:
    """Mean eval loss over all samples, in chunks of ``batch_size``."""
    module.eval()
    tensors = [torch.from_numpy(array) for array in arrays.values()]
    count = tensors[0].shape[0]
    total = 0.0
    for begin in range(0, count, batch_size):
        chunk = [tensor[begin : begin + batch_size] for tensor in tensors]
        total += loss_value(module(*chunk)) * chunk[0].shape[0]
    module.train()
    return total / count


def add_train_parser(
    commands: argparse._SubParsersAction,
    formatter: type[argparse.HelpFormatter],
    positive_int: Callable[[str], int],
    non_negative_int: Callable[[str], int],
    learning_rate: Callable[[str], float],
) -> None:
    """Register ``train`` and its options."""
    parser = commands.add_parser(
        "train",
        help="train the artifacts on arrays from an .npz file and save a resumable checkpoint",
        description=DESCRIPTION,
        epilog=DATA_HELP + "\n\n" + EXAMPLES,
        formatter_class=formatter,
    )
    parser.add_argument("artifacts", metavar="ARTIFACTS_DIR", help="folder holding the artifacts")
    parser.add_argument("--data", required=True, metavar="DATA.npz", help="training arrays (see data layout)")
    parser.add_argument("--inputs", metavar="KEY1,KEY2", help="array names for the model's inputs, in its input order")
    parser.add_argument("--batched", action="store_true", help="the training arrays are [steps, batch, ...]")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--steps", type=positive_int, metavar="N", help="number of optimizer steps to run")
    length.add_argument("--epochs", type=positive_int, metavar="N", help="number of passes over the training data")
    parser.add_argument(
        "--batch-size", type=positive_int, metavar="N", help="rows per step (default 32; ignored with --batched)"
    )
    parser.add_argument(
        "--lr", type=learning_rate, metavar="LR", help="peak learning rate (default: the checkpoint's initial one)"
    )
    parser.add_argument(
        "--schedule",
        choices=("constant", "linear", "cosine"),
        default="constant",
        help="learning-rate schedule after warmup (default constant)",
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=0, metavar="N", help="linear warmup steps (default 0)"
    )
    parser.add_argument("--total-steps", type=positive_int, metavar="N", help="step at which linear/cosine reach 0")
    parser.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument(
        "--threads",
        type=lambda text: text if text == "auto" else positive_int(text),
        default="auto",
        metavar="N|auto",
        help="CPU threads per step: N, or auto (default): the cores other processes leave free",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="run each step (forward, backward, update) as one torch.compile'd graph "
        "(compiling takes seconds first; faster steps after)",
    )
    parser.add_argument(
        "--shard-state",
        action="store_true",
        help="under torchrun: each rank keeps 1/N of the optimizer state (ZeRO stage 1)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the shuffling and of dropout (default 0)"
    )
    parser.add_argument("--no-shuffle", action="store_true", help="keep the data's order")
    parser.add_argument("--eval-data", metavar="EVAL.npz", help="print the eval loss on these arrays at the end")
    parser.add_argument("--eval-inputs", metavar="KEY1,KEY2", help="array names for the eval model's inputs")
    parser.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="continue from this checkpoint (parameters, "
        "optimizer state and step count) instead of ARTIFACTS_DIR/checkpoint",
    )
    parser.add_argument(
        "--output",
        default="trained_checkpoint",
        metavar="CHECKPOINT",
        help="where to save the checkpoint (default ./trained_checkpoint; replaced atomically)",
    )
    parser.add_argument(
        "--save-every",
        type=positive_int,
        metavar="N",
        help="also save the checkpoint to --output every N steps (Ctrl-C always saves)",
    )
    parser.add_argument(
        "--metrics",
        metavar="FILE.jsonl",
        help="append one JSON line per --metrics-every steps (step, loss, lr, steps_per_s), "
        "then the eval loss and compile time",
    )
    parser.add_argument(
        "--metrics-every",
        type=positive_int,
        default=1,
        metavar="N",
        help="steps between metrics lines (default 1; the last step is always written)",
    )
    parser.add_argument(
        "--tensorboard", metavar="DIR", help="write TensorBoard scalars to DIR (needs the tensorboard package)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout instead of text")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no text summary")
    parser.set_defaults(run=run_train)
