"""One training step of each configuration, split into named phases.

Every runner trains the same model from the same weights on the same fixed batch:

- ``ours`` / ``ours-compile``: ``loss = module(x, y); optimizer.step(); module.lazy_reset_grad()`` with
  ``ort_torch_train.api`` on the artifacts (``compile=True`` for the second);
- ``ours-step``: ``loss = module.step(optimizer, x, y)`` with ``compile=True``: the same three calls as one
  compiled graph (on CPU with inductor's C++ wrapper, the default); ``ours-step-py``: the same with the
  Python wrapper (``{"options": {"cpp_wrapper": False}}``); ``ours-step-graphs``: with ``compile="reduce-overhead"``
  (CUDA graphs; CUDA only); ``ours-step-dynamic``: ``ours-step`` with the graph's symbolic axes compiled as
  dynamic dimensions (``Module(dynamic=True)``, the library's default). The others compile fixed shapes
  (``dynamic=False``), as ``torch-compile`` does;
- ``torch``: the model written in eager PyTorch, CrossEntropy, backward, ``torch.optim.AdamW(fused=True)``,
  ``zero_grad(set_to_none=False)``; ``torch-compile``: the same with model and loss through torch.compile;
- ``ort``: the same loop as ``ours`` with onnxruntime-training (run in its own venv).

``precision="bf16"`` runs every torch configuration's forward under ``torch.autocast`` (ours through
``Module(mixed_precision="bf16")``); parameters and AdamW's moments stay float32.

torch is imported only by the runners that use it, so the ORT worker's memory is ORT's alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CONFIGS = (
    "ours",
    "ours-compile",
    "ours-step",
    "ours-step-py",
    "ours-step-graphs",
    "ours-step-dynamic",
    "torch",
    "torch-compile",
    "ort",
)
_COMPILE = {
    "ours": False,
    "ours-compile": True,
    "ours-step": True,
    "ours-step-py": {"options": {"cpp_wrapper": False}},
    "ours-step-graphs": "reduce-overhead",
    "ours-step-dynamic": True,
}
PRECISIONS = {"bf16": "bfloat16"}  # --mixed-precision: torch.autocast dtype


@dataclass
class Runner:
    """A training step as named phases (run in order), a device sync, and the last loss."""

    phases: list[tuple[str, Callable[[], object]]]
    sync: Callable[[], None] | None
    last_loss: Callable[[], float]
    peak_memory_mb: Callable[[], float] | None = None  # device memory; None: the process's peak RSS


def make_runner(
    config: str,
    artifacts: Path,
    x: np.ndarray,
    y: np.ndarray,
    *,
    threads: int,
    device: str,
    lr: float,
    model_name: str,
    torch_inputs: bool = False,
    precision: str | None = None,
) -> Runner:
    """The runner of ``config`` (one of CONFIGS) with ``threads`` CPU threads.

    ``ours``/``ours-compile`` get numpy arrays, as ORT does, unless ``torch_inputs`` (always on CUDA).
    ``precision``: None (float32) or a key of PRECISIONS; ORT has no mixed precision here.
    """
    if config == "ort":
        if precision is not None:
            raise ValueError(f"precision {precision!r}: onnxruntime-training's CPU build trains float32 only")
        return _ort_runner(artifacts, x, y, threads=threads, lr=lr)
    import torch

    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:  # settable once per process, before any parallel work
        torch.set_num_interop_threads(1)
    if config in ("torch", "torch-compile"):
        return _torch_runner(
            model_name, x, y, device=device, lr=lr, compile=config == "torch-compile", precision=precision
        )
    if config in _COMPILE:
        return _ours_runner(
            artifacts,
            x,
            y,
            device=device,
            lr=lr,
            compile=_COMPILE[config],
            one_graph=config.startswith("ours-step"),
            dynamic=config == "ours-step-dynamic",
            torch_inputs=torch_inputs or device.startswith("cuda"),
            precision=precision,
        )
    raise ValueError(f"unknown config {config!r}; expected one of {CONFIGS}")


def ours_module(artifacts: Path, lr: float, **options: object) -> tuple:
    """``(module, optimizer)`` of this project on the artifacts in ``artifacts``, in train mode, at
    learning rate ``lr``; ``options`` go to ``Module``."""
    from ort_torch_train.api import CheckpointState, Module, Optimizer

    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx", **options)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(lr)
    module.train()
    return module, optimizer


def _torch_device_hooks(device: str) -> tuple[Callable[[], None] | None, Callable[[], float] | None]:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.synchronize, lambda: torch.cuda.max_memory_allocated() / 2**20
    return None, None


def _ours_runner(
    artifacts: Path,
    x: np.ndarray,
    y: np.ndarray,
    *,
    device: str,
    lr: float,
    compile: bool | str | dict,
    one_graph: bool,
    dynamic: bool,
    torch_inputs: bool,
    precision: str | None,
) -> Runner:
    import torch

    module, optimizer = ours_module(
        artifacts, lr, device=device, compile=compile, dynamic=dynamic, mixed_precision=precision
    )
    if torch_inputs:
        x, y = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    loss = [None]

    def forward_backward() -> None:
        loss[0] = module(x, y)

    def full_step() -> None:
        loss[0] = module.step(optimizer, x, y)

    sync, peak = _torch_device_hooks(device)
    phases = [
        ("forward+backward", forward_backward),
        ("optimizer", optimizer.step),
        ("reset grad", module.lazy_reset_grad),
    ]
    return Runner([("full step", full_step)] if one_graph else phases, sync, lambda: float(loss[0]), peak)


def _torch_runner(
    model_name: str, x: np.ndarray, y: np.ndarray, *, device: str, lr: float, compile: bool, precision: str | None
) -> Runner:
    import contextlib

    import torch
    from models import ADAMW_EPS, MODELS

    model = MODELS[model_name].build().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=ADAMW_EPS, weight_decay=0.0, fused=True)
    criterion = torch.nn.CrossEntropyLoss()
    inputs, targets = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
    loss = [None]

    def model_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        autocast = (
            contextlib.nullcontext()
            if precision is None
            else torch.autocast(inputs.device.type, dtype=getattr(torch, PRECISIONS[precision]))
        )
        with autocast:
            return criterion(model(inputs), targets)

    compute_loss = torch.compile(model_loss, fullgraph=True, dynamic=False) if compile else model_loss

    def forward_backward() -> None:
        loss[0] = compute_loss(inputs, targets)
        loss[0].backward()

    sync, peak = _torch_device_hooks(device)
    phases = [
        ("forward+backward", forward_backward),
        ("optimizer", optimizer.step),
        ("reset grad", lambda: optimizer.zero_grad(set_to_none=False)),
    ]
    return Runner(phases, sync, lambda: float(loss[0]), peak)


def _ort_runner(artifacts: Path, x: np.ndarray, y: np.ndarray, *, threads: int, lr: float) -> Runner:
    import onnxruntime as ort
    from onnxruntime.training.api import CheckpointState, Module, Optimizer

    ort.set_default_logger_severity(3)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    state = CheckpointState.load_checkpoint(str(artifacts / "checkpoint"))
    module = Module(
        str(artifacts / "training_model.onnx"),
        state,
        str(artifacts / "eval_model.onnx"),
        device="cpu",
        session_options=options,
    )
    optimizer = Optimizer(str(artifacts / "optimizer_model.onnx"), module)
    optimizer.set_learning_rate(lr)
    module.train()
    loss = [None]

    def forward_backward() -> None:
        loss[0] = module(x, y)

    phases = [
        ("forward+backward", forward_backward),
        ("optimizer", optimizer.step),
        ("reset grad", module.lazy_reset_grad),
    ]
    return Runner(phases, None, lambda: float(loss[0]))
