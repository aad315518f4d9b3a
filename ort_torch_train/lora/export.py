"""Exports of models that may carry LoRA adapters: merged inference models (ORT's
``export_model_for_inferencing``; a model without adapters is exported as it is), an unmerged inference
model whose adapters are overridable initializers, and ``.onnx_adapter`` files
(``onnxruntime.AdapterFormat``) that ``LoraAdapter`` loads.

As onnxruntime-genai's builder: the adapter tensors are graph inputs named like the checkpoint's
adapters, A stored (in, r), B stored (r, out) with the scale alpha/r folded in, and no scale node.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import torch

from ort_torch_train.dtypes import onnx_elem_type
from ort_torch_train.errors import ModelError, NominalStateError
from ort_torch_train.export.external_data import write_model
from ort_torch_train.export.inference import inference_model, inference_model_and_weights, save_model
from ort_torch_train.fileio import default_file_mode, path_inside
from ort_torch_train.graph.layout import load_model
from ort_torch_train.lora.merge import merged_for_inference, stripped_model, uncast_parameters
from ort_torch_train.lora.record import LoraRecord, read_record
from ort_torch_train.state.training_state import TrainingState

ADAPTERS_KEY = "ort_torch_train.lora_adapters"
RANK_DIM = "lora_rank"
ADAPTER_DEFAULTS = ("empty", "trained")
ACCURACY_LEVELS = range(5)  # MatMulNBits: 0 unset, 1 float32, 2 float16, 3 bfloat16, 4 int8 activations


class LoraModule(Protocol):
    """What the exports read: a Module (or TrainingSession) whose eval model carries LoRA adapters."""

    @property
    def eval_model(self) -> onnx.ModelProto | None:
        """The eval model with its adapter branches."""
        ...

    @property
    def training_state(self) -> TrainingState:
        """The parameters, adapters included."""
        ...


def merged_model_and_weights(
    eval_model: onnx.ModelProto, params: Mapping[str, torch.Tensor], graph_output_names: Sequence[str]
) -> tuple[onnx.ModelProto, dict[str, torch.Tensor]]:
    """``inference_model_and_weights`` of ``eval_model`` with its LoRA adapters, if any, merged into
    their weights: ``W + (alpha/r) * A @ B``."""
    return inference_model_and_weights(*merged_for_inference(eval_model, params), graph_output_names)


def export_merged_model(
    eval_model: onnx.ModelProto | None,
    state: TrainingState,
    path: str | os.PathLike,
    graph_output_names: Sequence[str],
) -> None:
    """Write the inference model of ``eval_model`` with ``state``'s current parameters (adapters merged) to ``path``;
    a collective where processes hold parts of the parameters (sharded, pipelined): every rank calls it."""
    if eval_model is None:
        raise ModelError("Eval model was not provided. Cannot export a model for inferencing.")
    if state.is_nominal:
        raise NominalStateError("Cannot export a model with a nominal state. Please load the model parameters first.")
    with torch.no_grad():  # gathered whole where processes hold parts (shards, stages): every rank calls this
        whole = {name: state.whole_parameter(name) for name in state.params}
    model, weights = merged_model_and_weights(eval_model, whole, graph_output_names)
    write_model(model, path, weights)


def adapter_values(module: LoraModule) -> dict[str, torch.Tensor]:
    """The adapters as onnxruntime runs them: A as trained, B times alpha/r."""
    record = _record(module)
    params = module.training_state.params
    values = {}
    for target in record.targets:
        values[target.lora_a] = params[target.lora_a].detach().cpu()
        values[target.lora_b] = (params[target.lora_b].detach() * record.scaling).cpu()
    return values


def export_unmerged_model(
    module: LoraModule,
    path: str | os.PathLike,
    graph_output_names: Sequence[str],
    adapter_defaults: str = "empty",
    accuracy_level: int | None = None,
) -> None:
    """Write the inference model with the adapter tensors as overridable initializers.

    ``adapter_defaults="empty"`` (onnxruntime-genai's convention): rank-0 defaults, so the model
    alone is the base model and an active ``LoraAdapter`` supplies the adapters; ``"trained"``: the
    current adapters are the defaults. The rank dimension is symbolic (``lora_rank``).
    ``accuracy_level`` (0-4) replaces the ``accuracy_level`` of every com.microsoft MatMulNBits node; None
    keeps the model's.
    """
    if adapter_defaults not in ADAPTER_DEFAULTS:
        raise ValueError(f"adapter_defaults: expected one of {ADAPTER_DEFAULTS}, got {adapter_defaults!r}")
    if accuracy_level is not None and (isinstance(accuracy_level, bool) or accuracy_level not in ACCURACY_LEVELS):
        raise ValueError(f"accuracy_level: expected one of {list(ACCURACY_LEVELS)} or None, got {accuracy_level!r}")
    record = _record(module)
    assert module.eval_model is not None  # _record checked it
    model = stripped_model(module.eval_model, record, keep_adapters=True)
    params = uncast_parameters(module.training_state.params, record)
    trained = adapter_values(module)
    for target in record.targets:
        for name, shape in ((target.lora_a, (target.in_features, 0)), (target.lora_b, (0, target.out_features))):
            value = trained[name] if adapter_defaults == "trained" else torch.zeros(shape)
            params[name] = value.to(params[name].dtype)
    inference = inference_model(model, params, graph_output_names)
    declared = {}
    for target in record.targets:
        elem_type = onnx_elem_type(params[target.lora_a].dtype, target.lora_a)
        shapes: tuple[tuple[str, list[int | str]], ...] = (
            (target.lora_a, [target.in_features, RANK_DIM]),
            (target.lora_b, [RANK_DIM, target.out_features]),
        )
        for name, dims in shapes:
            inference.graph.input.append(onnx.helper.make_tensor_value_info(name, elem_type, dims))
            declared[name] = {"shape": [d if isinstance(d, int) else None for d in dims], "elem_type": elem_type}
    inference.metadata_props.add(key=ADAPTERS_KEY, value=json.dumps(declared))
    if accuracy_level is not None:
        _set_accuracy_level(inference.graph, accuracy_level)
    save_model(inference, path)


def _set_accuracy_level(graph: onnx.GraphProto, level: int) -> None:
    for node in graph.node:
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            kept = [attribute for attribute in node.attribute if attribute.name != "accuracy_level"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("accuracy_level", level)])


def export_adapter(
    module: LoraModule, path: str | os.PathLike, adapter_version: int = 1, model_version: int = 1
) -> None:
    """Write the module's adapters as an onnxruntime ``.onnx_adapter`` file (needs onnxruntime >= 1.20)."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ModuleNotFoundError(
            "export_adapter needs onnxruntime (>= 1.20, with AdapterFormat): pip install onnxruntime"
        ) from error
    if not hasattr(onnxruntime, "AdapterFormat"):
        raise ModuleNotFoundError(
            f"onnxruntime {onnxruntime.__version__} has no AdapterFormat: .onnx_adapter files need onnxruntime >= 1.20"
        )
    arrays = {name: _numpy(value) for name, value in adapter_values(module).items()}
    adapter = onnxruntime.AdapterFormat()
    adapter.set_adapter_version(adapter_version)
    adapter.set_model_version(model_version)
    adapter.set_parameters({name: onnxruntime.OrtValue.ortvalue_from_numpy(array) for name, array in arrays.items()})
    target = path_inside(Path(path).parent, Path(path).name, "adapter path")
    fd, staged = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        adapter.export_adapter(staged)
        os.chmod(staged, default_file_mode())  # mkstemp's 0600 would keep other accounts serving the folder out
        os.replace(staged, target)
    except BaseException:
        Path(staged).unlink(missing_ok=True)
        raise


def read_adapter(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of an ``.onnx_adapter`` file, by name."""
    try:
        import onnxruntime
    except ImportError as error:
        raise ModuleNotFoundError("reading .onnx_adapter files needs onnxruntime >= 1.20") from error
    if not Path(path).is_file():
        raise FileNotFoundError(f"adapter file not found: {os.fspath(path)!r}")
    try:
        parameters = onnxruntime.AdapterFormat.read_adapter(os.fspath(path)).get_parameters()
    except Exception as error:
        raise ModelError(f"{os.fspath(path)!r} is not a readable .onnx_adapter file: {error}") from error
    return {name: value.numpy() for name, value in parameters.items()}


def check_adapter(model: onnx.ModelProto | str | os.PathLike, adapter: str | os.PathLike) -> None:
    """Raise ModelError unless the adapter file's tensors are exactly the unmerged model's adapter inputs."""
    proto = load_model(model, "unmerged LoRA model") if not isinstance(model, onnx.ModelProto) else model
    text = next((prop.value for prop in proto.metadata_props if prop.key == ADAPTERS_KEY), None)
    if text is None:
        raise ModelError(
            "the model has no LoRA adapter inputs: apply .onnx_adapter files to the model written by "
            "export_unmerged_model (or `ort-torch-train export --unmerged`)"
        )
    expected = {name: info["shape"] for name, info in json.loads(text).items()}
    _check_tensors(expected, read_adapter(adapter), f"adapter file {os.fspath(adapter)!r}")


def load_adapter(module: LoraModule, path: str | os.PathLike) -> None:
    """Set the module's adapters from an ``.onnx_adapter`` file written for the same targets (each tensor of
    the module's full shape: its rank too)."""
    record = _record(module)
    tensors = read_adapter(path)
    params = module.training_state.params
    expected: dict[str, list[int | None]] = {
        name: list(params[name].shape) for target in record.targets for name in (target.lora_a, target.lora_b)
    }
    _check_tensors(expected, tensors, f"adapter file {os.fspath(path)!r}")
    for target in record.targets:
        a, b = (torch.from_numpy(tensors[name].copy()) for name in (target.lora_a, target.lora_b))
        with torch.no_grad():
            params[target.lora_a].copy_(a)
            params[target.lora_b].copy_(b / record.scaling)


def _check_tensors(expected: Mapping[str, list[int | None]], tensors: Mapping[str, Any], what: str) -> None:
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ModelError(
            f"{what} does not fit the model: missing adapter tensors {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''} "
            f"(the model expects {len(expected)}, the file holds {len(tensors)})"
        )
    for name, shape in expected.items():
        got = list(tensors[name].shape)
        if len(got) != len(shape) or any(want is not None and want != have for want, have in zip(shape, got)):
            raise ModelError(f"{what}: tensor {name!r} has shape {got}, the model expects {shape} (None: the rank)")


def _record(module: LoraModule) -> LoraRecord:
    eval_model = getattr(module, "eval_model", None)
    if eval_model is None:
        raise ModelError("LoRA export needs the eval model: construct the Module with eval_model_uri")
    record = read_record(eval_model)
    if record is None:
        raise ModelError(
            "the eval model has no LoRA adapters: make the artifacts with generate_artifacts(..., lora=LoraConfig(...)) "
            "or construct the Module with lora=LoraConfig(...)"
        )
    return record


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        raise ModelError(
            "bfloat16 adapters cannot be written as numpy arrays for AdapterFormat; train float32 adapters"
        )
    return np.ascontiguousarray(tensor.numpy())
