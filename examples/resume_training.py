"""Stop a training run, save a checkpoint with the optimizer state, resume it: the same curve, bit for bit.

Trains the digits model of ``train_digits.py`` twice from the same initial checkpoint: once without
a break, and once stopped at ``--resume-at``, saved with ``include_optimizer_state=True``, loaded into
a fresh CheckpointState, Module, Optimizer and scheduler (as a new process would) and continued.
Every loss after the resume equals the uninterrupted run's, and so do the final parameters.

What makes a run resumable: the checkpoint keeps the parameters, the AdamW moments, the step
count and the initial learning rate (so the LR schedule continues); the batch order and the dropout
masks here are functions of the step index (seeded per epoch and per step), not of a hidden RNG.

    python examples/resume_training.py [--steps 60] [--resume-at 30] [--out runs/resume]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from train_digits import load_data, make_artifacts, open_training, train_step

from ort_torch_train.api import CheckpointState, LinearLRScheduler


def batch_rows(step: int, samples: int, batch_size: int, seed: int) -> np.ndarray:
    """The rows of the batch at ``step``: epoch-wise shuffles that depend only on (seed, epoch)."""
    per_epoch = samples // batch_size
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(samples)
    return order[position * batch_size : (position + 1) * batch_size]


def run(
    args: argparse.Namespace,
    artifacts: Path,
    checkpoint: Path,
    first: int,
    last: int,
    data: tuple[np.ndarray, np.ndarray],
) -> tuple[CheckpointState, list[float]]:
    """Train steps ``first`` .. ``last - 1`` starting from ``checkpoint``; return the state and the losses."""
    state, module, optimizer = open_training(artifacts, checkpoint, args.device)
    if state.training_state.optimizer.step != first:
        raise RuntimeError(f"{checkpoint} is not at step {first}")
    scheduler = LinearLRScheduler(
        optimizer, warmup_step_count=args.steps // 10, total_step_count=args.steps, initial_lr=args.lr
    )
    images, labels = data
    losses = []
    for step in range(first, last):
        rows = batch_rows(step, len(images), args.batch_size, args.seed)
        torch.manual_seed(args.seed * 100_003 + step)  # this step's dropout masks
        losses.append(train_step(module, optimizer, scheduler, images[rows], labels[rows]))
    return state, losses


def resume_demo(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    artifacts = out / "artifacts"
    images, _, labels, _ = load_data(args.seed)  # the training split
    make_artifacts(artifacts, args.seed)
    data = (images, labels)

    uninterrupted_state, uninterrupted = run(args, artifacts, artifacts / "checkpoint", 0, args.steps, data)

    first_state, first_part = run(args, artifacts, artifacts / "checkpoint", 0, args.resume_at, data)
    saved = out / f"checkpoint_step{args.resume_at}"
    CheckpointState.save_checkpoint(first_state, saved, include_optimizer_state=True)
    del first_state  # what follows sees only the file, as a new process would
    resumed_state, second_part = run(args, artifacts, saved, args.resume_at, args.steps, data)

    print(f"{'step':>5} {'uninterrupted':>15} {'stopped+resumed':>16}")
    for step, (a, b) in enumerate(zip(uninterrupted, first_part + second_part), start=1):
        marker = "  <- resumed from the checkpoint" if step == args.resume_at + 1 else ""
        print(f"{step:>5} {a:>15.9f} {b:>16.9f}{marker}")
    same_losses = uninterrupted[args.resume_at :] == second_part and uninterrupted[: args.resume_at] == first_part
    final_a, final_b = uninterrupted_state.state_dict(), resumed_state.state_dict()
    same_parameters = all(torch.equal(final_a[name], final_b[name]) for name in final_a)
    summary = {
        "steps": args.steps,
        "resumed_at": args.resume_at,
        "checkpoint": str(saved),
        "losses_uninterrupted": uninterrupted,
        "losses_resumed": first_part + second_part,
        "bit_exact_losses": same_losses,
        "bit_exact_parameters": same_parameters,
        "final_loss": uninterrupted[-1],
    }
    print(
        f"losses after the resume equal the uninterrupted run's: {same_losses}; "
        f"final parameters equal: {same_parameters}"
    )
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60, help="steps of the whole run")
    parser.add_argument("--resume-at", type=int, default=None, help="step to stop and resume at (default: half)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--out", default="runs/resume", help="output folder")
    args = parser.parse_args(argv)
    args.resume_at = args.steps // 2 if args.resume_at is None else args.resume_at
    if not 0 < args.resume_at < args.steps:
        parser.error(f"--resume-at must be between 1 and {args.steps - 1}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    summary = resume_demo(args)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
