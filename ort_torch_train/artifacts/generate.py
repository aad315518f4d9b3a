"""``generate_artifacts``: ORT's on-device training artifacts, made without onnxruntime-training.

Mirrors ``onnxruntime.training.artifacts.generate_artifacts`` (1.19.2). What ORT 1.19.2 itself
can load of the output (tested against it in ``tests/parity/test_artifacts_ort.py``):

- ``checkpoint`` / ``nominal_checkpoint``: ORT's format; ``CheckpointState.load_checkpoint`` loads them.
- ``eval_model.onnx``: forward + loss with eval semantics, as ORT writes it; loads in
  ``InferenceSession`` and serves as the eval model of ORT's ``Module``.
- ``optimizer_model.onnx``: ORT's exact layout; ORT's ``Optimizer`` runs it.
- ``training_model.onnx``: forward + loss with training semantics and the parameters as inputs, but
  NO gradient graph (ORT builds one with its C++ gradient builder; here torch autograd does that
  work). ``ort_torch_train.api.Module`` trains it; ORT's ``Module`` refuses it ("Gradient buffer
  input not provided for param").

Models keep IR version <= 10 (ORT 1.19.2's limit); a default-domain opset above 21 draws a warning,
as ORT 1.19.2 cannot load such models (this project's Module can).
"""

from __future__ import annotations

import copy
import itertools
import os
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from ort_torch_train.artifacts.blocks import Block, building
from ort_torch_train.artifacts.external import checkable
from ort_torch_train.artifacts.generate_arguments import (
    base_model,
    graph_outputs,
    loss_block_of,
    loss_inputs,
    optimizer_block_of,
)
from ort_torch_train.artifacts.graph_edit import (
    ORT_MAX_OPSET,
    batch_statistics_nodes,
    declare_constant_shapes,
    default_opset,
    disable_training_mode,
    move_initializers_to_inputs,
    ort_ir_version,
    ort_loadable,
    register_graph_outputs,
    trim_inference_batchnorm_outputs,
)
from ort_torch_train.artifacts.losses import LossType
from ort_torch_train.artifacts.optimizers import OptimType, build_optimizer_model
from ort_torch_train.artifacts.parameters import check_arguments, selected_parameters
from ort_torch_train.checkpoint.odtc import EXTERNAL_DATA_THRESHOLD, CheckpointRecord, write_checkpoint
from ort_torch_train.convert.registry import check_supported
from ort_torch_train.dtypes import tensor_from_proto
from ort_torch_train.errors import ModelError
from ort_torch_train.export.external_data import EXTERNAL_DATA_THRESHOLD as MODEL_EXTERNAL_DATA_THRESHOLD
from ort_torch_train.export.external_data import is_external, shared_initializers, write_model
from ort_torch_train.export.inference import save_model
from ort_torch_train.export.outputs import record_model_outputs
from ort_torch_train.fileio import path_inside
from ort_torch_train.graph.layout import opsets_of
from ort_torch_train.graph.model_checks import with_ort_domain
from ort_torch_train.lora.apply import add_lora_to_base
from ort_torch_train.lora.config import LoraConfig
from ort_torch_train.optim.optimizer_model import read_optimizer_model

_WARNED_VERSIONS: set[tuple[int, int | None]] = set()  # (IR version, opset) pairs already warned about

TRAINING_MODEL_NOTE = (
    "ort-torch-train training model: forward + loss with training semantics, parameters as inputs, no gradient "
    "graph. Train it with ort_torch_train.api.Module; onnxruntime-training's Module cannot load it."
)


@dataclass
class Artifacts:
    """The generated models and checkpoint content, before anything is written.

    Args:
        training_model: the training model.
        eval_model: the eval model.
        optimizer_model: the optimizer model (None without an optimizer).
        checkpoint: the checkpoint's content.
        weights: data of the models' external initializers.
    """

    training_model: onnx.ModelProto
    eval_model: onnx.ModelProto
    optimizer_model: onnx.ModelProto | None
    checkpoint: CheckpointRecord
    weights: dict[str, torch.Tensor] = field(default_factory=dict)  # data of the models' external initializers

    def write(
        self, directory: Path, prefix: str = "", nominal_checkpoint: bool = False, threshold: int | None = None
    ) -> None:
        """Write the files ORT's generator writes, named as it names them.

        The constants both models hold (1 KiB or more) are stored once, in ``training_model.onnx.data``, which
        the eval model refers to. Models whose initializers pass ``threshold`` bytes (default: protobuf's
        2 GB) keep the others in ``<model>.onnx.data`` too; the checkpoint's parameters go to ``checkpoint.data`` past ``threshold``
        (default: ORT's 1800 MB).
        """
        directory.mkdir(parents=True, exist_ok=True)
        checkpoint_threshold = EXTERNAL_DATA_THRESHOLD if threshold is None else threshold
        names = ("training_model.onnx", "eval_model.onnx", "checkpoint", "nominal_checkpoint", "optimizer_model.onnx")
        path = {name: path_inside(directory, prefix + name, "prefix + file name") for name in names}
        shared = shared_initializers(self.training_model, self.eval_model)  # held once: the eval model refers to them
        placed = write_model(
            self.training_model, path["training_model.onnx"], self.weights, threshold=threshold, outside=shared
        )
        references = {name: placed[name] for name in shared}
        write_model(self.eval_model, path["eval_model.onnx"], self.weights, threshold=threshold, references=references)
        write_checkpoint(self.checkpoint, path["checkpoint"], checkpoint_threshold, artifact=True)
        if nominal_checkpoint:
            write_checkpoint(nominal(self.checkpoint), path["nominal_checkpoint"], artifact=True)
        if self.optimizer_model is not None:
            save_model(self.optimizer_model, path["optimizer_model.onnx"])


def generate_artifacts(
    model: onnx.ModelProto | str | os.PathLike | torch.nn.Module,
    requires_grad: Sequence[str] | None = None,
    frozen_params: Sequence[str] | None = None,
    loss: LossType | Block | None = None,
    optimizer: OptimType | Block | None = None,
    artifact_directory: str | bytes | os.PathLike | None = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library: str | os.PathLike | None = None,
    additional_output_names: Sequence[str] | None = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Sequence[str] | None = None,
    lora: LoraConfig | None = None,
    external_data_threshold: int | None = None,
    **extra_options: Any,
) -> None:
    """Write training_model.onnx, eval_model.onnx, checkpoint and, if asked, nominal_checkpoint, optimizer_model.onnx.

    As ORT: parameters are the initializers named in ``requires_grad`` (trained) or ``frozen_params``
    (kept, not trained); ``None`` selects none. ``loss`` is a ``LossType``, a ``Block`` or None (the model's
    first output is the loss); ``optimizer`` an ``OptimType``, a ``Block`` or None (no optimizer model).

    ``model`` may also be a ``torch.nn.Module`` with ``example_inputs=`` (and optionally ``input_names``,
    ``output_names``, ``dynamic_axes``/``dynamic_shapes``, ``exporter='legacy'|'dynamo'``,
    ``opset_version``); it is exported in training mode and, unless given, ``requires_grad``/``frozen_params``
    follow the torch parameters' ``requires_grad`` flags.

    ``lora=LoraConfig(...)`` adds low-rank adapters beside the targeted weight matrices: they are the
    only trainable parameters, the targeted weights and the parameters selected above are frozen
    (docs/lora.md).

    Models past 2 GB (or ``external_data_threshold`` bytes of initializers) are built without ever
    holding their weights in one proto: a path's external data stay on disk (memory-mapped), a torch
    module is exported to a file first, and the files are written with external data (docs/artifacts.md).

    Every argument is checked and every model built before the first file is written.
    """
    if ort_format:
        raise NotImplementedError(
            "ort_format=True is not supported: convert the generated .onnx files with onnxruntime's "
            "`python -m onnxruntime.tools.convert_onnx_models_to_ort` where ORT-format models are needed"
        )
    if custom_op_library is not None:
        raise NotImplementedError(
            "custom_op_library is not supported: custom operator libraries cannot run in "
            "PyTorch; register a torch converter for each custom operator with "
            "ort_torch_train.adapters.register (docs/converters.md)"
        )
    directory = Path.cwd() if artifact_directory is None else Path(os.fsdecode(artifact_directory))
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"artifact_directory {str(directory)!r} is a file, expected a directory")
    path_inside(directory, f"{prefix}checkpoint", "prefix + file name")  # a prefix leaving it refused at once
    threshold = MODEL_EXTERNAL_DATA_THRESHOLD if external_data_threshold is None else external_data_threshold
    with tempfile.TemporaryDirectory(prefix="ort-torch-train-base-") as scratch:  # a torch module's export
        base, weights, torch_split = base_model(model, extra_options, Path(scratch), threshold)
        if torch_split is not None and requires_grad is None and frozen_params is None:
            requires_grad, frozen_params = torch_split
        artifacts = build_artifacts(
            base,
            requires_grad,
            frozen_params,
            loss,
            optimizer,
            additional_output_names,
            loss_input_names,
            lora,
            weights,
        )
        artifacts.write(directory, prefix, nominal_checkpoint, external_data_threshold)


def build_artifacts(
    base: onnx.ModelProto,
    requires_grad: Sequence[str] | None,
    frozen_params: Sequence[str] | None,
    loss: LossType | Block | None = None,
    optimizer: OptimType | Block | None = None,
    additional_output_names: Sequence[str] | None = None,
    loss_input_names: Sequence[str] | None = None,
    lora: LoraConfig | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> Artifacts:
    """The artifacts of ``generate_artifacts`` in memory (``base`` is not modified).

    ``weights`` hold the data of ``base``'s external initializers (see ``artifacts.external``).
    """
    weights = weights or {}
    if lora is not None:
        if not isinstance(lora, LoraConfig):
            raise TypeError(f"lora: expected an ort_torch_train.lora.LoraConfig, got {type(lora).__name__}")
        if weights and lora.frozen_dtype is not None:
            raise ModelError(
                "lora: frozen_dtype needs the weights in memory, but this base model keeps them in external data; "
                "give Module(..., lora=LoraConfig(frozen_dtype=...)) at training time instead"
            )
        base, requires_grad, frozen_params = add_lora_to_base(base, requires_grad, frozen_params, lora)
    loss_block = loss_block_of(loss)
    loss_input_names = loss_inputs(base, loss_block, loss_input_names)
    trainable_names, frozen_names = check_arguments(
        base, requires_grad, frozen_params, additional_output_names, loss_input_names
    )
    optimizer_block = optimizer_block_of(optimizer)
    if optimizer_block is not None and not trainable_names:
        raise ModelError("an optimizer model needs at least one trainable parameter: requires_grad is empty")

    names = itertools.count(1)  # onnxblock's name counter, fresh for every call
    model = copy.deepcopy(base)
    declare_constant_shapes(model.graph)
    with building(model, names):
        outputs = graph_outputs(
            loss_block(*(loss_input_names or [v.name for v in base.graph.output])), additional_output_names
        )
    _check_model(checkable(model), loss_block)
    model = onnx.shape_inference.infer_shapes(model)
    register_graph_outputs(model, outputs)
    trainable, frozen = selected_parameters(model, trainable_names, frozen_names)
    move_initializers_to_inputs(model, trainable_names | frozen_names)

    training_model = copy.deepcopy(model)
    training_model.ir_version = ort_ir_version(training_model)
    training_model.metadata_props.add(key="ort_torch_train.training_model", value=TRAINING_MODEL_NOTE)
    check_supported(training_model.graph, opsets_of(training_model))

    _warn_running_statistics_stay(model)
    eval_model = model
    disable_training_mode(eval_model)
    trim_inference_batchnorm_outputs(eval_model)
    record_model_outputs(eval_model, (value.name for value in base.graph.output))
    eval_model.ir_version = ort_ir_version(eval_model)
    versions = (eval_model.ir_version, default_opset(eval_model))
    if not ort_loadable(eval_model) and versions not in _WARNED_VERSIONS:
        _WARNED_VERSIONS.add(versions)  # once per process: every builder model (opset 22) would repeat it
        warnings.warn(
            f"the models use IR version {versions[0]} / opset {versions[1]}: "
            f"onnxruntime(-training) 1.19.2 loads IR <= 10 / opset <= {ORT_MAX_OPSET} only "
            "(ort_torch_train's Module trains them; said once per process)",
            stacklevel=3,
        )

    optimizer_model = None
    if optimizer_block is not None:
        optimizer_model = build_optimizer_model(optimizer_block, (trainable, frozen), default_opset(base), names)
        read_optimizer_model(optimizer_model)  # the layout ORT and this project's Optimizer accept
    checkpoint = CheckpointRecord(
        trainable={p.name: _parameter(p, weights) for p in trainable},
        frozen={p.name: _parameter(p, weights) for p in frozen},
    )
    kept = {init.name for model in (training_model, eval_model) for init in model.graph.initializer}
    kept_weights = {name: tensor for name, tensor in weights.items() if name in kept}
    return Artifacts(training_model, eval_model, optimizer_model, checkpoint, kept_weights)


def _parameter(init: onnx.TensorProto, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    return weights[init.name] if is_external(init) else tensor_from_proto(init)


def nominal(record: CheckpointRecord) -> CheckpointRecord:
    """The nominal checkpoint of ``record``: same names and dtypes, no data."""

    def empty(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {name: torch.empty(0, dtype=tensor.dtype) for name, tensor in tensors.items()}

    return CheckpointRecord(trainable=empty(record.trainable), frozen=empty(record.frozen), is_nominal=True)


def _check_model(model: onnx.ModelProto, loss_block: Block) -> None:
    """The ONNX checker with full shape inference; ORT's ONNX-domain ops are checked in com.microsoft, and
    a rank that a value's declared shape and its inferred shape disagree on (which onnxruntime accepts,
    e.g. a ``[1]`` constant declared as a scalar) is a warning."""
    opsets = with_ort_domain(model.graph, list(model.opset_import))
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        if not _rank_mismatch_only(model, exc):
            raise ModelError(
                f"the base model plus the loss {type(loss_block).__name__} is not a valid ONNX model: {exc}"
            ) from exc
        warnings.warn(f"the model's declared and inferred ranks differ (onnxruntime accepts this): {exc}", stacklevel=4)


def _rank_mismatch_only(model: onnx.ModelProto, error: Exception) -> bool:
    """Whether ``error`` is a declared-vs-inferred rank difference and the model passes without shape inference."""
    if "rank" not in str(error).lower():
        return False
    try:
        onnx.checker.check_model(model)
    except Exception:
        return False
    return True


def _warn_running_statistics_stay(model: onnx.ModelProto) -> None:
    """A word for a model exported in training mode with BatchNorm: training normalises with batch
    statistics, but the running mean and variance that the eval and inference models use stay constants."""
    nodes = batch_statistics_nodes(model)
    if nodes:
        shown = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
        warnings.warn(
            f"generate_artifacts: {len(nodes)} BatchNormalization node(s) ({shown}) train on each batch's "
            "statistics, but their running mean and variance stay the exported values: the eval model and "
            "exported inference models normalise with those (docs/artifacts.md, 'torch.nn.Module input')",
            UserWarning,
            stacklevel=4,
        )
