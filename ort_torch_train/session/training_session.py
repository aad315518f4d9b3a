"""``TrainingSession``: the ``Ort::TrainingSession`` / ``OrtTrainingApi`` surface, in Python.

A thin face over the same core as ``ort_torch_train.api``: a Module (the engine) and an
Optimizer sharing one CheckpointState. Methods are snake_case; the C++ CamelCase names are aliases.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, TypeGuard

import numpy as np
import torch

from ort_torch_train.adapters import OpLibrary
from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from ort_torch_train.api.ortvalue import OrtValue, from_tensors, to_tensors
from ort_torch_train.errors import InputError, ModelError
from ort_torch_train.graph.layout import ModelSource, load_model


class TrainingSession:
    """Train, evaluate, update and export, given a checkpoint state and the artifact models.

    Models are paths or serialized bytes (``TrainingSession(state, train, eval, optimizer)``).

    Args:
        checkpoint_state: the state it trains.
        train_model: the training model (path or bytes).
        eval_model: the eval model (optional).
        optimizer_model: the optimizer model (optional).
        device: where parameters and steps live.
        session_options: ORT's SessionOptions, accepted and not used.
        compile: ``Module``'s (False, True, a torch.compile mode or a dict of its arguments).
        custom_ops: ``Module``'s (operators of the session's own, as a registered custom-op library gives).

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.session import TrainingSession, load_checkpoint

        state = load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        session = TrainingSession(
            state, "artifacts/training_model.onnx", "artifacts/eval_model.onnx", "artifacts/optimizer_model.onnx"
        )
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)
        session.register_linear_lr_scheduler(2, 10, 1e-3)
        for step in range(10):
            loss = session.train_step([x, y])[0]
            session.optimizer_step()
            session.scheduler_step()
            session.lazy_reset_grad()
        eval_loss = session.eval_step([x, y])[0]
        ```
    """

    def __init__(
        self,
        checkpoint_state: CheckpointState,
        train_model: ModelSource,
        eval_model: ModelSource | None = None,
        optimizer_model: ModelSource | None = None,
        *,
        device: str = "cpu",
        session_options: Any = None,
        compile: bool | str | dict = False,
        custom_ops: OpLibrary | None = None,
    ) -> None:
        self.checkpoint_state = checkpoint_state
        evaluation = load_model(eval_model, "eval model") if _given(eval_model) else None
        self.module = Module(
            load_model(train_model, "training model"),
            checkpoint_state,
            evaluation,
            device,
            session_options,
            compile=compile,
            custom_ops=custom_ops,
        )
        self.optimizer = Optimizer(optimizer_model, self.module) if _given(optimizer_model) else None
        self.scheduler: LinearLRScheduler | None = None

    # steps -----------------------------------------------------------------------------------
    def train_step(self, input_values: Sequence[Any]) -> list[Any]:
        """Forward and backward on the training model; returns its user outputs."""
        tensors, kind = to_tensors(list(input_values), self.module.input_names(training=True))
        return _as_list(from_tensors(self.module.train_step(tensors), kind))

    def eval_step(self, input_values: Sequence[Any]) -> list[Any]:
        """The eval model's user outputs."""
        tensors, kind = to_tensors(list(input_values), self._eval_input_names())
        return _as_list(from_tensors(self.module.eval_step(tensors), kind))

    def lazy_reset_grad(self) -> None:
        """The next train step overwrites the gradients instead of adding to them."""
        self.module.lazy_reset_grad()

    def optimizer_step(self) -> None:
        """Update the trainable parameters with the optimizer model."""
        self._require_optimizer().step()

    def set_learning_rate(self, learning_rate: float) -> None:
        """``SetLearningRate``: the optimizer's learning rate from now on."""
        self._require_optimizer().set_learning_rate(learning_rate)

    def get_learning_rate(self) -> float:
        """``GetLearningRate``: the optimizer's current learning rate."""
        return self._require_optimizer().get_learning_rate()

    def register_linear_lr_scheduler(self, warmup_step_count: int, total_step_count: int, initial_lr: float) -> None:
        """Linear warmup then linear decay to 0 (ORT's documented formula), applied at once."""
        self.scheduler = LinearLRScheduler(self._require_optimizer(), warmup_step_count, total_step_count, initial_lr)

    def scheduler_step(self) -> None:
        """``SchedulerStep``: advance the registered learning-rate scheduler by one step."""
        if self.scheduler is None:
            raise ModelError("No learning rate scheduler was registered (register_linear_lr_scheduler).")
        self.scheduler.step()

    def _require_optimizer(self) -> Optimizer:
        if self.optimizer is None:
            raise ModelError("Optimizer model was not provided: this session cannot update parameters.")
        return self.optimizer

    # export and model IO ----------------------------------------------------------------------
    def export_model_for_inferencing(
        self, inference_model_path: str | os.PathLike, graph_output_names: Sequence[str]
    ) -> None:
        """Write the eval model, cut to ``graph_output_names``, with the current parameters baked in."""
        self.module.export_model_for_inferencing(inference_model_path, list(graph_output_names))

    def input_names(self, training: bool) -> list[str]:
        """``InputNames``: user input names of the training (True) or eval (False) model."""
        return self.module.input_names(training=True) if training else self._eval_input_names()

    def output_names(self, training: bool) -> list[str]:
        """``OutputNames``: user output names of the training (True) or eval (False) model."""
        return self.module.output_names(training=True) if training else self._eval_output_names()

    def training_model_input_count(self) -> int:
        """``TrainingSessionGetTrainingModelInputCount``."""
        return len(self.input_names(True))

    def eval_model_input_count(self) -> int:
        """``TrainingSessionGetEvalModelInputCount``."""
        return len(self.input_names(False))

    def training_model_output_count(self) -> int:
        """``TrainingSessionGetTrainingModelOutputCount``."""
        return len(self.output_names(True))

    def eval_model_output_count(self) -> int:
        """``TrainingSessionGetEvalModelOutputCount``."""
        return len(self.output_names(False))

    def training_model_input_name(self, index: int) -> str:
        """``TrainingSessionGetTrainingModelInputName``: the name at ``index``."""
        return _at(self.input_names(True), index, "training model input")

    def eval_model_input_name(self, index: int) -> str:
        """``TrainingSessionGetEvalModelInputName``: the name at ``index``."""
        return _at(self.input_names(False), index, "eval model input")

    def training_model_output_name(self, index: int) -> str:
        """``TrainingSessionGetTrainingModelOutputName``: the name at ``index``."""
        return _at(self.output_names(True), index, "training model output")

    def eval_model_output_name(self, index: int) -> str:
        """``TrainingSessionGetEvalModelOutputName``: the name at ``index``."""
        return _at(self.output_names(False), index, "eval model output")

    def _eval_input_names(self) -> list[str]:
        return self.module.input_names(training=False) if self.module.eval_model is not None else []

    def _eval_output_names(self) -> list[str]:
        return self.module.output_names(training=False) if self.module.eval_model is not None else []

    # parameters -------------------------------------------------------------------------------
    def get_parameters_size(self, trainable_only: bool = True) -> int:
        """``GetParametersSize``: parameter elements (trainable ones only by default)."""
        return self.module.get_parameters_size(trainable_only)

    def copy_parameters_to_buffer(self, trainable_only: bool = True) -> OrtValue:
        """A flat float32 copy of the parameters (training-graph order)."""
        return self.module.get_contiguous_parameters(trainable_only)

    def copy_buffer_to_parameters(self, buffer: Any, trainable_only: bool = True) -> None:
        """``CopyBufferToParameters``: copy a flat buffer into the parameters."""
        self.module.copy_buffer_to_parameters(buffer, trainable_only)

    def to_buffer(self, only_trainable: bool) -> OrtValue:
        """The C++ ``ToBuffer``."""
        return self.copy_parameters_to_buffer(only_trainable)

    def from_buffer(self, buffer: Any) -> None:
        """The C++ ``FromBuffer``: the buffer's size decides trainable-only or all parameters."""
        size = _buffer_size(buffer)
        full = self.get_parameters_size(False)
        trainable = self.get_parameters_size(True)
        if self.checkpoint_state.training_state.is_nominal and size == full:
            self.copy_buffer_to_parameters(buffer, trainable_only=False)
        elif size == trainable:
            self.copy_buffer_to_parameters(buffer, trainable_only=True)
        elif size == full:
            self.copy_buffer_to_parameters(buffer, trainable_only=False)
        else:
            raise InputError(
                f"Incorrect buffer size received. Expected {trainable} (trainable) or {full} (all), got {size}."
            )

    # checkpoint state -------------------------------------------------------------------------
    def add_property(self, name: str, value: int | float | str) -> None:
        """``AddProperty``: store a property in the checkpoint state."""
        self.checkpoint_state.properties[name] = value

    def get_property(self, name: str) -> int | float | str:
        """``GetProperty``: a property of the checkpoint state."""
        return self.checkpoint_state.properties[name]

    def get_parameter_type_and_shape(self, name: str) -> tuple[np.dtype, list[int]]:
        """Element type and shape of parameter ``name``."""
        param = self.checkpoint_state.training_state.parameter(name)
        return torch.empty(0, dtype=param.dtype).numpy().dtype, list(param.shape)

    def update_parameter(self, name: str, value: Any) -> None:
        """Overwrite parameter ``name`` (shape and type checked)."""
        self.checkpoint_state.parameters[name] = value.numpy() if isinstance(value, OrtValue) else value

    def get_parameter(self, name: str) -> OrtValue:
        """A copy of parameter ``name``."""
        return OrtValue(self.checkpoint_state.training_state.parameter(name).detach().clone())

    # C++ names ------------------------------------------------------------------------------------
    TrainStep = train_step
    EvalStep = eval_step
    LazyResetGrad = lazy_reset_grad
    OptimizerStep = optimizer_step
    SetLearningRate = set_learning_rate
    GetLearningRate = get_learning_rate
    RegisterLinearLRScheduler = register_linear_lr_scheduler
    SchedulerStep = scheduler_step
    ExportModelForInferencing = export_model_for_inferencing
    InputNames = input_names
    OutputNames = output_names
    ToBuffer = to_buffer
    FromBuffer = from_buffer
    GetParametersSize = get_parameters_size
    CopyParametersToBuffer = copy_parameters_to_buffer
    CopyBufferToParameters = copy_buffer_to_parameters
    AddProperty = add_property
    GetProperty = get_property
    GetParameterTypeAndShape = get_parameter_type_and_shape
    UpdateParameter = update_parameter
    GetParameter = get_parameter


def _given(model: ModelSource | None) -> TypeGuard[ModelSource]:
    return model is not None and not (isinstance(model, (bytes, bytearray)) and len(model) == 0)


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def _at(names: list[str], index: int, what: str) -> str:
    if not 0 <= index < len(names):
        raise IndexError(f"{what} index {index} out of range: the model has {len(names)}")
    return names[index]


def _buffer_size(buffer: Any) -> int:
    if isinstance(buffer, OrtValue):
        return buffer.tensor.numel()
    if isinstance(buffer, (np.ndarray, torch.Tensor)):
        return int(buffer.size if isinstance(buffer, np.ndarray) else buffer.numel())
    raise InputError(f"buffer: expected an OrtValue, numpy array or tensor, got {type(buffer).__name__}")
