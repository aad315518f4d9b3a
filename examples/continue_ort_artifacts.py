"""Continue training artifacts made by ONNX Runtime, and hand back what ORT users expect.

Takes an ORT case folder (``artifacts/`` with training, eval and optimizer models and a checkpoint,
plus ``data.npz`` with ``x_train[steps, batch, ...]``, ``y_train``, ``x_eval``, ``y_eval``: the layout
of ``tests/fixtures/<name>`` and the reference corpus), continues training on the GPU when there is
one (CPU otherwise) from ORT's own final checkpoint when the folder has one, and writes:

- ``checkpoint``: an ORT checkpoint with the optimizer state (``CheckpointState.save_checkpoint``),
- ``inference.onnx``: the inference model (``Module.export_model_for_inferencing``),

then checks both with onnxruntime: the inference model runs, and onnxruntime's eval loss of the
eval model fed the saved checkpoint's parameters equals this project's eval loss.

    python examples/continue_ort_artifacts.py [CASE_DIR] [--steps 20] [--out runs/continue]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import torch

from ort_torch_train.api import CheckpointState, Module, Optimizer

REPO = Path(__file__).resolve().parents[1]
CASE_ROOTS = (REPO / "tests" / "fixtures", REPO.parent / "shared" / "refcorpus")


def default_case() -> Path:
    """tests/fixtures/cnn, else the first ORT case folder found in the fixtures or the reference corpus."""
    preferred = CASE_ROOTS[0] / "cnn"
    if (preferred / "artifacts").is_dir():
        return preferred
    for root in CASE_ROOTS:
        for case in sorted(root.glob("*/artifacts")):
            if (case.parent / "data.npz").is_file():
                return case.parent
    raise SystemExit(f"no ORT case folder found under {', '.join(map(str, CASE_ROOTS))}: pass CASE_DIR")


def case_settings(case: Path) -> dict:
    """Data keys, inference outputs and ORT's final eval loss from the case's expected.json, where it has one."""
    expected_path = case / "expected.json"
    expected = json.loads(expected_path.read_text()) if expected_path.is_file() else {}
    keys = expected.get("data_keys") or {}
    return {
        "train_keys": keys.get("train") or ["x_train", "y_train"],
        "eval_keys": keys.get("eval") or ["x_eval", "y_eval"],
        "outputs": expected.get("inference_export", {}).get("graph_output_names"),
        "eval_loss": expected.get("train", {}).get("eval_loss"),  # ORT's, on its final checkpoint
    }


def inference_outputs(eval_model: onnx.ModelProto, requested: list[str] | None) -> list[str]:
    """The values the inference model returns: as requested, else the eval model's non-loss outputs, else logits."""
    if requested:
        return requested
    return [output.name for output in eval_model.graph.output][1:] or ["logits"]


def continue_training(args: argparse.Namespace) -> dict:
    case = Path(args.case) if args.case else default_case()
    artifacts, out = case / "artifacts", Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = case_settings(case)
    with np.load(case / "data.npz") as data:
        train = [data[key] for key in args.train_keys or settings["train_keys"]]
        evaluation = [data[key] for key in args.eval_keys or settings["eval_keys"]]
    start = Path(args.checkpoint) if args.checkpoint else start_checkpoint(case)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")

    state = CheckpointState.load_checkpoint(start)
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", device=device)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(args.lr)
    first_step = state.training_state.optimizer.step
    eval_before = eval_loss(module, evaluation)
    losses = train_steps(module, optimizer, train, args.steps or len(train[0]))
    eval_after = eval_loss(module, evaluation)

    checkpoint, inference = out / "checkpoint", out / "inference.onnx"
    CheckpointState.save_checkpoint(state, checkpoint, include_optimizer_state=True)
    outputs = inference_outputs(module.eval_model, args.outputs or settings["outputs"])
    module.export_model_for_inferencing(inference, outputs)
    reloaded = CheckpointState.load_checkpoint(checkpoint)
    eval_feeds = dict(zip(module.input_names(training=False), evaluation))
    summary = {
        "case": str(case),
        "device": device,
        "start_checkpoint": str(start),
        "start_step": first_step,
        "end_step": reloaded.training_state.optimizer.step,
        "losses": losses,
        "eval_loss_before": eval_before,
        "ort_eval_loss_before": settings["eval_loss"] if start == case / "final_checkpoint_with_optimizer" else None,
        "eval_loss_after": eval_after,
        "checkpoint": str(checkpoint),
        "inference_model": str(inference),
        "onnxruntime_eval_loss": onnxruntime_eval_loss(artifacts / "eval_model.onnx", reloaded, eval_feeds),
        "inference_outputs": run_inference_model(inference, eval_feeds),
    }
    ort_text = "" if summary["ort_eval_loss_before"] is None else f" (ORT: {summary['ort_eval_loss_before']:.4f})"
    print(
        f"continued {case.name} from {start.name} (step {summary['start_step']}) on {device}: "
        f"{len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
        f"eval loss {eval_before:.4f}{ort_text} -> {eval_after:.4f} "
        f"(onnxruntime on the saved checkpoint: {summary['onnxruntime_eval_loss']:.4f})"
    )
    print(
        f"wrote {checkpoint} (step {summary['end_step']}, with optimizer state) and {inference} "
        f"(outputs {summary['inference_outputs']})"
    )
    return summary


def start_checkpoint(case: Path) -> Path:
    """ORT's own checkpoint after its training run, where the case has one; else the artifacts' initial one."""
    final = case / "final_checkpoint_with_optimizer"
    return final if final.is_file() else case / "artifacts" / "checkpoint"


def train_steps(module: Module, optimizer: Optimizer, batched_inputs: list[np.ndarray], steps: int) -> list[float]:
    """ORT's loop over the batches (x[i] feeds step i, cycling); the loss of each step."""
    losses = []
    module.train()
    for step in range(steps):
        batch = [array[step % len(array)] for array in batched_inputs]
        losses.append(float(np.mean(first_output(module(*batch)))))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def first_output(outputs):
    """The loss: the first of a step's outputs."""
    return outputs[0] if isinstance(outputs, tuple) else outputs


def eval_loss(module: Module, inputs: list[np.ndarray]) -> float:
    """The eval graph's loss on the whole eval set."""
    module.eval()
    return float(np.mean(first_output(module(*inputs))))


def ort_session(path: Path):
    """An onnxruntime CPU session, quiet about the unused initializers that exports leave behind."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnxruntime_eval_loss(eval_model: Path, state: CheckpointState, inputs: dict[str, np.ndarray]) -> float:
    """onnxruntime's loss of the eval model fed ``inputs`` and the checkpoint's parameters."""
    session = ort_session(eval_model)
    feeds = {
        value.name: inputs[value.name] if value.name in inputs else state.parameters[value.name].data
        for value in session.get_inputs()
    }
    return float(np.mean(session.run(None, feeds)[0]))


def run_inference_model(path: Path, inputs: dict[str, np.ndarray]) -> dict[str, list[int]]:
    """Run the inference model with onnxruntime on the eval inputs it takes; output name -> shape."""
    session = ort_session(path)
    results = session.run(None, {value.name: inputs[value.name] for value in session.get_inputs()})
    for output, value in zip(session.get_outputs(), results):
        if not np.isfinite(value).all():
            raise RuntimeError(f"inference output {output.name!r} holds non-finite values")
    return {output.name: list(value.shape) for output, value in zip(session.get_outputs(), results)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", nargs="?", help="ORT case folder (default: tests/fixtures/cnn or another found)")
    parser.add_argument(
        "--checkpoint",
        help="checkpoint to continue from (default: the case's "
        "final_checkpoint_with_optimizer, else artifacts/checkpoint)",
    )
    parser.add_argument("--steps", type=int, default=None, help="steps to train (default: one pass over x_train)")
    parser.add_argument(
        "--train-keys",
        nargs="+",
        metavar="KEY",
        help="data.npz arrays of the training inputs, batched [steps, batch, ...] "
        "(default: expected.json's data_keys, else x_train y_train)",
    )
    parser.add_argument(
        "--eval-keys",
        nargs="+",
        metavar="KEY",
        help="data.npz arrays of the eval inputs (default: expected.json's data_keys, else x_eval y_eval)",
    )
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument(
        "--outputs",
        nargs="+",
        metavar="NAME",
        help="graph values the inference model returns (default: the case's recorded "
        "ones, else the eval model's outputs after the loss)",
    )
    parser.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    parser.add_argument("--out", default="runs/continue", help="output folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    summary = continue_training(args)
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
