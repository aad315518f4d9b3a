"""Activation memory with and without ``Module(recompute=...)`` and the legacy recompute settings on the encoder.

Settings: ``none``, ``true`` or a segment count k train the artifacts with ``Module(recompute=...)``
and ``Optimizer``; ``legacy`` (nothing recomputed) and ``legacy:gelu``, ``legacy:attn_dropout``,
``legacy:layers`` (every layer but the last), ``legacy:layers=N``, ``legacy:all`` (the three) train
the exported forward model plus a cross-entropy loss with the legacy ``TrainingSession`` (AdamOptimizer)
and its ``gelu_recompute`` / ``attn_dropout_recompute`` / ``transformer_layer_recompute`` settings.
``--model encoder_gelu_dropout`` (GELU, dropout 0.1) has the GELUs and attention dropouts those look for.
Each setting runs in its own process: build the model, take one warmup step (the
graph is converted then), then train ``--steps`` steps and report the peak memory above what was
held before them (CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's resident set,
sampled every 0.2 ms from /proc/self/statm, with glibc told to ``mmap`` every allocation over 64 KiB
so that freed tensors leave the RSS), the median step time and the losses (which must agree across
settings of one API). The first column is exact: the bytes of the tensors the forward keeps for
backward (distinct storages, counted by ``torch.autograd.graph.saved_tensors_hooks``); ratios are
against the first setting of the same API.

    python bench/experiments/bench_recompute.py [--model encoder] [--device cpu|cuda] [--steps 3] [--settings none 4 true]
    python bench/experiments/bench_recompute.py --model encoder_gelu_dropout --settings legacy legacy:gelu \
        legacy:attn_dropout legacy:layers legacy:all
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parents[1]
HARNESS = BENCH / "harness"
sys.path.insert(0, str(HARNESS))

from memory import in_own_process  # noqa: E402


def _setting(text: str) -> bool | int | None:
    """A ``recompute`` value from its command-line spelling: none, true or a segment count."""
    return {"none": None, "true": True}.get(text.lower()) if not text.isdigit() else int(text)


def child(model_name: str, device: str, steps: int, setting_text: str) -> dict:
    import torch
    from model_artifacts import prepare_artifacts
    from models import ENCODER_GELU_DROPOUT, MODELS

    from ort_torch_train.api import set_threads

    set_threads(2)  # pinned: the library's default follows the load
    model = {**MODELS, ENCODER_GELU_DROPOUT.name: ENCODER_GELU_DROPOUT}[model_name]
    directory = prepare_artifacts(model, BENCH / ".cache", use_ort=False).directory
    x, y = model.batch_arrays()
    inputs = (torch.from_numpy(x).to(device), torch.from_numpy(y).to(device))
    if setting_text.startswith("legacy"):
        step, engine = _legacy_session(directory, setting_text, device, x, y)
    else:
        step, engine = _module(directory, setting_text, device, inputs)
    torch.manual_seed(0)
    losses = [step()]  # warmup: converts the graph
    saved = _saved_for_backward_bytes(engine, inputs)
    sampler = _RssSampler() if device == "cpu" else None
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _rss()
        sampler.start()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        losses.append(step())
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else sampler.stop()
    return {
        "setting": setting_text,
        "saved_mb": saved / 2**20,
        "peak_added_mb": (peak - base) / 2**20,
        "median_step_s": float(np.median(times)),
        "losses": losses,
    }


def _module(directory: Path, setting_text: str, device: str, inputs):
    from ort_torch_train.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, device=device, recompute=_setting(setting_text))
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    return (lambda: float(module.step(optimizer, *inputs))), module


def _legacy_session(directory: Path, setting_text: str, device: str, x: np.ndarray, y: np.ndarray):
    """A legacy TrainingSession on the exported forward model plus a cross-entropy loss."""
    import onnx
    from onnx import TensorProto, helper

    from ort_torch_train.legacy import TrainingParameters, TrainingSession

    forward = onnx.load(directory / "base_model.onnx")
    forward.graph.input.append(helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"]))
    forward.graph.node.append(
        helper.make_node("SoftmaxCrossEntropyLoss", [forward.graph.output[0].name, "labels"], ["loss"])
    )
    forward.graph.output.append(helper.make_tensor_value_info("loss", TensorProto.FLOAT, []))
    weights = [init.name for init in forward.graph.initializer if init.data_type == TensorProto.FLOAT and init.dims]
    parameters = TrainingParameters()
    parameters.loss_output_name = "loss"
    parameters.training_optimizer_name = "AdamOptimizer"
    parameters.optimizer_attributes_map = {w: {} for w in weights}
    parameters.optimizer_int_attributes_map = {w: {} for w in weights}
    for name, value in _legacy_settings(setting_text).items():
        setattr(parameters, name, value)
    providers = ["CUDAExecutionProvider"] if device == "cuda" else ["CPUExecutionProvider"]
    session = TrainingSession(forward.SerializeToString(), parameters, providers=providers)
    feeds = {forward.graph.input[0].name: x, "labels": y, "Learning_Rate": np.array([1e-3], np.float32)}
    return (lambda: float(session.run(["loss"], feeds)[0])), session._engine


def _legacy_settings(text: str) -> dict:
    """The TrainingParameters of a ``legacy[:gelu|:attn_dropout|:layers[=N]|:all]`` setting."""
    what, _, count = text.partition(":")[2].partition("=")
    if text == "legacy":
        return {}
    if what == "layers":
        return {"transformer_layer_recompute": True, "number_recompute_layers": int(count or 0)}
    known = {
        "gelu": {"gelu_recompute": True},
        "attn_dropout": {"attn_dropout_recompute": True},
        "all": {"gelu_recompute": True, "attn_dropout_recompute": True, "transformer_layer_recompute": True},
    }
    if what not in known or count:
        raise SystemExit(
            f"unknown setting {text!r}: expected none, true, a segment count, legacy, legacy:gelu, "
            "legacy:attn_dropout, legacy:layers[=N] or legacy:all"
        )
    return known[what]


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _RssSampler(threading.Thread):
    """The largest resident set seen between ``start()`` and ``stop()``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = _rss()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.0002):
            self.peak = max(self.peak, _rss())

    def stop(self) -> int:
        self._done.set()
        self.join()
        return max(self.peak, _rss())


def _saved_for_backward_bytes(engine, inputs) -> int:
    """Bytes of the distinct storages the train forward saves for backward (no backward is run)."""
    import torch

    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        engine.train_graph(list(inputs), [engine.training_state.params[n] for n in engine.train_layout.params])
    return sum(storages.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="encoder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--settings", nargs="+", default=["none", "4", "true"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.model, args.device, args.steps, args.child)))
        return 0
    rows = []
    for setting in args.settings:
        arguments = ["--model", args.model, "--device", args.device, "--steps", str(args.steps), "--child", setting]
        rows.append(in_own_process(__file__, *arguments, cwd=BENCH))
    print(
        f"| {args.model} on {args.device} | recompute | saved for backward (MB) | vs first | "
        "peak memory added by the steps (MB) | vs first | median step (s) | vs first | max loss difference |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        family = row["setting"].startswith("legacy")
        baseline = next(r for r in rows if r["setting"].startswith("legacy") == family)
        difference = max(abs(a - b) for a, b in zip(row["losses"], baseline["losses"]))
        print(
            f"| | {row['setting']} | {row['saved_mb']:.1f} | {row['saved_mb'] / baseline['saved_mb']:.2f} | "
            f"{row['peak_added_mb']:.1f} | {row['peak_added_mb'] / baseline['peak_added_mb']:.2f} | "
            f"{row['median_step_s']:.3f} | {row['median_step_s'] / baseline['median_step_s']:.2f} | "
            f"{difference:.1e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
