"""The end of ``ort-torch-train train``: the run's summary (``--json``), its text report and why it ended."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from ort_torch_train.api import Optimizer
from ort_torch_train.cli.distributed import Launch
from ort_torch_train.trainer import EarlyStopping, FitResult
from ort_torch_train.trainer.loggers import as_written


def best_path(output: Path) -> Path:
    """Where --save-best saves: ``OUTPUT.best``."""
    return output.with_name(output.name + ".best")


def summarize(
    args: argparse.Namespace,
    result: FitResult,
    device: str,
    launch: Launch,
    eval_before: float | None,
    optimizer: Optimizer,
    eval_samples: int | None,
) -> dict[str, Any]:
    """The run's summary (printed as JSON with --json)."""
    losses = result.losses
    summary: dict[str, Any] = {
        "first_step": result.start_step + 1,
        "last_step": result.last_step,
        "device": device,
        "world_size": launch.world_size,
        "loss_first": as_written(losses[0]) if losses else None,
        "loss_last": as_written(losses[-1]) if losses else None,
        "steps_per_s": None if math.isnan(result.steps_per_second) else result.steps_per_second,
        "steps_per_s_overall": None if math.isnan(result.wall_steps_per_second) else result.wall_steps_per_second,
        "train_seconds": result.seconds,
        "compile_seconds": result.first_step_seconds if args.compile else None,
        "skipped_steps": optimizer.skipped_steps,
        "eval_loss_before": eval_before,
        "eval_loss": result.metrics.get("loss"),
        "eval_metrics": result.metrics or None,
        "eval_samples": eval_samples,
        "interrupted": result.interrupted,
        "stopped": result.stop_reason,
        "checkpoint": str(args.output),
        "best_checkpoint": str(best_path(Path(args.output))) if args.save_best else None,
    }
    return summary


def report(say: Any, summary: dict[str, Any], result: FitResult) -> None:
    """The text summary."""
    device = summary["device"]
    if result.losses:
        compiling = f" after {summary['compile_seconds']:.1f} s compiling" if summary["compile_seconds"] else ""
        ended = " (interrupted)" if result.interrupted else ""
        say(
            f"trained steps {summary['first_step']}-{summary['last_step']}{ended} on {device}{compiling}: "
            f"{rate_text(result)}: loss {result.losses[0]:.4g} -> {result.losses[-1]:.4g}"
        )
    say(summary["end"])
    if result.metrics:
        before = summary["eval_loss_before"]
        samples = summary["eval_samples"]
        say(f"eval loss {result.metrics['loss']:.4g} on {samples} samples (before training: {before:.4g})")
        for name, value in result.metrics.items():
            if name != "loss":
                say(f"eval {name} {value:.4g}")
    say(f"checkpoint with optimizer state: {summary['checkpoint']} (continue with --resume {summary['checkpoint']})")
    if summary["best_checkpoint"]:
        say(f"best checkpoint: {summary['best_checkpoint']}")


def rate_text(result: FitResult) -> str:
    """The run's step rates, each labelled: the bar's (everything) and the steps' alone."""
    if len(result.losses) < 2:
        return "one step, no rate"
    return (
        f"{result.wall_steps_per_second:.4g} step/s (the bar's rate, evaluation and saving included; "
        f"{result.steps_per_second:.4g} step/s in the training steps alone)"
    )


def end_of_run(
    args: argparse.Namespace, result: FitResult, max_steps: int, early: EarlyStopping | None
) -> tuple[str, str]:
    """Why the run ended, as a key (interrupted, early_stop, nothing_to_train, length) and a line."""
    if result.interrupted:
        return "interrupted", (
            f"ended by Ctrl-C after step {result.last_step}: checkpoint saved, `--resume {args.output}` continues "
            "the run exactly"
        )
    if result.stop_reason:
        held = f"already at step {result.last_step}: nothing to train; " if not result.losses else ""
        return "early_stop", held + result.stop_reason
    if not result.losses:
        return "nothing_to_train", f"already at step {result.last_step}: nothing to train (--max-steps {max_steps})"
    if args.max_steps is not None:
        length = f"--max-steps {args.max_steps}"
    elif args.steps is not None:
        length = f"--steps {args.steps}"
    else:
        length = f"--epochs {args.epochs}"
    end = f"ended at step {result.last_step}: {length} reached"
    if early is not None and early.reason is not None:  # the patience ran out at the last step
        end += (
            f"; {early.reason} (a resumed run with a larger --max-steps trains on, counting the evaluations "
            "without improvement afresh)"
        )
    return "length", end
