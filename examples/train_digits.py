"""The main job: train a digit classifier on scikit-learn's 8x8 digits with ort-torch-train.

Export a small torch model to ONNX, generate the training artifacts, train them with this project
(ORT's training loop with only the import changed) on CPU (CUDA when present), evaluate on a
held-out split, save a checkpoint, export the inference model, run it with onnxruntime, and plot.

    python examples/train_digits.py [--epochs 30] [--out runs/digits]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.progress import ProgressBar


class DigitNet(torch.nn.Module):
    """A small MLP for 8x8 digit images."""

    def __init__(self, hidden: int = 128, classes: int = 10):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


def load_data(seed: int) -> tuple[np.ndarray, ...]:
    """Digits scaled to [0, 1], flattened; a stratified 80/20 train/held-out split."""
    digits = load_digits()
    images = (digits.images.reshape(len(digits.images), -1) / 16.0).astype(np.float32)
    labels = digits.target.astype(np.int64)
    return tuple(train_test_split(images, labels, test_size=0.2, random_state=seed, stratify=labels))


def make_artifacts(directory: Path, seed: int) -> DigitNet:
    """Export a freshly initialised torch model and generate ORT's four training artifacts from it;
    return the torch model (its parameters are the checkpoint's initial values)."""
    torch.manual_seed(seed)
    model = DigitNet()
    generate_artifacts(
        model,
        example_inputs=(torch.zeros(32, 64),),
        input_names=["images"],
        output_names=["logits"],
        dynamic_axes={"images": {0: "batch"}, "logits": {0: "batch"}},
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        additional_output_names=["logits"],
        artifact_directory=directory,
    )
    return model


def open_training(artifacts: Path, checkpoint: Path, device: str) -> tuple[CheckpointState, Module, Optimizer]:
    """ORT's three objects over the artifacts: the checkpoint's state, a Module and its Optimizer."""
    state = CheckpointState.load_checkpoint(checkpoint)
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", device=device)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    return state, module, optimizer


def train_step(module: Module, optimizer: Optimizer, scheduler, images, labels) -> float:
    """One step of ORT's loop: forward and backward, optimizer step, schedule, reset the gradients."""
    module.train()
    loss, _ = module(images, labels)
    optimizer.step()
    scheduler.step()
    module.lazy_reset_grad()
    return float(loss)


def accuracy(module: Module, images: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Eval loss and accuracy on a split (eval graph: dropout off)."""
    module.eval()
    loss, logits = module(images, labels)
    return float(loss), float((logits.argmax(axis=1) == labels).mean())


def train(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    artifacts = out / "artifacts"
    x_train, x_test, y_train, y_test = load_data(args.seed)
    make_artifacts(artifacts, args.seed)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    state, module, optimizer = open_training(artifacts, artifacts / "checkpoint", device)
    steps_per_epoch = len(x_train) // args.batch_size
    total = steps_per_epoch * args.epochs
    scheduler = LinearLRScheduler(optimizer, warmup_step_count=total // 10, total_step_count=total, initial_lr=args.lr)

    rng = np.random.default_rng(args.seed)
    history: dict[str, list[float]] = {"step": [], "train_loss": [], "epoch": [], "test_loss": [], "test_accuracy": []}
    bar = ProgressBar(total, f"training on {device}")
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        for batch in range(steps_per_epoch):
            index = order[batch * args.batch_size : (batch + 1) * args.batch_size]
            loss = train_step(module, optimizer, scheduler, x_train[index], y_train[index])
            history["step"].append(len(history["step"]) + 1)
            history["train_loss"].append(loss)
            bar.update(loss=loss, lr=optimizer.get_learning_rate())
        test_loss, test_accuracy = accuracy(module, x_test, y_test)
        history["epoch"].append(epoch)
        history["test_loss"].append(test_loss)
        history["test_accuracy"].append(test_accuracy)
    bar.close()
    seconds = time.perf_counter() - started

    state.properties["epoch"] = args.epochs
    state.properties["test_accuracy"] = history["test_accuracy"][-1]
    CheckpointState.save_checkpoint(state, out / "checkpoint", include_optimizer_state=True)
    module.export_model_for_inferencing(out / "inference.onnx", ["logits"])
    onnxruntime_accuracy = run_inference_model(out / "inference.onnx", x_test, y_test)
    plot(history, out / "training.png")
    summary = {
        "device": device,
        "steps": total,
        "seconds": round(seconds, 2),
        "final_train_loss": history["train_loss"][-1],
        "test_accuracy": history["test_accuracy"][-1],
        "onnxruntime_test_accuracy": onnxruntime_accuracy,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def run_inference_model(path: Path, images: np.ndarray, labels: np.ndarray) -> float:
    """Accuracy of the exported inference model, run by onnxruntime."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [logits] = session.run(["logits"], {session.get_inputs()[0].name: images})
    return float((logits.argmax(axis=1) == labels).mean())


def plot(history: dict[str, list[float]], path: Path) -> None:
    """Training loss per step and held-out accuracy per epoch, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(history["step"], history["train_loss"], linewidth=0.8, label="train loss")
    left.set_xlabel("step")
    left.set_ylabel("cross-entropy")
    left.set_yscale("log")
    left.legend()
    right.plot(history["epoch"], history["test_accuracy"], marker="o", label="held-out accuracy")
    right.set_xlabel("epoch")
    right.set_ylim(0, 1)
    right.legend()
    figure.suptitle("ort-torch-train: digits")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--out", default="runs/digits", help="output folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    summary = train(parse_args(argv))
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
