"""``onnxruntime.TrainingSession`` (the legacy training API of ORT 1.4-1.13) over the training engine.

A forward-only model whose loss is a graph output is trained in place: each ``run`` is one training
step (forward, backward, gradient accumulation) and, on every ``gradient_accumulation_steps``-th
step, the optimizer update with the learning rate fed under ``lr_params_feed_name``. As in ORT's
optimizer graph (``optimizer_graph_builder.cc``), accumulated gradients are scaled by
1/gradient_accumulation_steps before the update and zeroed after it.

``run_options`` follows what the legacy ORTTrainer drove the session with: ``only_execute_path_to_fetches``
runs the forward only (or also the backward and accumulation when ``Group_Accumulated_Gradients`` /
``global_gradient_norm`` is fetched, without an update); ``training_mode=False`` evaluates.
Difference from ORT: a plain ``run`` with gradient_accumulation_steps = N > 1 updates on every N-th
run only (ORT's graph updated at every plain run; ORTTrainer fetched the accumulation output on the
N-1 others, which gives the same result here).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import onnx
import torch

from ort_torch_train.api.ortvalue import numpy_to_tensor
from ort_torch_train.dtypes import ort_tensor_type, tensor_to_proto
from ort_torch_train.errors import CheckpointError, InputError, InputTypeError
from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.graph.layout import file_head, load_model
from ort_torch_train.graph.ort_format import is_ort_format
from ort_torch_train.legacy.distributed import legacy_distributed
from ort_torch_train.legacy.graph import build_training_setup
from ort_torch_train.legacy.metadata import ModelMetadata, NodeArg
from ort_torch_train.legacy.optimizers import LegacyOptimizer
from ort_torch_train.legacy.parameters import TrainingParameters, check_supported, recompute_plan
from ort_torch_train.legacy.pipeline import StageLegacyOptimizer, legacy_pipeline
from ort_torch_train.legacy.providers import choose_provider
from ort_torch_train.legacy.zero import build_legacy_optimizer
from ort_torch_train.optim.clip import global_norm
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.training.engine import TrainingEngine
from ort_torch_train.training.options import EngineOptions

GROUP_ACCUMULATED_GRADIENTS = "Group_Accumulated_Gradients"
GLOBAL_GRADIENT_NORM = "global_gradient_norm"
_GRADIENT_OUTPUTS = (GROUP_ACCUMULATED_GRADIENTS, GLOBAL_GRADIENT_NORM)


class TrainingSession:
    """Trains an ONNX model whose loss is one of its outputs, with ORT's legacy TrainingSession API.

    Args:
        path_or_bytes: path of an ONNX model, or its serialized bytes.
        parameters: a ``TrainingParameters`` (loss output, weights to train, optimizer, ...).
        sess_options: kept and returned by ``get_session_options()``; not otherwise used.
        providers, provider_options: ORT execution providers, mapped to a torch device
            (``CUDAExecutionProvider`` -> ``cuda:<device_id>``, ``CPUExecutionProvider`` -> ``cpu``).
    """

    def __init__(
        self,
        path_or_bytes: str | os.PathLike | bytes,
        parameters: TrainingParameters,
        sess_options: Any = None,
        providers: Sequence | None = None,
        provider_options: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        check_supported(parameters)
        self._forward_model = _load_forward_model(path_or_bytes)
        self._provider = choose_provider(providers, provider_options)
        self._sess_options = sess_options
        setup = build_training_setup(
            self._forward_model,
            parameters.loss_output_name,
            parameters.weights_to_train,
            parameters.weights_not_to_train,
            parameters.immutable_weights,
        )
        self.training_state = TrainingState(setup.params)
        pipeline = legacy_pipeline(parameters, self._provider.device)
        distributed = pipeline is None and legacy_distributed(parameters, self._provider.device)
        options = EngineOptions.of(
            device=self._provider.device,
            mixed_precision="fp16" if parameters.use_mixed_precision else None,
            loss_scale=parameters.loss_scale if parameters.use_mixed_precision else 0.0,
            recompute=recompute_plan(parameters),
            distributed=distributed,
            gradient_combination="adasum" if parameters.enable_adasum and distributed else "average",
            pipeline=pipeline,
            tensor_parallel_size=parameters.horizontal_parallel_size,
            sharding={2: "zero2", 3: "zero3"}.get(parameters.deepspeed_zero_stage) if distributed else None,
        )
        self._engine = TrainingEngine(setup.model, self.training_state, setup.model, options)
        self._reduce_once = parameters.allreduce_post_accumulation
        self._trained = setup.trained
        stage = self._engine.pipeline  # a pipeline stage updates the weights it holds
        held = self._trained if stage is None else [n for n in self._trained if n in stage.ownership.held]
        optimizer = build_legacy_optimizer(
            parameters, {n: self.training_state.params[n] for n in held}, self._engine.data_parallel
        )
        self._optimizer = (
            optimizer
            if stage is None or optimizer is None
            else StageLegacyOptimizer(cast("LegacyOptimizer", optimizer), self._trained, stage.group)
        )
        precision = self._engine.precision
        self._loss_scaler = precision.loss_scaler if precision is not None else None
        self._lr_name = parameters.lr_params_feed_name if self._optimizer is not None else None
        self._accumulation_steps = parameters.gradient_accumulation_steps
        self._accumulated = 0
        self._clip = parameters.enable_grad_norm_clip
        self._inputs = self._input_args()
        self._outputs = self._output_args()

    # ---- the step ---------------------------------------------------------------------------------
    def run(
        self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any], run_options: Any = None
    ) -> list[np.ndarray]:
        """One training step (or evaluation, see ``run_options``); returns the requested outputs."""
        names = list(output_names) if output_names else [arg.name for arg in self._outputs]
        known = {arg.name for arg in self._outputs}
        for name in names:
            if name not in known:
                raise InputError(f"Invalid Output Name:{name} (the outputs are {sorted(known)})")
        wants_gradients = any(name in _GRADIENT_OUTPUTS for name in names)
        evaluate = getattr(run_options, "training_mode", True) is False
        path_only = bool(getattr(run_options, "only_execute_path_to_fetches", False))
        if evaluate and wants_gradients:
            raise ValueError(
                f"run: {[n for n in names if n in _GRADIENT_OUTPUTS]} need gradients, which "
                "run_options.training_mode=False does not compute"
            )
        inputs, learning_rate = self._feeds(input_feed, needs_lr=not (evaluate or path_only))
        if evaluate or (path_only and not wants_gradients):
            results = self._forward(inputs, training=not evaluate)
        else:
            results = self._train_step(
                inputs, learning_rate, may_update=not path_only, wants_norm=GLOBAL_GRADIENT_NORM in names
            )
        return [results[name].detach().cpu().clone().numpy() for name in names]

    def _forward(self, inputs: list[torch.Tensor], training: bool) -> dict[str, torch.Tensor]:
        engine = self._engine
        if training:
            with torch.no_grad():
                outputs = engine.forward(inputs, training=True)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        else:
            outputs = engine.eval_step(inputs)
        return dict(zip(engine.output_names(training=True), outputs))

    def _train_step(
        self, inputs: list[torch.Tensor], learning_rate: float | None, may_update: bool, wants_norm: bool
    ) -> dict[str, torch.Tensor]:
        engine = self._engine
        if self._accumulation_steps == 1:
            engine.lazy_reset_grad()  # no accumulation buffer in ORT's graph: each run's gradient stands alone
        data_parallel = engine.data_parallel
        if data_parallel is not None and self._reduce_once and self._accumulated + 1 < self._accumulation_steps:
            with data_parallel.no_sync():  # allreduce_post_accumulation: reduce the accumulated gradients once
                outputs = engine.train_step(inputs)
        else:
            outputs = engine.train_step(inputs)
        results = dict(zip(engine.output_names(training=True), outputs))
        results[GROUP_ACCUMULATED_GRADIENTS] = torch.tensor(True)
        self._accumulated += 1
        params = self.training_state.params
        sharded = data_parallel is not None and data_parallel.shards_parameters
        grads = [grad for name in self._trained if (grad := params[name].grad) is not None]
        whole = None  # per gradient, held whole on every rank (tensor parallel's replicated ones)
        if sharded:  # the kernels and the norm run on this rank's shards
            from ort_torch_train.distributed.local_shards import local_shard

            whole = [local_shard(grad) is grad for grad in grads]
            whole = whole if any(whole) else None
            grads = [local_shard(grad) for grad in grads]
        group = data_parallel.shard_group if data_parallel is not None and sharded else None
        if engine.pipeline is not None:  # each stage holds its own weights' gradients
            group = engine.pipeline.group
        scale = to_float32(1.0 / self._accumulation_steps)
        optimizer = self._optimizer
        norm = None
        if may_update and optimizer is not None and self._accumulated >= self._accumulation_steps:
            if scale != 1.0:
                torch._foreach_mul_(grads, scale)
            finite = self._loss_scaler is None or self._loss_scaler.unscale_and_update(grads)
            if wants_norm or optimizer.clip_grad_norm:
                norm = global_norm(grads, group, whole)
            if finite:
                assert learning_rate is not None  # _feeds requires it whenever an update may run
                optimizer.step(learning_rate, norm)
            engine.lazy_reset_grad()
            self._accumulated = 0
        elif wants_norm:
            norm = global_norm(torch._foreach_mul(grads, scale), group, whole)
        if norm is not None:
            results[GLOBAL_GRADIENT_NORM] = norm
        return results

    def _feeds(self, input_feed: Mapping[str, Any], needs_lr: bool) -> tuple[list[torch.Tensor], float | None]:
        if not isinstance(input_feed, Mapping):
            raise InputTypeError(f"input_feed: expected a dict {{input name: value}}, got {type(input_feed).__name__}")
        user_inputs = self._engine.input_names(training=True)
        allowed = {*user_inputs, *([self._lr_name] if self._lr_name else [])}
        for name in input_feed:
            if name not in allowed:
                raise InputError(f"Invalid Feed Input Name:{name} (the inputs are {sorted(allowed)})")
        required = [*user_inputs, *([self._lr_name] if needs_lr and self._lr_name else [])]
        missing = [name for name in required if name not in input_feed]
        if missing:
            raise InputError(f"Missing Input: {missing[0]}")
        inputs = [_as_tensor(input_feed[name], name) for name in user_inputs]
        learning_rate = _learning_rate(input_feed[self._lr_name], self._lr_name) if needs_lr and self._lr_name else None
        return inputs, learning_rate

    # ---- metadata ---------------------------------------------------------------------------------
    def _input_args(self) -> list[NodeArg]:
        by_name = {value.name: value for value in self._forward_model.graph.input}
        args = [NodeArg.from_value_info(by_name[name]) for name in self._engine.input_names(training=True)]
        if self._lr_name:
            args.append(NodeArg(self._lr_name, "tensor(float)", [1]))
        return args

    def _output_args(self) -> list[NodeArg]:
        args = [NodeArg.from_value_info(value) for value in self._forward_model.graph.output]
        if self._optimizer is not None and self._accumulation_steps > 1:
            args.append(NodeArg(GROUP_ACCUMULATED_GRADIENTS, "tensor(bool)", []))
        if self._optimizer is not None and self._clip:
            args.append(NodeArg(GLOBAL_GRADIENT_NORM, "tensor(float)", []))
        return args

    def get_inputs(self) -> list[NodeArg]:
        """The feeds ``run`` takes: the model's inputs and, with an optimizer, the learning rate."""
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        """The outputs ``run`` can return: the model's, then ORT's training outputs."""
        return list(self._outputs)

    def get_modelmeta(self) -> ModelMetadata:
        """The model's metadata."""
        return ModelMetadata.from_model(self._forward_model)

    def get_providers(self) -> list[str]:
        """The execution providers in use (CPU last, as ORT reports them)."""
        return list(self._provider.providers)

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        """The options of each provider in use."""
        return {name: dict(options) for name, options in self._provider.options.items()}

    def get_session_options(self) -> Any:
        """The ``sess_options`` given to the constructor (None when none was)."""
        return self._sess_options

    def is_output_fp32_node(self, output_name: str) -> bool:
        """Whether ``output_name`` is a float32 output."""
        return any(arg.name == output_name and arg.type == "tensor(float)" for arg in self._outputs)

    # ---- state ------------------------------------------------------------------------------------
    def get_state(self) -> dict[str, np.ndarray]:
        """Trained weights and optimizer state (``Moment_1_<w>``, ``Moment_2_<w>``, ``Update_Count_<w>``),
        sorted by name, as copies."""
        tensors: dict[str, torch.Tensor] = {name: self.training_state.whole_parameter(name) for name in self._trained}
        if self._optimizer is not None:
            tensors.update(self._optimizer.state_tensors())
        return {name: _numpy(tensors[name]) for name in sorted(tensors)}

    def load_state(self, dict: Mapping[str, Any], strict: bool = False) -> None:  # noqa: A002 (ORT's name)
        """Copy state tensors in place; other names are ignored, or raise when ``strict``."""
        for name, value in dict.items():
            if name in self._trained:
                self.training_state.set_parameter_data(name, _as_tensor(value, name))
            elif self._optimizer is None or not self._optimizer.load_state_tensor(name, value):
                if strict:
                    raise CheckpointError(f"Checkpoint tensor: {name} is not a known state tensor.")

    def get_model_state(self, include_mixed_precision_weights: bool = False) -> dict[str, dict[str, np.ndarray]]:
        """``{"full_precision": {weight: value}}`` for the trained weights (plus an empty
        ``"mixed_precision"`` when asked: there are no fp16 copies here)."""
        state = {"full_precision": {name: _numpy(self.training_state.whole_parameter(name)) for name in self._trained}}
        if include_mixed_precision_weights:
            state["mixed_precision"] = {}
        return state

    def get_optimizer_state(self) -> dict[str, dict[str, np.ndarray]]:
        """``{weight: {"Moment_1": ..., "Moment_2": ..., "Update_Count": ...}}`` (empty for SGD)."""
        if self._optimizer is None:
            return {}
        return {
            weight: {key: _numpy(value) for key, value in values.items()}
            for weight, values in self._optimizer.optimizer_state().items()
        }

    def get_partition_info_map(self) -> dict[str, dict[str, list[int]]]:
        """Weight partitioning (ZeRO/Megatron): none here."""
        return {}

    def save_as_onnx(self, path: str | os.PathLike) -> None:
        """Write the model with its trained weights' current values in place of their initializers."""
        model = onnx.ModelProto()
        model.CopyFrom(self._forward_model)
        trained = set(self._trained)
        for init in model.graph.initializer:
            if init.name in trained:
                init.CopyFrom(tensor_to_proto(self.training_state.whole_parameter(init.name), init.name))
        atomic_write_bytes(path, model.SerializeToString())


def _load_forward_model(path_or_bytes: Any) -> onnx.ModelProto:
    """The forward ONNX model; an ORT-format model (by its name or its content) is refused: the legacy session
    builds its training graph from an ONNX model, as ORT's did."""
    if isinstance(path_or_bytes, (str, os.PathLike)):
        path = os.fspath(path_or_bytes)
        if path.endswith(".ort") or os.path.isfile(path) and is_ort_format(file_head(path)):
            raise NotImplementedError(f"{path!r}: ORT format models are not supported; give the ONNX model")
        return load_model(path_or_bytes, "model")
    if isinstance(path_or_bytes, bytes):
        if is_ort_format(path_or_bytes[:8]):
            raise NotImplementedError("the model bytes: ORT format models are not supported; give the ONNX model")
        return load_model(path_or_bytes, "model")
    raise TypeError(f"Unable to load from type '{type(path_or_bytes)}'")


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    return numpy_to_tensor(np.asarray(value), name)


def _learning_rate(value: Any, name: str) -> float:
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.dtype != np.float32:
        raise InputTypeError(
            f"Unexpected input data type for input {name!r}. Actual: "
            f"({_type_name(array.dtype)}), expected: (tensor(float))"
        )
    if array.size != 1:
        raise InputError(f"input {name!r} (the learning rate): expected float[1], got shape {list(array.shape)}")
    learning_rate = float(array.reshape(()))
    if not np.isfinite(learning_rate):
        raise ValueError(f"input {name!r}: the learning rate must be finite, got {learning_rate}")
    return learning_rate


def _type_name(dtype: np.dtype) -> str:
    try:
        return ort_tensor_type(onnx.helper.np_dtype_to_tensor_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return str(dtype)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().clone().numpy()
