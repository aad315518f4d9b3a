"""TrainingState: the torch tensors of a training run, loaded from and saved to ORT checkpoints.

The state owns the parameters as ``nn.Parameter`` objects (the Module binds them without copying),
their gradients (a zero ``.grad`` on every trainable parameter of a loaded state, ``None`` on frozen
ones), the optimizer's moments and the user's properties. Values change in place, so the objects
others hold stay valid; the few calls that replace tensors (a device move, freezing, new trainable
parameters, flat buffers) are the state's own and count a new ``generation``: tensor lists and views
made at an older generation are stale.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ort_torch_train.checkpoint.odtc import checkpoint_to_bytes, read_checkpoint, write_checkpoint
from ort_torch_train.checkpoint.records import CheckpointRecord
from ort_torch_train.checkpoint.safetensors import load_safetensors, save_safetensors
from ort_torch_train.errors import CheckpointError, NominalStateError, ParameterDataError, SafetensorsError
from ort_torch_train.progress import Phase
from ort_torch_train.state.coordination import ParameterSource, SaveCoordinator
from ort_torch_train.state.flat import FlatState, flatten
from ort_torch_train.state.lock import StateLock
from ort_torch_train.state.optimizer_state import OptimizerState
from ort_torch_train.state.parameter_copy import copy_into_parameters
from ort_torch_train.state.records import Moments, StateParts, parts_of_record, record_of
from ort_torch_train.state.values import (
    as_tensor,
    check_dtype,
    check_same_names,
    checked_value,
    normalize_property,
    source_text,
)

log = logging.getLogger(__name__)


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
        self._generation = 0  # counts replacements of the tensors behind parameters, gradients and moments
        self._flat: FlatState | None = None  # the flat buffers behind the trainable tensors, once made
        self._flat_refused_generation: int | None = None  # the generation whose tensors could not share buffers
        self.save_coordinator: SaveCoordinator | None = None  # set by coordinate_saves
        self.parameter_source: ParameterSource | None = None  # set by coordinate_reads
        self._check_momentums()
        self._ensure_grads()

    # ---- loading and saving -------------------------------------------------------------------
    @classmethod
    def load(cls, source: str | os.PathLike | bytes | bytearray | memoryview) -> TrainingState:
        """Load an ORT checkpoint file (or its bytes)."""
        with Phase(log, f"reading the checkpoint {source_text(source)}") as phase:
            state = cls.from_record(read_checkpoint(source))
            phase.done = f"loaded checkpoint {source_text(source)}: {len(state.params)} parameters"
        return state

    @classmethod
    def from_record(cls, record: CheckpointRecord) -> TrainingState:
        """A state adopting the record's tensors (no copy). At most one optimizer group."""
        params, parts = parts_of_record(record)
        return cls(params, **parts)

    def to_record(
        self,
        include_optimizer_state: bool = False,
        *,
        moments: Moments | None = None,
        params: Mapping[str, torch.Tensor] | None = None,
    ) -> CheckpointRecord:
        """The state as a record sharing the live tensors; the optimizer group only when asked
        for and when there is one (ORT silently writes none otherwise), holding ``moments`` when given
        (the whole moments gathered from a rank's sharded slices) instead of the state's own, and
        ``params`` (whole values gathered from sharded parameters) instead of the parameters' values."""
        values = {n: p.detach() for n, p in self.params.items()} if params is None else params
        if include_optimizer_state and self.optimizer is not None and moments is None:
            self._check_momentums()  # a rank's slices of sharded moments are saved only gathered
            moments = self.optimizer.momentums
        parts: StateParts = {
            "is_nominal": self.is_nominal,
            "optimizer": self.optimizer,
            "properties": self.properties,
            "has_external_data": self.has_external_data,
        }
        return record_of(self.params, values, parts, moments if include_optimizer_state else None)

    def save(
        self,
        path: str | os.PathLike,
        include_optimizer_state: bool = False,
        *,
        moments: Moments | None = None,
        params: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        """Write an ORT checkpoint file atomically (the property bag is always saved; ``moments`` and
        ``params`` as in ``to_record``).

        Asked for while this thread is inside a step of the state (from a signal handler, say), the
        save is done when the step ends: a checkpoint always holds the state between two steps.
        """
        if self.lock.held_by_current_thread():
            self.lock.defer(
                lambda: self._write(path, include_optimizer_state, moments, params), f"save of {os.fspath(path)!r}"
            )
            return
        with self.lock:
            self._write(path, include_optimizer_state, moments, params)

    def _write(
        self,
        path: str | os.PathLike,
        include_optimizer_state: bool,
        moments: Moments | None,
        params: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        write_checkpoint(self.to_record(include_optimizer_state, moments=moments, params=params), path)
        log.info("saved checkpoint %s (optimizer state: %s)", os.fspath(path), include_optimizer_state)

    def coordinate_saves(self, coordinator: SaveCoordinator) -> None:
        """Let ``coordinator`` write this state's checkpoints from now on (``save_checkpoint`` calls it)."""
        self.save_coordinator = coordinator

    def coordinate_reads(self, source: ParameterSource) -> None:
        """Let ``source`` give this state's whole parameter values from now on (``whole_parameter`` calls it)."""
        self.parameter_source = source

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
        """The device the parameters live on (cpu for a state without parameters; the "meta" placeholders of
        parameters another process holds do not count)."""
        return next((p.device for p in self.params.values() if p.device.type != "meta"), torch.device("cpu"))

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

    def whole_parameter(self, name: str) -> torch.Tensor:
        """The parameter's whole value, as ``parameter``; a sharded one (a DTensor) is gathered from every
        rank, and one held by another process comes from the ``parameter_source``: collectives that every
        rank calls."""
        param = self.parameter(name)
        if self.parameter_source is not None:
            return self.parameter_source.whole(name)
        gather = getattr(param, "full_tensor", None)
        return param if gather is None else gather()

    def set_parameter_data(self, name: str, value: np.ndarray | torch.Tensor) -> None:
        """Copy value into the parameter in place, after checking name, shape and dtype."""
        if name in self.params and self.is_nominal:
            raise NominalStateError(
                f"Cannot copy parameter to a nominal state. Please load all the parameter "
                f"states first (parameter {name!r})."
            )
        self.parameter(name)
        self.copy_whole_values({name: checked_value(name, self.params[name], value)})

    def copy_whole_values(self, values: Mapping[str, torch.Tensor]) -> None:
        """Copy each whole value (already checked: the parameter's shape and a castable dtype) into its
        parameter in place; a sharded parameter (a DTensor) takes this rank's piece of it (no collective)."""
        with self.lock:
            copy_into_parameters(self.params, values)

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
        check_same_names(set(self.params), set(tensors), f"safetensors file {str(path)!r}", SafetensorsError)
        if self.is_nominal:
            self.complete_nominal(tensors)
            return
        checked = {name: checked_value(name, self.params[name], value) for name, value in tensors.items()}
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
        check_same_names(set(self.params), set(values), "complete_nominal() values", ParameterDataError)
        tensors = {name: as_tensor(name, value) for name, value in values.items()}
        for name, tensor in tensors.items():
            check_dtype(name, self.params[name].dtype, tensor.dtype)
        for name, tensor in tensors.items():
            param = self.params[name]
            param.data = tensor.to(param.device, copy=True)
        self._generation += 1
        self.is_nominal = False
        self._check_momentums()
        self._ensure_grads()

    def to(self, device: str | torch.device) -> None:
        """Move parameters, gradients and moments to device, keeping the same tensor objects."""
        device = torch.device(device)
        self._generation += 1
        for param in self.params.values():
            param.data = param.data.to(device)
            if param.grad is not None:
                param.grad.data = param.grad.data.to(device)
        self._moments_follow_parameters()

    # ---- tensors replaced: each call starts a new generation ---------------------------------------
    @property
    def generation(self) -> int:
        """How many times tensors behind the parameters, gradients or moments were replaced: lists and
        views of them made at another generation are stale."""
        return self._generation

    def follow_parameters(self) -> None:
        """After the parameters' tensors were replaced from outside (``nn.Module._apply`` moved or converted
        them): each parameter's moments move to its device, and a new generation starts."""
        self._generation += 1
        self._moments_follow_parameters()

    def freeze(self, names: Sequence[str], dtype: torch.dtype | None = None) -> None:
        """Stop training ``names``: no gradient, no moments; float32 ones become ``dtype`` when given."""
        for name in names:
            param = self.params[name]
            param.requires_grad_(False)
            param.grad = None
            if self.optimizer is not None:
                self.optimizer.momentums.pop(name, None)
            if dtype is not None and param.dtype == torch.float32:
                param.data = param.data.to(dtype)
        self._generation += 1

    def add_trainable(self, name: str, value: torch.Tensor) -> torch.nn.Parameter:
        """A new trainable parameter ``name`` holding ``value`` (no copy) with a zero gradient; it replaces
        a parameter of that name in its place, or comes after the others."""
        parameter = torch.nn.Parameter(value.detach(), requires_grad=True)
        parameter.grad = torch.zeros_like(parameter)
        self.params[name] = parameter
        self._generation += 1
        return parameter

    def ensure_optimizer(self, group_name: str, initial_learning_rate: float) -> OptimizerState:
        """The optimizer group, made empty (step 0, no moments) when the state has none; CheckpointError
        when the state's group has another name."""
        if self.optimizer is None:
            self.optimizer = OptimizerState(group_name, 0, initial_learning_rate, {})
        elif self.optimizer.group_name != group_name:
            raise CheckpointError(
                f"optimizer state group is named {self.optimizer.group_name!r}; "
                f"ORT uses exactly one group, {group_name!r}"
            )
        return self.optimizer

    def set_moments(self, moments: Moments, *, only: bool = False) -> None:
        """Give each named parameter these moments (``only``: and no other parameter any), in the group
        ``ensure_optimizer`` made. Replacing moments that flat buffers hold starts a new generation."""
        group = self.optimizer
        if group is None:
            raise ValueError("set_moments: the state has no optimizer group (ensure_optimizer makes one)")
        dropped = [name for name in group.momentums if name not in moments] if only else []
        flat = self._flat
        if flat is not None and flat.moment_names and any(name in flat.names for name in [*moments, *dropped]):
            self._generation += 1
        for name in dropped:
            del group.momentums[name]
        for name, values in moments.items():
            group.momentums[name] = dict(values)

    def current_flat(self, names: Sequence[str], *, gradients: bool = True) -> FlatState | None:
        """The flat buffers while they still hold ``names``' parameters (and ``gradients``: their
        gradients; a one-graph step writes the buffer's own); nothing moves. Tensors replaced behind the
        state's back (``param.data = ...``, ``param.grad = ...``) count as a new generation."""
        flat = self._flat
        if flat is None or flat.generation != self._generation or flat.names != tuple(names):
            return None
        if not flat.still_behind(gradients):
            self._generation += 1
            return None
        return flat

    def flat_view(
        self, names: Sequence[str], moment_names: Sequence[str] = (), *, gradients: bool = True
    ) -> FlatState | None:
        """Flat buffers behind these parameters, their gradients and ``moment_names`` moments: those made
        before while they still hold them (``current_flat``), else new ones, the tensors moved into them
        (a new generation); None where they cannot share one buffer."""
        flat = self.current_flat(names, gradients=gradients)
        if flat is not None and flat.moment_names == tuple(moment_names):
            return flat
        if self._flat_refused_generation == self._generation:  # tried at this generation already: mixed tensors
            return None
        momentums = self.optimizer.momentums if self.optimizer is not None else {}
        params = [self.params[name] for name in names]
        self._flat = flatten(params, names, momentums, moment_names, self._generation + 1)
        if self._flat is None:
            self._flat_refused_generation = self._generation
            return None
        self._generation += 1  # every list of the old tensors (views, optimizer lists) is stale now
        return self._flat

    @property
    def flat(self) -> FlatState | None:
        """The flat buffers last made (``flat_view``), current or not; None before."""
        return self._flat

    # ---- invariants -------------------------------------------------------------------------------
    def _moments_follow_parameters(self) -> None:
        """Each parameter's moments moved to its device."""
        if self.optimizer is not None:
            for name, moments in self.optimizer.momentums.items():
                device = self.params[name].device
                for moment in moments.values():
                    moment.data = moment.data.to(device)

    def _ensure_grads(self) -> None:
        if self.is_nominal:
            return
        for param in self.params.values():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)

    def _check_momentums(self) -> None:
        if self.optimizer is not None:
            self.optimizer.check_moments(self.params, self.is_nominal)
