"""``onnxruntime.training.api.CheckpointState`` and its views, as a thin face over TrainingState.

All logic lives in ``ort_torch_train.state.training_state.TrainingState``, reachable as
``CheckpointState.training_state`` (also ``._state``, the attribute name ORT itself uses).
Differences from ORT 1.19.2, all deliberate: ``repr()`` of ``Parameters``/``Properties`` returns a
string (ORT's returns a list, so ``repr()`` raises), setting a parameter before any Module exists
works (ORT crashes), bool and out-of-range property values are refused (ORT stores them as int /
float), and ``load_checkpoint`` also accepts the checkpoint's bytes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import torch

from ort_torch_train.state.training_state import TrainingState


def _to_numpy(tensor: torch.Tensor, what: str) -> np.ndarray:
    """A numpy view of a CPU tensor (zero-copy), or a host copy of a tensor on another device."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        raise TypeError(
            f"{what} is bfloat16, which numpy cannot represent; use CheckpointState.tensors() for the torch tensor"
        )
    return tensor.numpy() if tensor.device.type == "cpu" else tensor.cpu().numpy()


class Parameter:
    """One model parameter: name, data, grad and requires_grad (returned by Parameters).

    Args:
        state: the training state holding the parameter.
        name: the parameter's name.
    """

    def __init__(self, state: TrainingState, name: str) -> None:
        self._state = state
        self._name = name

    @property
    def name(self) -> str:
        """The name of the parameter."""
        return self._name

    @property
    def data(self) -> np.ndarray:
        """The parameter's values (a zero-copy view when the parameter is on the CPU)."""
        return _to_numpy(self._state.whole_parameter(self._name), f"Parameter {self._name}")

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._state.set_parameter_data(self._name, value)

    @property
    def grad(self) -> np.ndarray | None:
        """The gradient (zero before the first train step), or None for a frozen parameter; read between
        steps (a compiled step may release the gradients' memory while it runs)."""
        with self._state.lock:
            grad = self._state.parameter(self._name).grad
            if grad is None:
                return None
            gather = getattr(grad, "full_tensor", None)  # a sharded gradient: gathered (a collective)
            return _to_numpy(grad if gather is None else gather(), f"Gradient of {self._name}")

    @property
    def requires_grad(self) -> bool:
        """Whether the parameter is trained (its gradient is computed)."""
        return self._state.params[self._name].requires_grad

    def __repr__(self) -> str:
        return f"Parameter(name={self.name}, requires_grad={self.requires_grad})"


class Parameters:
    """Dict-like view of the parameters; iterates (name, Parameter) sorted by name, as ORT.

    Args:
        state: the training state whose parameters it shows.
    """

    def __init__(self, state: TrainingState) -> None:
        self._state = state

    def __getitem__(self, name: str) -> Parameter:
        self._state.parameter(name)  # KeyError / NominalStateError, as in ORT
        return Parameter(self._state, name)

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self._state.set_parameter_data(name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._state.params

    def __iter__(self) -> Iterator[tuple[str, Parameter]]:
        for name in sorted(self._state.params):
            yield name, self[name]

    def __len__(self) -> int:
        return len(self._state.params)

    def __repr__(self) -> str:
        return f"Parameters({sorted(self._state.params)})"


class Properties:
    """Dict-like view of the user properties (int, float, str); iterates (name, value) sorted.

    Args:
        state: the training state whose properties it shows.
    """

    def __init__(self, state: TrainingState) -> None:
        self._state = state

    def __getitem__(self, name: str) -> int | float | str:
        return self._state.get_property(name)

    def __setitem__(self, name: str, value: int | float | str) -> None:
        self._state.set_property(name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._state.properties

    def get(self, name: str, default: int | float | str | None = None) -> int | float | str | None:
        """The property's value, or ``default`` when the checkpoint has no property ``name`` (as ``dict.get``)."""
        return self._state.properties.get(name, default)

    def __iter__(self) -> Iterator[tuple[str, int | float | str]]:
        for name in sorted(self._state.properties):
            yield name, self._state.properties[name]

    def __len__(self) -> int:
        return len(self._state.properties)

    def __repr__(self) -> str:
        return f"Properties({sorted(self._state.properties)})"


class CheckpointState:
    """The state of a training session: parameters, gradients, optimizer state, properties.

    Create it with ``CheckpointState.load_checkpoint``.

    Args:
        state: the training state it wraps (``CheckpointState.load_checkpoint`` makes one from a file).

    Examples:
        ```python
        from ort_torch_train.api import CheckpointState

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        state.properties["epoch"] = 3
        CheckpointState.save_checkpoint(state, "example_checkpoint", include_optimizer_state=True)
        assert CheckpointState.load_checkpoint("example_checkpoint").properties["epoch"] == 3
        ```
    """

    def __init__(self, state: TrainingState) -> None:
        if not isinstance(state, TrainingState):
            raise TypeError(f"Invalid argument for CheckpointState received {type(state)}")
        self._state = state
        self._parameters = Parameters(state)
        self._properties = Properties(state)

    @classmethod
    def load_checkpoint(cls, checkpoint_uri: str | os.PathLike | bytes) -> CheckpointState:
        """Load a checkpoint (complete or nominal) from its path or its bytes."""
        return cls(TrainingState.load(checkpoint_uri))

    @classmethod
    def save_checkpoint(
        cls, state: CheckpointState, checkpoint_uri: str | os.PathLike, include_optimizer_state: bool = False
    ) -> None:
        """Save the state to a checkpoint file (atomically). Called inside a step (from a signal
        handler), the save is written when the step ends. In a distributed run rank 0 writes it: see
        ``distributed/checkpoint.py`` (rank 0 alone may call it, unless the moments are sharded)."""
        if not isinstance(state, CheckpointState):
            raise TypeError(f"state must be a CheckpointState, got {type(state).__name__}")
        coordinator = state._state.save_coordinator
        if coordinator is None:
            state._state.save(checkpoint_uri, include_optimizer_state)
        else:
            coordinator.save(state._state, checkpoint_uri, include_optimizer_state)

    @property
    def training_state(self) -> TrainingState:
        """The TrainingState behind this face (what Module and Optimizer work on)."""
        return self._state

    @property
    def parameters(self) -> Parameters:
        """The model parameters."""
        return self._parameters

    @property
    def properties(self) -> Properties:
        """The user properties."""
        return self._properties

    @property
    def step(self) -> int:
        """Optimizer steps completed: the count a checkpoint saves with its optimizer state
        (``include_optimizer_state=True``), advanced by every ``Optimizer.step()`` that updates; 0 for a
        state without optimizer state. ORT keeps this count in the checkpoint without a Python property;
        a resumed loop reads it to continue its step numbering and its LR schedule."""
        optimizer = self._state.optimizer
        return 0 if optimizer is None else int(optimizer.step)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The live parameter tensors, sorted by name."""
        return self._state.tensors()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Detached live parameter tensors keyed by name (torch convention)."""
        return self._state.state_dict()

    def save_safetensors(self, path: str | os.PathLike) -> None:
        """Write the parameters to a safetensors file."""
        self._state.save_safetensors(path)

    def load_safetensors(self, path: str | os.PathLike) -> None:
        """Load the parameters from a safetensors file in place (checked)."""
        self._state.load_safetensors(path)
