"""The tensor lists an OptimizerEngine's kernel runs on, and who provides them.

A ``TensorProvider`` readies a TrainingState's moments for an algorithm and hands the engine the
lists one step updates; it also clips the gradients and runs after each update. ``WholeTensors``, the
default, gives the whole trainable tensors (one flat buffer per list where they can share one); ZeRO
(``distributed/zero.py``) gives this rank's slices and gathers the updated ones after each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor, nn

from ort_torch_train.errors import CheckpointError
from ort_torch_train.optim.algorithm import OptimizerAlgorithm
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.state.flat import FlatState, zeros_in_one_buffer
from ort_torch_train.state.optimizer_state import OptimizerState
from ort_torch_train.state.training_state import TrainingState


@dataclass
class KernelTensors:
    """What one step's kernel updates: parameters, their gradients and the algorithm's updated moments
    (one list per name of ``updated_moments``), and the flat buffers these lists are, if any."""

    params: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    moments: list[list[Tensor]] = field(default_factory=list)
    flat: FlatState | None = None


class TensorProvider(Protocol):
    """Where an OptimizerEngine's update runs: the tensor lists, the gradient clip and a hook after each step."""

    @property
    def fuses_into_step(self) -> bool:
        """Whether a compiled train step may run the update in its own graph, on the whole tensors."""
        ...

    def kernel_tensors(
        self, state: TrainingState, param_names: Sequence[str], algorithm: OptimizerAlgorithm
    ) -> KernelTensors:
        """The lists the kernel runs on, after giving the state's parameters their moments (zeros, as in
        ORT, where the state has none; CheckpointError where a parameter's do not fit)."""
        ...

    def clip_gradients(self, grads: list[Tensor], max_norm: float) -> None:
        """Scale ``grads`` (the lists' gradients) in place to a global L2 norm of at most ``max_norm``."""
        ...

    def after_step(self, tensors: KernelTensors) -> None:
        """Run after each update of ``tensors``."""
        ...


class WholeTensors:
    """The default provider: the whole trainable tensors, one flat buffer per list where they share one."""

    fuses_into_step = True

    def kernel_tensors(
        self, state: TrainingState, param_names: Sequence[str], algorithm: OptimizerAlgorithm
    ) -> KernelTensors:
        """The lists the kernel runs on, the state's moments made or placed first (``TensorProvider``)."""
        params = [trainable_parameter(state, name) for name in param_names]
        momentums = optimizer_group(state).momentums
        if not momentums:
            zeros = [zeros_in_one_buffer([p.detach() for p in params]) for _ in algorithm.stored_moments]
            state.set_moments(
                {
                    name: {key: tensors[index] for key, tensors in zip(algorithm.stored_moments, zeros)}
                    for index, name in enumerate(param_names)
                }
            )
        placed = {
            name: moved
            for name, param in zip(param_names, params)
            if (moved := _placed_moments(name, param, momentums.get(name), algorithm.stored_moments)) is not None
        }
        if placed:
            state.set_moments(placed)
        flat = state.flat_view(param_names, algorithm.updated_moments) if algorithm.elementwise else None
        if flat is not None:  # one tensor per list: the kernels run one loop
            return KernelTensors([flat.params], [flat.grads], [[m] for m in flat.moments], flat)
        moments = [[momentums[name][key] for name in param_names] for key in algorithm.updated_moments]
        return KernelTensors(list(params), gradient_buffers(params), moments)

    def clip_gradients(self, grads: list[Tensor], max_norm: float) -> None:
        """Clip as ORT's InplaceClipGradNorm does."""
        clip_grad_norm_(grads, max_norm)

    def after_step(self, tensors: KernelTensors) -> None:
        """Nothing: the lists are the state's tensors."""


def optimizer_group(state: TrainingState) -> OptimizerState:
    """The state's optimizer group, which an OptimizerEngine made (``ensure_optimizer``)."""
    if state.optimizer is None:  # only a caller that dropped it gets here
        raise ValueError("OptimizerEngine: the training state has lost its optimizer state")
    return state.optimizer


def gradient_buffers(params: Sequence[Tensor]) -> list[Tensor]:
    """The ``.grad`` of each of ``params``; ValueError when one has none."""
    grads = []
    for param in params:
        if param.grad is None:
            raise ValueError(f"a parameter of shape {tuple(param.shape)} has no gradient buffer")
        grads.append(param.grad)
    return grads


def trainable_parameter(state: TrainingState, name: str) -> nn.Parameter:
    """The state's parameter ``name``, checked to be trainable with a gradient buffer like it."""
    if name not in state.params:
        raise KeyError(f"trainable parameter {name!r} is not in the training state (it holds {sorted(state.params)})")
    param = state.params[name]
    if not param.requires_grad:
        raise ValueError(f"parameter {name!r} is listed as trainable but does not require grad")
    if param.grad is None or param.grad.shape != param.shape or param.grad.device != param.device:
        found = "none" if param.grad is None else f"{tuple(param.grad.shape)} on {param.grad.device}"
        raise ValueError(
            f"trainable parameter {name!r} needs a gradient buffer of shape "
            f"{tuple(param.shape)} on {param.device}; found {found}"
        )
    return param


def _placed_moments(
    name: str, param: Tensor, moments: dict[str, Tensor] | None, keys: tuple[str, ...]
) -> dict[str, Tensor] | None:
    """Check a parameter's checkpointed moments; those on another device than the parameter's, moved
    there (None: none to move)."""
    if moments is None:
        raise CheckpointError(f"Parameter {name} not found in the source optimizer checkpoint states.")
    moved = dict(moments)
    for key in keys:
        if key not in moments:
            raise CheckpointError(f"optimizer state of parameter {name!r} lacks {key!r}; found {sorted(moments)}")
        moment = moments[key]
        if moment.shape != param.shape or moment.dtype != param.dtype:
            raise CheckpointError(
                f"optimizer state {name!r}/{key!r} is {moment.dtype} of shape "
                f"{tuple(moment.shape)}; the parameter is {param.dtype} of shape "
                f"{tuple(param.shape)}"
            )
        if moment.device != param.device:
            moved[key] = moment.to(param.device)
    return None if all(moved[key] is moments[key] for key in moments) else moved
