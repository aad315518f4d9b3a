"""The optimizer core: ORT's optimizer session (training_api/optimizer.cc) over a TrainingState.

Moments live in ``state.optimizer`` (group "group0"), zero-initialised like each parameter unless
the checkpoint brought them; ``state.optimizer.step`` counts completed steps and each step feeds
``step + 1`` to the kernel. The learning rate is a float32 that is not part of the checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from ort_torch_train.optim.algorithm import DEFAULT_LEARNING_RATE, HostStepScalars, PreparedKernel
from ort_torch_train.optim.compiled import FusedUpdate, scalar_tensor
from ort_torch_train.optim.float32 import to_float32
from ort_torch_train.optim.host_scalars import RecomputedStepScalars
from ort_torch_train.optim.optimizer_model import OptimizerSpec
from ort_torch_train.optim.schedulers import check_learning_rate
from ort_torch_train.optim.scratch import make_scratch
from ort_torch_train.optim.tensor_lists import KernelTensors, TensorProvider, WholeTensors, optimizer_group
from ort_torch_train.state.loss_scale import LossScaler
from ort_torch_train.state.training_state import OptimizerState, TrainingState

GROUP_NAME = "group0"


class UpdateProgram(Protocol):
    """An update compiled ahead of time over the state's own tensors (a package's optimizer program): each call
    clips the gradients where the optimizer model clips and updates the parameters and moments in place."""

    def __call__(self, scalars: Tensor) -> None:
        """One update with the step's ``scalars`` (``OptimizerAlgorithm.step_scalars``, float32)."""
        ...


class OptimizerEngine:
    """Applies an optimizer model's update to the trainable parameters of a TrainingState.

    ``param_names`` are the trainable parameter names in the training graph's order. Each
    parameter's ``.grad`` (the accumulated gradient) must stay the same tensor object while the
    engine lives (accumulate and reset in place); call ``refresh()`` after replacing tensors.
    ``implementation`` overrides the kernel choice among the algorithm's ``implementations`` (AdamW:
    "fused" is the default where torch's fused kernel runs; SGD: "foreach" is the default).
    ``loss_scaler`` (fp16 mixed precision, ``state/loss_scale.py``) unscales the gradients first
    and skips a step whose gradients hold inf or nan: ``last_step_skipped``, ``skipped_steps``.
    ``tensors`` provides the lists the kernel runs on (default: the whole tensors; ZeRO: this rank's slices).
    ``program`` (a package's optimizer step, for this spec) runs the updates instead of the kernel, on the CPU.
    """

    def __init__(
        self,
        spec: OptimizerSpec,
        state: TrainingState,
        param_names: Sequence[str],
        *,
        implementation: str | None = None,
        loss_scaler: LossScaler | None = None,
        tensors: TensorProvider | None = None,
        program: UpdateProgram | None = None,
    ) -> None:
        names = list(param_names)
        if not names:
            raise ValueError("OptimizerEngine: the model has no trainable parameters to optimize")
        if len(set(names)) != len(names):
            raise ValueError(f"OptimizerEngine: param_names must be unique; got {names}")
        algorithm = spec.algorithm
        if implementation not in (None, *algorithm.implementations):
            raise ValueError(
                f"OptimizerEngine: implementation for {algorithm.name} must be one of "
                f"{algorithm.implementations} or None; got {implementation!r}"
            )
        self.spec = spec
        self.algorithm = algorithm
        self.state = state
        self.param_names = tuple(names)
        self._provider: TensorProvider = tensors if tensors is not None else WholeTensors()
        self._requested_implementation = implementation
        self._hyperparameters = spec.hyperparameters.with_learning_rate(DEFAULT_LEARNING_RATE)
        state.ensure_optimizer(GROUP_NAME, DEFAULT_LEARNING_RATE)
        self._fused_update = algorithm.fused_update(spec.hyperparameters, spec.clip_max_norm)
        self._tensors = KernelTensors()  # the tensor lists the kernel runs on, built by refresh()
        self._kernel = PreparedKernel("", None, None)  # the kernel chosen for them, and its buffers
        self._prepared_device: torch.device | None = None
        self._prepared_on_cpu = False
        self._prepared_generation: int | None = None  # the state's generation the tensor lists were built at
        self._host_scalars: HostStepScalars | None = None  # next_step_scalars' CPU buffer and its writer
        self.loss_scaler = loss_scaler
        self._program = program if loss_scaler is None else None
        self.last_step_skipped = False
        self.skipped_steps = 0
        if not state.is_nominal:  # a nominal state gets its moments at the first step, as in ORT
            self.refresh()

    @property
    def fuses_into_step(self) -> bool:
        """Whether a compiled train step may run this update in its own graph (not with ZeRO's slices)."""
        return self._provider.fuses_into_step

    # stepping ---------------------------------------------------------------------------------
    def step(self, update_signal: bool = True) -> bool:
        """Clip (if the model does), update the parameters and count the step; return whether it updated.

        ``update_signal=False`` (only for models with an update-signal input) skips the update.
        """
        program = self._program
        if program is not None and update_signal:
            state = self.state
            if self._prepared_generation != state.generation:
                self.refresh()  # first step, or the state's tensors were replaced: moments made where none are
            group = state.optimizer
            if group is None:
                group = optimizer_group(state)  # raises: only a caller that dropped it gets here
            step = group.step + 1
            host = self._host_scalars
            if host is None:
                host = self._host_scalars = self._new_host_scalars()
            program(host.write(self._hyperparameters, step))
            group.step = step
            return True
        if not update_signal and not self.spec.has_update_signal:
            raise ValueError(
                "OptimizerEngine.step: update_signal=False needs an optimizer model with an "
                "update-signal input; this one has none"
            )
        if self._tensors.flat is not None:
            self.state.current_flat(self.param_names)  # a new generation if tensors were replaced behind it
        tensors = self.tensor_lists()
        if self.loss_scaler is not None:
            self.last_step_skipped = not self.loss_scaler.unscale_and_update(tensors.grads)
            if self.last_step_skipped:
                self.skipped_steps += 1
                return False
        if self.spec.clip_max_norm is not None:
            self._provider.clip_gradients(tensors.grads, self.spec.clip_max_norm)
        if not update_signal:
            return False
        optimizer_state = self._optimizer_state
        step = optimizer_state.step + 1
        self.algorithm.update(tensors.params, tensors.grads, tensors.moments, self._hyperparameters, step, self._kernel)
        optimizer_state.step = step
        self._provider.after_step(tensors)
        return True

    def tensor_lists(self) -> KernelTensors:
        """The tensor lists the kernel runs on, rebuilt first where the state's tensors were replaced."""
        if self._prepared_generation != self.state.generation or self._moved(self._tensors.params[0]):
            self.refresh()  # first step, or the state's tensors were replaced (a device move, flat buffers)
        return self._tensors

    def _moved(self, param: Tensor) -> bool:
        """Whether ``param`` left the device the tensor lists were prepared on (``is_cpu`` costs less than
        ``device``)."""
        return not (param.is_cpu and self._prepared_on_cpu) and param.device != self._prepared_device

    # the update inside a compiled train step ----------------------------------------------------
    def fused_update(self) -> FusedUpdate:
        """This optimizer's update as a kernel for a compiled train step (readies the tensor lists)."""
        self.tensor_lists()
        return self._fused_update

    @property
    def update_moment_names(self) -> tuple[str, ...]:
        """The names of the moments the update runs on (the algorithm's ``updated_moments``)."""
        return self.algorithm.updated_moments

    def moment_lists(self) -> list[list[Tensor]]:
        """The moments the fused update runs on, one list per name of ``update_moment_names``."""
        return self._tensors.moments

    def next_step_scalars(self) -> Tensor:
        """The next step's scalars, computed as ORT computes them, for the fused update."""
        param = self._tensors.params[0]
        step = self._optimizer_state.step + 1
        if not param.is_cpu:  # a tensor's is_cpu costs less than its device
            return scalar_tensor(self.algorithm.step_scalars(self._hyperparameters, step), param.device)
        return self._host_step_scalars(step)

    def _host_step_scalars(self, step: int) -> Tensor:
        """The scalars of the 1-based ``step`` in one host tensor, rewritten each step: the compiled step or
        program reads it before it returns."""
        host = self._host_scalars
        if host is None:
            host = self._host_scalars = self._new_host_scalars()
        return host.write(self._hyperparameters, step)

    def _new_host_scalars(self) -> HostStepScalars:
        """The algorithm's writer of its step scalars into a host tensor, or one that writes ``step_scalars``."""
        make = self.algorithm.host_step_scalars
        return make() if make is not None else RecomputedStepScalars(self.algorithm.step_scalars)

    def count_step(self) -> None:
        """Count a step the fused update made."""
        self._optimizer_state.step += 1

    def refresh(self) -> None:
        """(Re)build the tensor lists the kernel runs on, creating zero moments when there are none."""
        self.state.require_loaded("perform OptimizerStep")
        self._tensors, self._kernel = KernelTensors(), PreparedKernel("", None, None)  # the old tensors can go
        self._prepared_generation = None
        self._tensors = self._provider.kernel_tensors(self.state, self.param_names, self.algorithm)
        self._ready_kernel()

    def _ready_kernel(self) -> None:
        """Choose the kernel for the tensor lists and allocate its reused buffers."""
        tensors = self._tensors
        params = tensors.params
        implementation = self._requested_implementation or self.algorithm.default_implementation(
            params, tensors.grads, tensors.moments
        )
        step_tensor = torch.zeros((), dtype=torch.float32, device=params[0].device)  # reused by "fused"
        scratch = None  # on CPU, fresh temporaries cost page faults at every step; CUDA caches them
        if implementation == "foreach" and params[0].device.type == "cpu":
            scratch = make_scratch(params, self.algorithm.scratch_lists)
        self._kernel = PreparedKernel(implementation, scratch, step_tensor)
        self._prepared_device = params[0].device
        self._prepared_on_cpu = params[0].is_cpu
        self._prepared_generation = self.state.generation

    # learning rate and counters ---------------------------------------------------------------
    @property
    def learning_rate(self) -> float:
        """The learning rate fed at the next step (a float32 value)."""
        return self._hyperparameters.lr

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate (stored as float32); NaN, infinite or negative values are refused."""
        value = to_float32(check_learning_rate(learning_rate))
        self._hyperparameters = self._hyperparameters.with_learning_rate(value)

    @property
    def initial_learning_rate(self) -> float:
        """The checkpointed initial learning rate (what ORT's LinearLRScheduler scales)."""
        return self._optimizer_state.initial_learning_rate

    def set_initial_learning_rate(self, learning_rate: float) -> None:
        """Set the initial learning rate (saved in the checkpoint) and the current one to it."""
        value = to_float32(check_learning_rate(learning_rate, "initial learning rate"))
        self._optimizer_state.initial_learning_rate = value
        self._hyperparameters = self._hyperparameters.with_learning_rate(value)

    @property
    def completed_steps(self) -> int:
        """Number of optimizer steps taken, including those restored from the checkpoint."""
        return int(self._optimizer_state.step)

    @property
    def _optimizer_state(self) -> OptimizerState:
        return optimizer_group(self.state)

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters, in the training graph's order."""
        return [self.state.params[name] for name in self.param_names]
