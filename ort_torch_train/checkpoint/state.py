"""TrainingState: the torch tensors of a training run, loaded from and saved to ORT checkpoints.

The state owns the parameters as ``nn.Parameter`` objects (the Module binds them without copying),
their gradients (a zero ``.grad`` on every trainable parameter of a loaded state, ``None`` on frozen
ones), the optimizer's moments and the user's properties. Every update happens in place, so the
objects others hold stay valid.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from ort_torch_train.dtypes import dtype_name

from ..errors import CheckpointError, NominalStateError, ParameterDataError, PropertyError, SafetensorsError
from .odtc import checkpoint_to_bytes, read_checkpoint, write_checkpoint
from .records import CheckpointRecord, OptimizerGroupRecord
from .safetensors import load_safetensors, save_safetensors
from .state_lock import StateLock

if TYPE_CHECKING:
    from ort_torch_train.training.flat_params import FlatState

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass
class OptimizerState:
    """The one optimizer group ORT supports: step count, initial learning rate and moments."""

    group_name: str = "group0"
    step: int = 0
    initial_learning_rate: float = 0.001
    # param name -> {"momentum0": tensor, "momentum1": tensor}
    momentums: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


log = logging.getLogger(__name__)


class SaveCoordinator(Protocol):
    """Writes a state's checkpoint when several processes share it (e.g. once, from rank 0 of a
    data-parallel run); every process calls ``save``."""

    def save(self, state: TrainingState, path: str | os.PathLike, include_optimizer_state: bool) -> None:
        """Write ``state`` to ``path`` (``include_optimizer_state`` as in ``TrainingState.save``)."""
        ...


def _source_text(source: str | os.PathLike | bytes | bytearray | memoryview) -> str:
    return f"({len(source)} bytes)" if isinstance(source, (bytes, bytearray, memoryview)) else repr(os.fspath(source))


def normalize_property(name: str, value: object) -> int | float | str:
    """The value as ORT stores it: int (int64 range), float (rounded to float32) or str."""
    if not isinstance(name, str):
        raise PropertyError(f"Property names must be str, got {type(name).__name__} {name!r}")
    _require_utf8(name, f"Property name {name!r}")
    if isinstance(value, bool | np.bool_):
        raise PropertyError(f"Property {name!r} value is a bool; properties hold int, float or str")
    if isinstance(value, str):
        _require_utf8(value, f"Property {name!r} value")
        return value
    if isinstance(value, int | np.integer):
        if not INT64_MIN <= int(value) <= INT64_MAX:
            raise PropertyError(f"Property {name!r} value {int(value)} does not fit in int64")
        return int(value)
    if isinstance(value, float | np.floating):
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise PropertyError(f"Property {name!r} value {float(value)} does not fit in float32")
        return float(np.float32(value))
    raise PropertyError(f"Property {name!r} value has type {type(value).__name__}; properties hold int, float or str")


def _require_utf8(text: str, what: str) -> None:
    """Refuse text that cannot be written as UTF-8 (a lone surrogate would break every later save)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise PropertyError(
            f"{what} cannot be stored: it is not valid Unicode text ({error.reason} at position {error.start})"
        ) from None


def _shape_text(shape: torch.Size | tuple[int, ...]) -> str:
    return "{" + ",".join(str(dim) for dim in shape) + "}"


def _as_tensor(name: str, value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray | np.generic):
        try:
            return torch.as_tensor(np.asarray(value))
        except TypeError:
            raise TypeError(
                f"Parameter {name} data has numpy dtype {value.dtype}, which no torch tensor can hold"
            ) from None
    raise TypeError(f"Parameter {name} data must be a numpy.ndarray or torch.Tensor, got {type(value).__name__}")


def _check_dtype(name: str, expected: torch.dtype, got: torch.dtype) -> None:
    if got != expected:
        raise ParameterDataError(
            f"Parameter {name}: Parameter data type mismatch. Expected: {dtype_name(expected)}, Got: {dtype_name(got)}"
        )


def _check_same_names(expected: set[str], got: set[str], what: str, error: type) -> None:
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        raise error(f"{what} must hold exactly the state's parameters; missing: {missing}, unexpected: {unexpected}")


class TrainingState:
    """Parameters (checkpoint file order), optimizer state and properties of a training run."""

    def __init__(
        self,
        params: dict[str, torch.nn.Parameter],
        *,
        is_nominal: bool = False,
        optimizer: OptimizerState | None = None,
        properties: dict[str, int | float | str] | None = None,
        has_external_data: bool = False,
    ) -> None:
        self.params = params
        self.is_nominal = is_nominal
        self.optimizer = optimizer
        self.properties = {name: normalize_property(name, value) for name, value in (properties or {}).items()}
        self.has_external_data = has_external_data  # save like ORT: keep data in "<path>.data"
        # Held by every state-changing call of Module, Optimizer and CheckpointState (and by saves), so
        # that calls from several threads are serialised: no lost step, no save of a half-updated state;
        # a save asked for inside a step on the same thread (a signal handler's) waits for the step's end.
        self.lock = StateLock()
        self.generation = 0  # counts replacements of the tensors behind the parameters (views of them go stale)
        self.flat: FlatState | None = None  # the flat buffers behind the trainable tensors, once made
        self.flat_generation_refused: int | None = None  # the generation whose tensors could not share buffers
        self.save_coordinator: SaveCoordinator | None = None  # set by coordinate_saves
        self._check_momentums()
        self._ensure_grads()

    # ---- loading and saving -------------------------------------------------------------------
    @classmethod
    def load(cls, source: str | os.PathLike | bytes | bytearray | memoryview) -> TrainingState:
        """Load an ORT checkpoint file (or its bytes)."""
        started = time.perf_counter()
        state = cls.from_record(read_checkpoint(source))
        log.info(
            "loaded checkpoint %s: %d parameters in %.2f s",
            _source_text(source),
            len(state.params),
            time.perf_counter() - started,
        )
        return state

    @classmethod
    def from_record(cls, record: CheckpointRecord) -> TrainingState:
        """A state adopting the record's tensors (no copy). At most one optimizer group."""
        both = sorted(set(record.trainable) & set(record.frozen))
        if both:
            raise CheckpointError(f"parameters {both} are listed as both trainable and frozen")
        params = {name: _new_parameter(name, tensor, True) for name, tensor in record.trainable.items()}
        params.update((name, _new_parameter(name, tensor, False)) for name, tensor in record.frozen.items())
        groups = record.optimizer_groups
        if len(groups) > 1:
            raise CheckpointError(
                f"the checkpoint holds {len(groups)} optimizer groups "
                f"{[group.name for group in groups]}; only one group is supported (as in ORT)"
            )
        optimizer = None
        if groups:
            group = groups[0]
            optimizer = OptimizerState(group.name, group.step, group.initial_learning_rate, group.momentums)
        return cls(
            params,
            is_nominal=record.is_nominal,
            optimizer=optimizer,
            properties=record.properties,
            has_external_data=record.has_external_data,
        )

    def to_record(self, include_optimizer_state: bool = False) -> CheckpointRecord:
        """The state as a record sharing the live tensors; the optimizer group only when asked
        for and when there is one (ORT silently writes none otherwise)."""
        groups = []
        if include_optimizer_state and self.optimizer is not None:
            self._check_momentums()  # a rank's slices of sharded moments are saved only gathered (save_checkpoint)
            opt = self.optimizer
            groups.append(
                OptimizerGroupRecord(
                    opt.group_name,
                    opt.step,
                    opt.initial_learning_rate,
                    {param: dict(moments) for param, moments in opt.momentums.items()},
                )
            )
        return CheckpointRecord(
            trainable={n: p.detach() for n, p in self.params.items() if p.requires_grad},
            frozen={n: p.detach() for n, p in self.params.items() if not p.requires_grad},
            is_nominal=self.is_nominal,
            optimizer_groups=groups,
            properties=dict(self.properties),
            has_external_data=self.has_external_data,
        )

    def save(self, path: str | os.PathLike, include_optimizer_state: bool = False) -> None:
        """Write an ORT checkpoint file atomically (the property bag is always saved).

        Asked for while this thread is inside a step of the state (from a signal handler, say), the
        save is done when the step ends: a checkpoint always holds the state between two steps.
        """
        if self.lock.held_by_current_thread():
            self.lock.defer(lambda: self._write(path, include_optimizer_state), f"save of {os.fspath(path)!r}")
            return
        with self.lock:
            self._write(path, include_optimizer_state)

    def _write(self, path: str | os.PathLike, include_optimizer_state: bool) -> None:
        write_checkpoint(self.to_record(include_optimizer_state), path)
        log.info("saved checkpoint %s (optimizer state: %s)", os.fspath(path), include_optimizer_state)

    def coordinate_saves(self, coordinator: SaveCoordinator) -> None:
        """Let ``coordinator`` write this state's checkpoints from now on (``save_checkpoint`` calls it)."""
        self.save_coordinator = coordinator

    def to_bytes(self, include_optimizer_state: bool = False) -> bytes:
        """The ORT checkpoint as bytes (always self-contained, no external data)."""
        return checkpoint_to_bytes(self.to_record(include_optimizer_state))

    # ---- names and parameter access -----------------------------------------------------------
    def trainable_names(self) -> list[str]:
        """Names of the parameters that require gradients, in checkpoint file order."""
        return [name for name, param in self.params.items() if param.requires_grad]

    def frozen_names(self) -> list[str]:
        """Names of the frozen parameters, in checkpoint file order."""
        return [name for name, param in self.params.items() if not param.requires_grad]

    @property
    def device(self) -> torch.device:
        """The device the parameters live on (cpu for a state without parameters)."""
        return next(iter(self.params.values())).device if self.params else torch.device("cpu")

    def require_loaded(self, action: str) -> None:
        """Raise NominalStateError (ORT's text) when the state is nominal."""
        if self.is_nominal:
            raise NominalStateError(f"Cannot {action} with a nominal state. Please load the model parameters first.")

    def parameter(self, name: str) -> torch.nn.Parameter:
        """The live parameter; KeyError("Parameter X not found."); NominalStateError if nominal."""
        if name not in self.params:
            raise KeyError(f"Parameter {name} not found.")
        if self.is_nominal:
            raise NominalStateError(
                f"Cannot get parameter from a nominal state. Please load the parameter states "
                f"first (parameter {name!r})."
            )
        return self.params[name]

    def set_parameter_data(self, name: str, value: np.ndarray | torch.Tensor) -> None:
        """Copy value into the parameter in place, after checking name, shape and dtype."""
        if name in self.params and self.is_nominal:
            raise NominalStateError(
                f"Cannot copy parameter to a nominal state. Please load all the parameter "
                f"states first (parameter {name!r})."
            )
        param = self.parameter(name)
        tensor = self._checked_value(name, value)
        with self.lock, torch.no_grad():
            param.copy_(tensor)

    def _checked_value(self, name: str, value: object) -> torch.Tensor:
        param = self.params[name]
        tensor = _as_tensor(name, value)
        if tensor.shape != param.shape:
            raise ParameterDataError(
                f"Parameter {name}: Parameter data shape mismatch. "
                f"Expected: {_shape_text(param.shape)}, Got: {_shape_text(tensor.shape)}"
            )
        _check_dtype(name, param.dtype, tensor.dtype)
        return tensor

    def tensors(self) -> dict[str, torch.Tensor]:
        """The live parameter tensors themselves, sorted by name."""
        self.require_loaded("access parameter data")
        return {name: self.params[name] for name in sorted(self.params)}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Detached live tensors keyed by name, in checkpoint file order (torch convention)."""
        self.require_loaded("access parameter data")
        return {name: param.detach() for name, param in self.params.items()}

    # ---- properties -----------------------------------------------------------------------------
    def get_property(self, name: str) -> int | float | str:
        """A property's value; KeyError("Property X not found.")."""
        if name not in self.properties:
            raise KeyError(f"Property {name} not found.")
        return self.properties[name]

    def set_property(self, name: str, value: int | float | str) -> None:
        """Add or overwrite a property (int64, float32 or str, as ORT stores them)."""
        self.properties[name] = normalize_property(name, value)

    # ---- bulk updates -----------------------------------------------------------------------------
    def save_safetensors(self, path: str | os.PathLike) -> None:
        """Write the parameters to a safetensors file (atomically)."""
        save_safetensors(self.state_dict(), path, metadata={"format": "pt"})

    def load_safetensors(self, path: str | os.PathLike) -> None:
        """Load parameters from a safetensors file in place: the names must match the state's
        exactly, shapes and dtypes are checked before anything changes. Completes a nominal state.
        """
        tensors, _ = load_safetensors(path)
        _check_same_names(set(self.params), set(tensors), f"safetensors file {str(path)!r}", SafetensorsError)
        if self.is_nominal:
            self.complete_nominal(tensors)
            return
        checked = {name: self._checked_value(name, value) for name, value in tensors.items()}
        with torch.no_grad():
            for name, tensor in checked.items():
                self.params[name].copy_(tensor)

    def complete_nominal(self, values: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Give every parameter of a nominal state its value (copied); clears is_nominal."""
        if not self.is_nominal:
            raise RuntimeError(
                "complete_nominal() needs a nominal state; this state already "
                "holds parameter values (use set_parameter_data)"
            )
        _check_same_names(set(self.params), set(values), "complete_nominal() values", ParameterDataError)
        tensors = {name: _as_tensor(name, value) for name, value in values.items()}
        for name, tensor in tensors.items():
            _check_dtype(name, self.params[name].dtype, tensor.dtype)
        for name, tensor in tensors.items():
            param = self.params[name]
            param.data = tensor.to(param.device, copy=True)
        self.generation += 1
        self.is_nominal = False
        self._check_momentums()
        self._ensure_grads()

    def to(self, device: str | torch.device) -> None:
        """Move parameters, gradients and moments to device, keeping the same tensor objects."""
        device = torch.device(device)
        self.generation += 1
        for param in self.params.values():
            param.data = param.data.to(device)
            if param.grad is not None:
                param.grad.data = param.grad.data.to(device)
        if self.optimizer is not None:
            for moments in self.optimizer.momentums.values():
                for moment in moments.values():
                    moment.data = moment.data.to(device)

    # ---- invariants -------------------------------------------------------------------------------
    def _ensure_grads(self) -> None:
        if self.is_nominal:
            return
        for param in self.params.values():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)

    def _check_momentums(self) -> None:
        if self.optimizer is None:
            return
        for name, moments in self.optimizer.momentums.items():
            if name not in self.params:
                raise CheckpointError(
                    f"optimizer group {self.optimizer.group_name!r} holds "
                    f"moments for {name!r}, which is not a parameter"
                )
            param = self.params[name]
            for moment_name, moment in moments.items():
                if not self.is_nominal and (moment.shape != param.shape or moment.dtype != param.dtype):
                    raise CheckpointError(
                        f"optimizer moment {moment_name!r} of {name!r} is "
                        f"{dtype_name(moment.dtype)}{_shape_text(moment.shape)}, but the "
                        f"parameter is {dtype_name(param.dtype)}{_shape_text(param.shape)}"
                    )


def _new_parameter(name: str, tensor: torch.Tensor, trainable: bool) -> torch.nn.Parameter:
    if trainable and not (tensor.is_floating_point() or tensor.is_complex()):
        raise CheckpointError(
            f"trainable parameter {name!r} has dtype {dtype_name(tensor.dtype)}; "
            "only floating-point parameters can require gradients"
        )
    return torch.nn.Parameter(tensor, requires_grad=trainable)
