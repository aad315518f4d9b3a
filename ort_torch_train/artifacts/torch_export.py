"""Export a ``torch.nn.Module`` to the ONNX base model ``generate_artifacts`` starts from.

The export keeps training behaviour (the legacy exporter with ``TrainingMode.TRAINING`` and no
constant folding; the dynamo exporter with the module in train mode and no ONNX optimisation, which
would fold BatchNorm into the preceding Conv and lose its parameters). The module's state and mode
are restored afterwards.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import torch

from ort_torch_train.errors import ModelError
from ort_torch_train.torch_internals import tree_leaves

EXPORT_OPTIONS = frozenset(
    {"example_inputs", "input_names", "output_names", "dynamic_axes", "dynamic_shapes", "exporter", "opset_version"}
)
LEGACY_DEFAULT_OPSET = 17


@dataclass(frozen=True)
class TorchExport:
    """The parameter split torch's ``requires_grad`` flags give the exported base model."""

    requires_grad: list[str]
    frozen_params: list[str]


def export_module(module: torch.nn.Module, options: dict[str, Any], path: Path) -> TorchExport:
    """Export ``module`` to the file ``path`` with ``options`` (``example_inputs`` required; see ``EXPORT_OPTIONS``).

    Past 2 GB the exporters put the weights in external data files beside ``path``.
    """
    unknown = sorted(set(options) - EXPORT_OPTIONS)
    if unknown:
        raise TypeError(
            f"generate_artifacts() got unexpected keyword argument(s) {unknown}; "
            f"a torch.nn.Module accepts {sorted(EXPORT_OPTIONS)}"
        )
    if "example_inputs" not in options:
        raise TypeError("generate_artifacts(torch_module, ...) needs example_inputs= (a tensor or a tuple of tensors)")
    args = _as_tuple(options["example_inputs"])
    exporter = options.get("exporter", "legacy")
    if exporter not in ("legacy", "dynamo"):
        raise ValueError(f"exporter must be 'legacy' or 'dynamo', got {exporter!r}")
    input_names = list(options.get("input_names") or _forward_argument_names(module, len(args)))
    output_names = list(options.get("output_names") or _default_output_names(module, args))
    dynamic_axes = options.get("dynamic_axes")
    if dynamic_axes is None and options.get("dynamic_shapes") is None:
        dynamic_axes = _batch_axes(args, input_names, output_names)
    # a training-mode forward changes buffers (BatchNorm's running stats), never parameters: keep the buffers only
    snapshot = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
    was_training = module.training
    try:
        module.train()
        if exporter == "legacy":
            _legacy_export(module, args, path, input_names, output_names, dynamic_axes, options.get("opset_version"))
        else:
            _dynamo_export(module, args, path, input_names, output_names, dynamic_axes, options)
    finally:
        buffers = dict(module.named_buffers())
        with torch.no_grad():
            for name, value in snapshot.items():
                buffers[name].copy_(value)
        module.train(was_training)
    return TorchExport(*_parameter_split(module, onnx.load(path, load_external_data=False)))


def _as_tuple(example_inputs: Any) -> tuple[torch.Tensor, ...]:
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not args or not all(isinstance(arg, torch.Tensor) for arg in args):
        raise TypeError("example_inputs must be a tensor or a non-empty tuple of tensors")
    return args


def _forward_argument_names(module: torch.nn.Module, count: int) -> list[str]:
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    names = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:count]
    return names if len(names) == count else [f"input_{i}" for i in range(count)]


def _default_output_names(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> list[str]:
    """'output', or output_0, output_1, ...: counted with one eval-mode forward (no state changes)."""
    was_training = module.training
    try:
        with torch.no_grad():
            outputs = module.eval()(*args)
    finally:
        module.train(was_training)
    count = len(tree_leaves(outputs))
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def _batch_axes(
    args: tuple[torch.Tensor, ...], input_names: Sequence[str], output_names: Sequence[str]
) -> dict[str, dict[int, str]]:
    """Dimension 0 of every input and output named 'batch'."""
    axes = {name: {0: "batch"} for name, arg in zip(input_names, args) if arg.dim() > 0}
    axes.update({name: {0: "batch"} for name in output_names})
    return axes


def _legacy_export(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict | None,
    opset_version: int | None,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning))
        torch.onnx.export(
            module,
            args,
            str(path),
            dynamo=False,
            opset_version=opset_version or LEGACY_DEFAULT_OPSET,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
        )


def _dynamo_export(
    module: torch.nn.Module,
    args: tuple[torch.Tensor, ...],
    path: Path,
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict | None,
    options: dict[str, Any],
) -> None:
    if importlib.util.find_spec("onnxscript") is None:
        raise ModelError(
            "exporter='dynamo' needs the onnxscript package (pip install onnxscript); "
            "or use the default exporter='legacy'"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning, UserWarning))
        program = torch.onnx.export(
            module,
            args,
            dynamo=True,
            optimize=False,
            verbose=False,
            opset_version=options.get("opset_version"),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            dynamic_shapes=options.get("dynamic_shapes"),
        )
    if program is None:
        raise ModelError("torch.onnx.export's dynamo exporter returned no program")
    program.save(str(path))


def _parameter_split(module: torch.nn.Module, model: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """Exported initializers that are torch parameters: (requires_grad ones, the others), initializer order."""
    flags = {name: param.requires_grad for name, param in module.named_parameters()}
    initializers = [init.name for init in model.graph.initializer]
    missing = [name for name, trainable in flags.items() if trainable and name not in initializers]
    if missing:
        warnings.warn(
            f"torch parameters {missing} are not initializers of the exported model (unused by forward "
            "or renamed by the exporter) and will not be trained; pass requires_grad= to choose",
            stacklevel=3,
        )
    return (
        [name for name in initializers if flags.get(name) is True],
        [name for name in initializers if flags.get(name) is False],
    )
