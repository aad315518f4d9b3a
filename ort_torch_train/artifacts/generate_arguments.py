"""The arguments of ``generate_artifacts`` made into what it builds from: the ONNX base model and its weights,
the loss and optimizer blocks, the loss's inputs and the graph outputs; a clear error for each bad argument."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from ort_torch_train.artifacts.blocks import Block, PassThrough
from ort_torch_train.artifacts.external import detach_weights, light_model_from_file, require_inline
from ort_torch_train.artifacts.losses import LOSS_BLOCKS, LossType
from ort_torch_train.artifacts.optimizers import OPTIMIZER_BLOCKS, OptimType
from ort_torch_train.errors import ModelError


def base_model(
    model: onnx.ModelProto | str | os.PathLike | torch.nn.Module,
    extra_options: dict[str, Any],
    scratch: Path,
    threshold: int,
) -> tuple[onnx.ModelProto, dict[str, torch.Tensor], tuple[list[str], list[str]] | None]:
    """The ONNX base model (light past ``threshold``), its external weights, and a torch module's split."""
    if isinstance(model, torch.nn.Module):
        from ort_torch_train.artifacts.torch_export import export_module  # loads Dynamo: only for a torch module

        exported = export_module(model, extra_options, scratch / "base.onnx")
        base, weights = light_model_from_file(scratch / "base.onnx")
        light, inline = detach_weights(base, threshold)
        return light, {**weights, **inline}, (exported.requires_grad, exported.frozen_params)
    if extra_options:
        raise TypeError(
            f"generate_artifacts() got unexpected keyword argument(s) {sorted(extra_options)} "
            "(export options apply to a torch.nn.Module only)"
        )
    if isinstance(model, onnx.ModelProto):
        require_inline(model)
        light, weights = detach_weights(model, threshold)
        return light, weights, None
    if isinstance(model, (str, os.PathLike)):
        base, weights = light_model_from_file(Path(os.fspath(model)))
        light, inline = detach_weights(base, threshold)
        return light, {**weights, **inline}, None
    raise TypeError(
        f"model must be an onnx.ModelProto, a path to an ONNX file or a torch.nn.Module with "
        f"example_inputs=; got {type(model).__name__}"
    )


def loss_block_of(loss: LossType | Block | None) -> Block:
    if loss is None:
        return PassThrough()
    if isinstance(loss, LossType):
        return LOSS_BLOCKS[loss]()
    if isinstance(loss, Block):
        return loss
    raise ModelError(
        f"Unknown loss provided {type(loss).__name__} ({loss!r}). Expected loss to be one of "
        f"{[t.name for t in LossType]} (ort_torch_train.artifacts.LossType) or an "
        "ort_torch_train.artifacts.Block."
    )


KV_CACHE_OUTPUT_PREFIX = "present"


def loss_inputs(base: onnx.ModelProto, loss: Block, names: Sequence[str] | None) -> Sequence[str] | None:
    """The loss's inputs: ``names``, or by default the model's one output that is not a ``present*`` key/value
    cache output (an LLM's logits); a clear error when the cache outputs leave more than one."""
    if names is not None or isinstance(loss, PassThrough):
        return names
    outputs = [value.name for value in base.graph.output]
    cache = [name for name in outputs if name.startswith(KV_CACHE_OUTPUT_PREFIX)]
    rest = [name for name in outputs if not name.startswith(KV_CACHE_OUTPUT_PREFIX)]
    if not cache:
        return None
    if len(rest) != 1:
        raise ModelError(
            f"the model's outputs {outputs} include {len(cache)} present key/value outputs and {len(rest)} others: "
            "name the output(s) the loss reads with loss_input_names=[...]"
        )
    return rest


def optimizer_block_of(optimizer: OptimType | Block | None) -> Block | None:
    if optimizer is None or isinstance(optimizer, Block):
        return optimizer
    if isinstance(optimizer, OptimType):
        return OPTIMIZER_BLOCKS[optimizer]()
    raise TypeError(
        f"Unknown optimizer provided {type(optimizer).__name__} ({optimizer!r}). Expected optimizer to "
        f"be one of {[t.name for t in OptimType]} (ort_torch_train.artifacts.OptimType) or an "
        "ort_torch_train.artifacts.Block."
    )


def graph_outputs(loss_output: str | Sequence[str], additional_output_names: Sequence[str] | None) -> list[str]:
    names = [loss_output] if isinstance(loss_output, str) else list(loss_output)
    names += list(additional_output_names or [])
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ModelError(
            f"graph outputs would repeat {duplicated}: the outputs are the loss output(s) then "
            f"additional_output_names, {names}"
        )
    return names
