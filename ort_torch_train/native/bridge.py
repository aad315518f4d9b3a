"""What libort_torch_train calls: the ``OrtTrainingApi`` functions on the plain values the C side holds.

The C library keeps the objects made here (a ``CheckpointState``, a ``TrainingSession``) behind its handles,
passes ONNX Runtime's tensors as ``(memory, element type, shape, device)`` specs whose memory is a
memoryview over the OrtValue's own buffer (wrapped, not copied), and copies each returned tensor into an
OrtValue from ONNX Runtime's allocator. Exceptions propagate; ``error_status`` gives the C side the
status code and message for one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import torch

from ort_torch_train.api import CheckpointState
from ort_torch_train.dtypes import ONNX_TO_TORCH, TORCH_TO_ONNX, elem_type_name
from ort_torch_train.errors import (
    CheckpointError,
    InputError,
    InputTypeError,
    ModelError,
    NominalStateError,
    UnsupportedOperatorError,
)
from ort_torch_train.native.custom_ops import Compute, CreateKernel, CustomOpLibrary, RegisteredOp
from ort_torch_train.session import TrainingSession, load_checkpoint_from_buffer, set_seed
from ort_torch_train.training.threads import threads_setting

TensorSpec = tuple[memoryview | int, int, tuple[int, ...], str]
"""(memory, ONNX element type, shape, device): memory is a memoryview on the CPU, an address on CUDA."""
TensorOut = tuple[torch.Tensor, int, int, int, tuple[int, ...]]
"""(contiguous CPU tensor, address of its data, bytes, ONNX element type, shape): what the C side copies."""

_LOGGER = logging.getLogger("ort_torch_train.native")

# ORT's status codes (onnxruntime_c_api.h, OrtErrorCode)
ORT_FAIL = 1
ORT_INVALID_ARGUMENT = 2
ORT_NO_SUCHFILE = 3
ORT_RUNTIME_EXCEPTION = 6
ORT_NOT_IMPLEMENTED = 9
ORT_EP_FAIL = 11

_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (FileNotFoundError, ORT_NO_SUCHFILE),
    (UnsupportedOperatorError, ORT_NOT_IMPLEMENTED),
    (NotImplementedError, ORT_NOT_IMPLEMENTED),
    (CheckpointError, ORT_FAIL),  # ORT: "checkpoint is invalid" from ORT_RETURN_IF_NOT
    (NominalStateError, ORT_FAIL),
    (ModelError, ORT_FAIL),  # a missing eval or optimizer model
    (InputError, ORT_INVALID_ARGUMENT),
    (InputTypeError, ORT_INVALID_ARGUMENT),
    (KeyError, ORT_INVALID_ARGUMENT),
    (IndexError, ORT_INVALID_ARGUMENT),
    (TypeError, ORT_INVALID_ARGUMENT),
    (ValueError, ORT_INVALID_ARGUMENT),
    (OSError, ORT_FAIL),
)


def error_status(error: BaseException) -> tuple[int, str]:
    """The OrtErrorCode and message for an exception raised by one of this module's functions."""
    _LOGGER.debug("native call failed", exc_info=error)
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    if isinstance(error, torch.cuda.OutOfMemoryError) or "CUDA" in text and isinstance(error, RuntimeError):
        return ORT_EP_FAIL, text or type(error).__name__
    for kind, code in _CODES:
        if isinstance(error, kind):
            return code, text or type(error).__name__
    return ORT_RUNTIME_EXCEPTION, f"{type(error).__name__}: {text}" if text else type(error).__name__


# tensors -------------------------------------------------------------------------------------------
def tensor_in(spec: TensorSpec, what: str | int) -> torch.Tensor:
    """A torch tensor over an OrtValue's memory (no copy); ``what`` names it in errors (an int: ``inputs[i]``)."""
    memory, elem_type, shape, device = spec
    dtype = ONNX_TO_TORCH.get(elem_type)
    if dtype is None:
        name = f"inputs[{what}]" if isinstance(what, int) else what
        raise InputTypeError(f"{name}: element type {elem_type_name(elem_type)} is not supported by ort-torch-train")
    if device != "cpu":
        return _cuda_tensor(int(memory), dtype, shape, device)
    if 0 in shape:
        return torch.empty(shape, dtype=dtype)
    assert isinstance(memory, memoryview)  # on the CPU the C side passes the OrtValue's memory
    numpy_dtype = _NUMPY_DTYPES.get(elem_type)
    if numpy_dtype is None:  # bfloat16: no numpy dtype
        return torch.frombuffer(memory, dtype=dtype).view(shape)
    return torch.from_numpy(np.frombuffer(memory, dtype=numpy_dtype).reshape(shape))  # the cheaper wrap


_NUMPY_DTYPES: dict[int, np.dtype] = {
    code: torch.empty(0, dtype=dtype).numpy().dtype for code, dtype in ONNX_TO_TORCH.items() if dtype != torch.bfloat16
}


class _CudaMemory:
    """An object exposing ``__cuda_array_interface__`` for memory that an OrtValue holds on a CUDA device."""

    def __init__(self, address: int, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        typestr = np.dtype(torch.empty(0, dtype=dtype).numpy().dtype).str
        self.__cuda_array_interface__ = {"data": (address, False), "shape": shape, "typestr": typestr, "version": 3}


def _cuda_tensor(address: int, dtype: torch.dtype, shape: tuple[int, ...], device: str) -> torch.Tensor:
    return torch.as_tensor(_CudaMemory(address, dtype, shape), device=device)


def tensor_out(tensor: torch.Tensor) -> TensorOut:
    """What the C side copies into an OrtValue: a contiguous host tensor, its address, size, type and shape."""
    host = tensor if tensor.device.type == "cpu" else tensor.detach().cpu()
    if not host.is_contiguous():
        host = host.contiguous()
    elem_type = TORCH_TO_ONNX.get(host.dtype)
    if elem_type is None:
        raise InputTypeError(f"output of dtype {host.dtype} has no ONNX element type")
    return host, host.data_ptr(), host.nbytes, elem_type, tuple(host.shape)


def _naming(argument: str, error: ValueError | TypeError) -> InputError | InputTypeError:
    """A bad-input error whose message starts with the C API's name of the argument."""
    kind = InputTypeError if isinstance(error, TypeError) else InputError
    return kind(f"{argument}: {error}")


def _inputs(specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    return [tensor_in(spec, position) for position, spec in enumerate(specs)]


# checkpoint state ------------------------------------------------------------------------------------
def load_checkpoint(path: str) -> CheckpointState:
    """``LoadCheckpoint``."""
    return CheckpointState.load_checkpoint(path)


def load_checkpoint_buffer(buffer: memoryview) -> CheckpointState:
    """``LoadCheckpointFromBuffer`` (the bytes are copied: the caller may free its buffer)."""
    return load_checkpoint_from_buffer(bytes(buffer))


def save_checkpoint(state: CheckpointState, path: str, include_optimizer_state: bool) -> None:
    """``SaveCheckpoint``."""
    CheckpointState.save_checkpoint(state, path, include_optimizer_state)


def add_property(state: CheckpointState, name: str, value: int | float | str) -> None:
    """``AddProperty``."""
    state.properties[name] = value


def get_property(state: CheckpointState, name: str) -> int | float | str:
    """``GetProperty``: the value; the C side tells its type from the Python type."""
    return state.properties[name]


def parameter_type_and_shape(state: CheckpointState, name: str) -> tuple[int, tuple[int, ...]]:
    """``GetParameterTypeAndShape``: (ONNX element type, shape)."""
    param = state.training_state.parameter(name)
    return TORCH_TO_ONNX[param.dtype], tuple(param.shape)


def update_parameter(state: CheckpointState, name: str, spec: TensorSpec) -> None:
    """``UpdateParameter``: shape and type are checked against the parameter's."""
    try:
        state.parameters[name] = tensor_in(spec, f"parameter {name!r}").cpu().numpy()
    except (ValueError, TypeError) as error:
        raise _naming("parameter", error) from error


def get_parameter(state: CheckpointState, name: str) -> TensorOut:
    """``GetParameter``."""
    return tensor_out(state.training_state.parameter(name))


# session -------------------------------------------------------------------------------------------
def create_session(
    state: CheckpointState,
    train_model: str | bytes,
    eval_model: str | bytes | None,
    optimizer_model: str | bytes | None,
    device: str,
    compile: str,
    custom_ops: Sequence[RegisteredOp] = (),
    kernel_functions: tuple[CreateKernel, Compute] | None = None,
) -> TrainingSession:
    """``CreateTrainingSession`` / ``...FromBuffer``; device, compile and the custom ops registered on them
    (with the C side's functions that run one) come from the session options. The first one logs the thread
    policy in effect (info: ``ORT_TORCH_TRAIN_LOG=info``)."""
    threads_setting()
    library = CustomOpLibrary(custom_ops, *kernel_functions) if custom_ops and kernel_functions else None
    return TrainingSession(
        state,
        train_model,
        eval_model,
        optimizer_model,
        device=device or "cpu",
        compile=compile_setting(compile),
        custom_ops=library,
    )


def compile_setting(text: str) -> bool | str:
    """The ``ort_torch_train.compile`` session option as ``Module``'s ``compile``."""
    value = text.strip().lower()
    if value in ("", "0", "false", "off", "no"):
        return False
    if value in ("1", "true", "on", "yes", "default"):
        return True
    return text.strip()


def io_count(session: TrainingSession, training: bool, inputs: bool) -> int:
    """The number of user inputs or outputs of the training or eval model."""
    return len(session.input_names(training) if inputs else session.output_names(training))


def io_name(session: TrainingSession, training: bool, inputs: bool, index: int) -> str:
    """The name of a user input or output of the training or eval model."""
    if inputs:
        return session.training_model_input_name(index) if training else session.eval_model_input_name(index)
    return session.training_model_output_name(index) if training else session.eval_model_output_name(index)


def train_step(session: TrainingSession, specs: Sequence[TensorSpec]) -> list[TensorOut]:
    """``TrainStep``: the engine's step itself (it checks the inputs), as the Python API's call runs it."""
    return [tensor_out(output) for output in session.module.train_step(_inputs(specs))]


def eval_step(session: TrainingSession, specs: Sequence[TensorSpec]) -> list[TensorOut]:
    """``EvalStep``."""
    return [tensor_out(output) for output in session.eval_step(_inputs(specs))]


def lazy_reset_grad(session: TrainingSession) -> None:
    """``LazyResetGrad``."""
    session.lazy_reset_grad()


def optimizer_step(session: TrainingSession) -> None:
    """``OptimizerStep``."""
    session.optimizer_step()


def set_learning_rate(session: TrainingSession, learning_rate: float) -> None:
    """``SetLearningRate``."""
    session.set_learning_rate(learning_rate)


def get_learning_rate(session: TrainingSession) -> float:
    """``GetLearningRate``."""
    return session.get_learning_rate()


def register_linear_lr_scheduler(session: TrainingSession, warmup: int, total: int, initial_lr: float) -> None:
    """``RegisterLinearLRScheduler``."""
    session.register_linear_lr_scheduler(warmup, total, initial_lr)


def scheduler_step(session: TrainingSession) -> None:
    """``SchedulerStep``."""
    session.scheduler_step()


def parameters_size(session: TrainingSession, trainable_only: bool) -> int:
    """``GetParametersSize``."""
    return session.get_parameters_size(trainable_only)


def copy_parameters_to_buffer(session: TrainingSession, spec: TensorSpec, trainable_only: bool) -> None:
    """``CopyParametersToBuffer``: into the caller's float32 OrtValue of exactly the parameters' size."""
    target = tensor_in(spec, "parameters_buffer")
    source = session.copy_parameters_to_buffer(trainable_only).tensor
    if target.dtype != source.dtype or target.numel() != source.numel():
        raise InputError(
            f"parameters_buffer: expected {source.numel()} elements of type "
            f"{elem_type_name(TORCH_TO_ONNX[source.dtype])}, got {target.numel()} of type {elem_type_name(spec[1])}"
        )
    target.view(-1).copy_(source.view(-1))


def copy_buffer_to_parameters(session: TrainingSession, spec: TensorSpec, trainable_only: bool) -> None:
    """``CopyBufferToParameters`` (completes a nominal checkpoint)."""
    try:
        session.copy_buffer_to_parameters(tensor_in(spec, "parameters_buffer").view(-1), trainable_only)
    except (ValueError, TypeError) as error:
        raise _naming("parameters_buffer", error) from error


def export_model(session: TrainingSession, path: str, graph_output_names: list[str]) -> None:
    """``ExportModelForInferencing``."""
    session.export_model_for_inferencing(path, graph_output_names)


def seed(value: int) -> None:
    """``SetSeed``."""
    set_seed(value)
