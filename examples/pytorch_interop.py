"""ORT training artifacts inside an ordinary PyTorch workflow.

The digits model of ``train_digits.py`` is trained through ``ort_torch_train.api.Module`` with
PyTorch's own tools around it:

- a ``torch.utils.data.DataLoader`` feeds torch tensors in, and torch tensors come out;
- ``torch.compile`` runs the converted graphs (``Module(..., compile=True)``; ``--no-compile`` to skip);
- the learning rate follows ``torch.optim.lr_scheduler.OneCycleLR`` through ``Optimizer.torch_optimizer``;
- the last ``--autocast-steps`` steps run under ``torch.autocast`` (bfloat16), checked to stay finite
  and close to the float32 loss of the same batch and parameters;
- ``module.state_dict()`` loads into the original ``torch.nn.Module`` (same parameter names), whose
  outputs then match the eval graph's.

    python examples/pytorch_interop.py [--steps 40] [--no-compile] [--out runs/interop]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset
from train_digits import load_data, make_artifacts

from ort_torch_train.api import CheckpointState, Module, Optimizer


def batches(images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int):
    """Endless shuffled batches of torch tensors from a DataLoader."""
    dataset = TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
    loader = DataLoader(
        dataset, batch_size=batch_size, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed)
    )
    while True:
        yield from loader


def eval_losses(module: Module, images: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """Eval-graph loss of one batch in float32 and under autocast to ``dtype``."""
    module.eval()
    float32_loss, _ = module(images, labels)
    with torch.autocast(module.device.type, dtype=dtype):
        autocast_loss, _ = module(images, labels)
    module.train()
    return float(float32_loss), float(autocast_loss)


def interop_demo(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    artifacts = out / "artifacts"
    x_train, x_test, y_train, y_test = load_data(args.seed)
    torch_model = make_artifacts(artifacts, args.seed)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(
        artifacts / "training_model.onnx",
        state,
        artifacts / "eval_model.onnx",
        device=str(device),
        compile=args.compile,
    )
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer.torch_optimizer, max_lr=args.lr, total_steps=args.steps, cycle_momentum=False
    )
    autocast_dtype = torch.bfloat16
    losses, learning_rates, autocast_checks = [], [], []
    module.train()
    for step, (images, labels) in zip(range(args.steps), batches(x_train, y_train, args.batch_size, args.seed)):
        under_autocast = step >= args.steps - args.autocast_steps
        if under_autocast:
            autocast_checks.append(eval_losses(module, images, labels, autocast_dtype))
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=under_autocast):
            loss, logits = module(images, labels)  # torch tensors in, torch tensors out (on the module's device)
        assert isinstance(loss, torch.Tensor) and logits.device == module.device
        learning_rates.append(optimizer.get_learning_rate())
        optimizer.step()  # applies optimizer.torch_optimizer.param_groups[0]["lr"]
        scheduler.step()
        module.lazy_reset_grad()
        losses.append(float(loss))
    if not all(math.isfinite(loss) for loss in losses):
        raise RuntimeError(f"non-finite training loss: {losses}")
    autocast_gap = max((abs(a - f) / abs(f) for f, a in autocast_checks), default=0.0)

    names_match, max_output_difference = compare_with_torch_model(module, torch_model, x_test, y_test)
    summary = {
        "device": str(device),
        "compiled": bool(args.compile),
        "steps": args.steps,
        "first_loss": losses[0],
        "final_loss": losses[-1],
        "learning_rates": learning_rates,
        "scheduler_lr_matches": all(
            math.isclose(lr, float(np.float32(expected)), rel_tol=1e-6)
            for lr, expected in zip(learning_rates[1:], scheduler_lrs(args))
        ),
        "autocast_dtype": str(autocast_dtype).removeprefix("torch."),
        "autocast_steps": len(autocast_checks),
        "autocast_max_relative_gap": autocast_gap,
        "state_dict_names_match": names_match,
        "torch_model_max_abs_difference": max_output_difference,
    }
    print(
        f"trained {args.steps} steps on {device} (compile={args.compile}): loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
        f"lr from OneCycleLR peaked at {max(learning_rates):.4g}"
    )
    print(
        f"autocast {summary['autocast_dtype']}: {len(autocast_checks)} steps, loss within "
        f"{100 * autocast_gap:.2f}% of float32"
    )
    print(f"state_dict -> torch model: names match {names_match}, logits differ by at most {max_output_difference:.2e}")
    return summary


def scheduler_lrs(args: argparse.Namespace) -> list[float]:
    """The learning rates OneCycleLR sets after each step (a plain torch optimizer as the reference)."""
    reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=args.lr)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        reference, max_lr=args.lr, total_steps=args.steps, cycle_momentum=False
    )
    rates = []
    for _ in range(args.steps - 1):
        reference.step()
        scheduler.step()
        rates.append(scheduler.get_last_lr()[0])
    return rates


def compare_with_torch_model(
    module: Module, torch_model: torch.nn.Module, images: np.ndarray, labels: np.ndarray
) -> tuple[bool, float]:
    """Load the module's state_dict into the torch model; compare its logits with the eval graph's."""
    state_dict = {name: tensor.cpu() for name, tensor in module.state_dict().items()}
    names_match = set(state_dict) == set(torch_model.state_dict())
    torch_model.load_state_dict(state_dict)  # strict: every name must match
    torch_model.eval()
    with torch.no_grad():
        expected = torch_model(torch.from_numpy(images))
    module.eval()
    _, logits = module(torch.from_numpy(images), torch.from_numpy(labels))
    return names_match, float((logits.cpu() - expected).abs().max())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--autocast-steps", type=int, default=5, help="last steps run under torch.autocast")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-3, help="peak learning rate of OneCycleLR")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the graphs through torch.compile (default on)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--out", default="runs/interop", help="output folder")
    args = parser.parse_args(argv)
    if not 0 <= args.autocast_steps <= args.steps:
        parser.error("--autocast-steps must be between 0 and --steps")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    summary = interop_demo(args)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
