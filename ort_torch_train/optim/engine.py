"""The optimizer core: ORT's optimizer session (training_api/optimizer.cc) over a TrainingState.

Moments live in ``state.optimizer`` (group "group0"), zero-initialised like each parameter unless
the checkpoint brought them; ``state.optimizer.step`` counts completed steps and each step feeds
``step + 1`` to the kernel. The learning rate is a float32 that is not part of the checkpoint.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from ort_torch_train.errors import CheckpointError
from ort_torch_train.optim.adamw import IMPLEMENTATIONS as ADAMW_IMPLEMENTATIONS
from ort_torch_train.optim.adamw import (
    AdamWHyperparameters,
    adamw_prepared,
    adamw_step_scalars,
    choose_adamw_implementation,
    single_tensor_adamw,
)
from ort_torch_train.optim.clip import clip_grad_norm_
from ort_torch_train.optim.compiled import FusedUpdate, scalar_tensor
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.optimizer_model import OptimizerSpec
from ort_torch_train.optim.schedulers import check_learning_rate
from ort_torch_train.optim.scratch import make_scratch
from ort_torch_train.optim.sgd import IMPLEMENTATIONS as SGD_IMPLEMENTATIONS
from ort_torch_train.optim.sgd import sgd, single_tensor_sgd
from ort_torch_train.state.flat import FlatState, zeros_in_one_buffer
from ort_torch_train.state.loss_scale import LossScaler
from ort_torch_train.state.training_state import OptimizerState, TrainingState

DEFAULT_LEARNING_RATE = to_float32(0.001)
GROUP_NAME = "group0"


class OptimizerEngine:
    """Applies an optimizer model's update to the trainable parameters of a TrainingState.

    ``param_names`` are the trainable parameter names in the training graph's order. Each
    parameter's ``.grad`` (the accumulated gradient) must stay the same tensor object while the
    engine lives (accumulate and reset in place); call ``refresh()`` after replacing tensors.
    ``implementation`` overrides the kernel choice: AdamW "fused" (the default where torch's fused
    kernel runs), "foreach" or "single"; SGD "foreach" (the default) or "single".
    ``loss_scaler`` (fp16 mixed precision, ``training/precision.py``) unscales the gradients first
    and skips a step whose gradients hold inf or nan: ``last_step_skipped``, ``skipped_steps``.
    """

    fuses_into_step = True  # a compiled train step may run this update in its own graph

    def __init__(
        self,
        spec: OptimizerSpec,
        state: TrainingState,
        param_names: Sequence[str],
        *,
        implementation: str | None = None,
        loss_scaler: LossScaler | None = None,
    ) -> None:
        names = list(param_names)
        if not names:
            raise ValueError("OptimizerEngine: the model has no trainable parameters to optimize")
        if len(set(names)) != len(names):
            raise ValueError(f"OptimizerEngine: param_names must be unique; got {names}")
        allowed = ADAMW_IMPLEMENTATIONS if spec.kind == "adamw" else SGD_IMPLEMENTATIONS
        if implementation not in (None, *allowed):
            raise ValueError(
                f"OptimizerEngine: implementation for {spec.kind} must be one of {allowed} or None; "
                f"got {implementation!r}"
            )
        self.spec = spec
        self.state = state
        self.param_names = tuple(names)
        self._requested_implementation = implementation
        self._hyperparameters = spec.hyperparameters(DEFAULT_LEARNING_RATE)
        state.ensure_optimizer(GROUP_NAME, DEFAULT_LEARNING_RATE)
        self._fused_update = (
            FusedUpdate(single_tensor_adamw, (spec.adam_mode, spec.weight_decay != 0.0), spec.clip_max_norm)
            if spec.kind == "adamw"
            else FusedUpdate(single_tensor_sgd, (), spec.clip_max_norm)
        )
        # the tensor lists the kernel runs on, built by refresh()
        self._params: list[Tensor] = []
        self._grads: list[Tensor] = []
        self._moments: list[list[Tensor]] = []
        self._scratch: tuple[list[Tensor], ...] | None = None
        self._step_tensor: Tensor | None = None
        self._implementation = ""
        self._prepared_device: torch.device | None = None
        self._prepared_generation: int | None = None  # the state's generation the tensor lists were built at
        self._flat: FlatState | None = None  # the flat buffers the tensor lists are, if any
        self._host_scalars: tuple[np.ndarray, Tensor] | None = None  # next_step_scalars' CPU buffer
        self.loss_scaler = loss_scaler
        self.last_step_skipped = False
        self.skipped_steps = 0
        if not state.is_nominal:  # a nominal state gets its moments at the first step, as in ORT
            self.refresh()

    # stepping ---------------------------------------------------------------------------------
    def step(self, update_signal: bool = True) -> bool:
        """Clip (if the model does), update the parameters and count the step; return whether it updated.

        ``update_signal=False`` (only for models with an update-signal input) skips the update.
        """
        if not update_signal and not self.spec.has_update_signal:
            raise ValueError(
                "OptimizerEngine.step: update_signal=False needs an optimizer model with an "
                "update-signal input; this one has none"
            )
        if self._flat is not None:
            self.state.current_flat(self.param_names)  # a new generation if tensors were replaced behind it
        self._prepare()
        if self.loss_scaler is not None:
            self.last_step_skipped = not self.loss_scaler.unscale_and_update(self._grads)
            if self.last_step_skipped:
                self.skipped_steps += 1
                return False
        if self.spec.clip_max_norm is not None:
            self._clip_gradients(self.spec.clip_max_norm)
        if not update_signal:
            return False
        optimizer_state = self._optimizer_state
        step = optimizer_state.step + 1
        hyperparameters = self._hyperparameters
        if isinstance(hyperparameters, AdamWHyperparameters):
            exp_avgs, exp_avg_sqs = self._moments
            adamw_prepared(
                self._params,
                self._grads,
                exp_avgs,
                exp_avg_sqs,
                hyperparameters,
                step=step,
                implementation=self._implementation,
                scratch=self._scratch,
                step_tensor=self._step_tensor,
            )
        else:
            sgd(self._params, self._grads, hyperparameters, implementation=self._implementation, scratch=self._scratch)
        optimizer_state.step = step
        return True

    def _clip_gradients(self, max_norm: float) -> None:
        clip_grad_norm_(self._grads, max_norm)

    def _prepare(self) -> None:
        if self._prepared_generation != self.state.generation or self._params[0].device != self._prepared_device:
            self.refresh()  # first step, or the state's tensors were replaced (a device move, flat buffers)

    # the update inside a compiled train step ----------------------------------------------------
    def fused_update(self) -> FusedUpdate:
        """This optimizer's update as a kernel for a compiled train step (readies the tensor lists)."""
        self._prepare()
        return self._fused_update

    @property
    def update_moment_names(self) -> tuple[str, ...]:
        """The names of the moments the fused update runs on (none for SGD)."""
        return tuple(self.spec.momentum_names) if self.spec.kind == "adamw" else ()

    def moment_lists(self) -> list[list[Tensor]]:
        """The moments the fused update runs on, one list per name of ``update_moment_names``."""
        return self._moments if self.spec.kind == "adamw" else []

    def next_step_scalars(self) -> Tensor:
        """The next step's scalars, computed as ORT computes them, for the fused update."""
        device = self._params[0].device
        hyperparameters = self._hyperparameters
        if not isinstance(hyperparameters, AdamWHyperparameters):
            return scalar_tensor(-hyperparameters.lr, device)
        scalars = adamw_step_scalars(hyperparameters, self._optimizer_state.step + 1)
        if device.type != "cpu":
            return scalar_tensor(scalars, device)
        # on CPU one host tensor, rewritten each step: the compiled step reads it before it returns
        if self._host_scalars is None:
            array = np.empty(len(scalars), np.float32)
            self._host_scalars = (array, torch.from_numpy(array))
        self._host_scalars[0][:] = scalars
        return self._host_scalars[1]

    def count_step(self) -> None:
        """Count a step the fused update made."""
        self._optimizer_state.step += 1

    def refresh(self) -> None:
        """(Re)build the tensor lists the kernel runs on, creating zero moments when there are none."""
        self.state.require_loaded("perform OptimizerStep")
        params = [trainable_parameter(self.state, name) for name in self.param_names]
        momentums = self._optimizer_state.momentums
        if not momentums:
            zeros = [zeros_in_one_buffer([p.detach() for p in params]) for _ in self.spec.momentum_names]
            self.state.set_moments(
                {
                    name: {key: tensors[index] for key, tensors in zip(self.spec.momentum_names, zeros)}
                    for index, name in enumerate(self.param_names)
                }
            )
        for name, param in zip(self.param_names, params):
            placed = _placed_moments(name, param, momentums.get(name), self.spec.momentum_names)
            if placed is not None:
                self.state.set_moments({name: placed})
        self._params, self._grads, self._moments, self._scratch = [], [], [], None  # the old tensors can go
        flat = self._flat = self.state.flat_view(self.param_names, self.update_moment_names)
        if flat is not None:  # one tensor per list: the kernels run one loop (the update is elementwise)
            self._params, self._grads, self._moments = [flat.params], [flat.grads], [[m] for m in flat.moments]
        else:
            self._params = list(params)
            self._grads = gradient_buffers(params)
            self._moments = [[momentums[name][key] for name in self.param_names] for key in self.update_moment_names]
        self._ready_kernel()

    def _ready_kernel(self) -> None:
        """Choose the kernel for the tensor lists and allocate its reused buffers."""
        params = self._params
        self._implementation = self._choose_implementation()
        self._step_tensor = torch.zeros((), dtype=torch.float32, device=params[0].device)  # reused by "fused"
        self._scratch = None  # on CPU, fresh temporaries cost page faults at every step; CUDA caches them
        if self._implementation == "foreach" and params[0].device.type == "cpu":
            self._scratch = make_scratch(params, 2 if self.spec.kind == "adamw" else 1)
        self._prepared_device = params[0].device
        self._prepared_generation = self.state.generation

    def _choose_implementation(self) -> str:
        if self._requested_implementation is not None or self.spec.kind == "sgd":
            return self._requested_implementation or "foreach"
        exp_avgs, exp_avg_sqs = self._moments
        return choose_adamw_implementation(self._params, self._grads, exp_avgs, exp_avg_sqs)

    # learning rate and counters ---------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        """The learning rate fed at the next step (a float32 value)."""
        return self._hyperparameters.lr

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate (stored as float32); NaN, infinite or negative values are refused."""
        value = to_float32(check_learning_rate(learning_rate))
        self._hyperparameters = dataclasses.replace(self._hyperparameters, lr=value)

    @property
    def initial_learning_rate(self) -> float:
        """The checkpointed initial learning rate (what ORT's LinearLRScheduler scales)."""
        return self._optimizer_state.initial_learning_rate

    def set_initial_learning_rate(self, learning_rate: float) -> None:
        """Set the initial learning rate (saved in the checkpoint) and the current one to it."""
        value = to_float32(check_learning_rate(learning_rate, "initial learning rate"))
        self._optimizer_state.initial_learning_rate = value
        self._hyperparameters = dataclasses.replace(self._hyperparameters, lr=value)

    @property
    def completed_steps(self) -> int:
        """Number of optimizer steps taken, including those restored from the checkpoint."""
        return int(self._optimizer_state.step)

    @property
    def _optimizer_state(self) -> OptimizerState:
        optimizer_state = self.state.optimizer
        if optimizer_state is None:  # created by __init__: only a caller that dropped it gets here
            raise ValueError("OptimizerEngine: the training state has lost its optimizer state")
        return optimizer_state

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters, in the training graph's order."""
        return [self.state.params[name] for name in self.param_names]


def gradient_buffers(params: Sequence[Tensor]) -> list[Tensor]:
    """The ``.grad`` of each of ``params``; ValueError when one has none."""
    grads = []
    for param in params:
        if param.grad is None:
            raise ValueError(f"a parameter of shape {tuple(param.shape)} has no gradient buffer")
        grads.append(param.grad)
    return grads


def trainable_parameter(state: TrainingState, name: str) -> torch.nn.Parameter:
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
