"""``Optimizer`` and LR schedulers: the faces of ``onnxruntime.training.api`` over the optimizer core."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, cast

import onnx

from ort_torch_train.api.protocols import TrainableModule
from ort_torch_train.distributed.data_parallel import require_same_learning_rate, require_same_optimizer_state
from ort_torch_train.distributed.zero import ShardedTensors
from ort_torch_train.errors import DistributedError
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.optimizer_model import OptimizerSpec, load_optimizer_model, read_optimizer_model
from ort_torch_train.optim.schedulers import (
    check_schedule_counts,
    check_schedule_not_over,
    constant_with_warmup,
    cosine_with_warmup,
    linear_with_warmup,
    scheduled_learning_rate,
)

if TYPE_CHECKING:  # FSDP2 loads Dynamo's shape machinery: a sharded Module has imported it
    from ort_torch_train.distributed.fully_sharded import FullyShardedParallel
    from ort_torch_train.distributed.pipeline import PipelineParallel
    from ort_torch_train.distributed.tensor_parallel_ranks import TensorParallelRanks
from ort_torch_train.optim.torch_adapter import TorchOptimizerAdapter
from ort_torch_train.state.loss_scale import LossScaler


class Optimizer:
    """Updates a Module's trainable parameters from their accumulated gradients.

    Args:
        optimizer_uri: the optimizer model (path, bytes or ModelProto; ONNX or ORT format) from ``generate_artifacts``.
        module: the Module to train (its ``training_state`` and ``trainable_parameter_names``).
        implementation: the update kernel, beyond ORT's API: "fused" (default where it applies),
            "foreach"/"single" (ORT's exact float32 op order) or "compiled" (torch.compile'd).
            ``Module.step(optimizer, ...)`` on a ``compile=True`` module runs the update inside its
            compiled train step instead; on a ``compile="package:DIR"`` module with none asked for, the
            package's own update runs, where the package was built from this optimizer model.
        shard_state: ZeRO stage 1 on a ``Module(distributed=True)``: each rank keeps and updates
            only its shard of the optimizer state (``distributed/zero.py``).

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.api import CheckpointState, Module, Optimizer

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)
        optimizer.set_learning_rate(1e-3)
        loss = module.step(optimizer, x, y)  # module(x, y); optimizer.step(); module.lazy_reset_grad()
        assert optimizer.get_learning_rate() == np.float32(1e-3)
        ```
    """

    def __init__(
        self,
        optimizer_uri: str | os.PathLike | bytes | onnx.ModelProto,
        module: TrainableModule,
        *,
        implementation: str | None = None,
        shard_state: bool = False,
    ) -> None:
        model = load_optimizer_model(optimizer_uri)
        spec = read_optimizer_model(model)
        data_parallel = module.data_parallel
        if data_parallel is not None:  # ranks that would diverge: refused before any step
            require_same_optimizer_state(module.training_state, spec, data_parallel.group)
        self._learning_rate_unchecked_in = None if data_parallel is None else data_parallel.group
        precision = module.precision
        loss_scaler = None if precision is None else precision.loss_scaler
        self._engine: OptimizerEngine
        holder: FullyShardedParallel | TensorParallelRanks | PipelineParallel | None = None  # holds part of the state
        if data_parallel is not None and data_parallel.shards_parameters:  # the kernels run on the shards
            holder = cast("FullyShardedParallel | TensorParallelRanks", data_parallel)
            if shard_state and holder.data_parallel_size > 1:  # one replica: nothing more to slice
                raise DistributedError(
                    "Optimizer(shard_state=True): a sharded (or tensor-parallel) Module's moments are sharded already"
                )
        elif module.pipeline is not None:  # the kernels run on this rank's stage
            holder = module.pipeline
            if shard_state:
                raise DistributedError("Optimizer(shard_state=True): a pipeline stage's moments are its own already")
        if holder is not None:
            self._engine = holder.optimizer_engine(
                OptimizerEngine,
                spec=spec,
                state=module.training_state,
                param_names=module.trainable_parameter_names,
                implementation=implementation,
                loss_scaler=loss_scaler,
            )
        elif shard_state:
            self._engine = _sharded_engine(spec, module, implementation, loss_scaler)
        else:  # a package's own update where it was built from this model, unless another kernel is asked for
            program = module.update_program(model) if implementation is None and loss_scaler is None else None
            self._engine = OptimizerEngine(
                spec,
                module.training_state,
                module.trainable_parameter_names,
                implementation=implementation,
                loss_scaler=loss_scaler,
                program=program,
            )
        self._torch_optimizer: TorchOptimizerAdapter | None = None

    def step(self) -> None:
        """Update the parameters with the optimizer model's algorithm and count the step."""
        engine = self._engine
        with engine.state.lock:
            if self._learning_rate_unchecked_in is not None:
                self._require_same_learning_rate()
            if self._torch_optimizer is not None:
                self._torch_optimizer.step()
            else:
                engine.step()

    @property
    def last_step_skipped(self) -> bool:
        """Whether the last ``step()`` was skipped because fp16 gradients held inf or nan."""
        return self._engine.last_step_skipped

    @property
    def skipped_steps(self) -> int:
        """How many steps this optimizer skipped for inf/nan gradients (fp16 loss scaling)."""
        return self._engine.skipped_steps

    def engine_for_step(self) -> OptimizerEngine:
        """The optimizer core with the current learning rate applied, for a fused train step."""
        if self._torch_optimizer is not None:
            self._torch_optimizer.pull_learning_rate()
        if self._learning_rate_unchecked_in is not None:
            self._require_same_learning_rate()
        return self._engine

    def _require_same_learning_rate(self) -> None:
        """At the first step of a distributed run: the ranks' learning rates must agree (a collective)."""
        group, self._learning_rate_unchecked_in = self._learning_rate_unchecked_in, None
        if group is not None:
            if self._torch_optimizer is not None:
                self._torch_optimizer.pull_learning_rate()
            require_same_learning_rate(self._engine.learning_rate, group, self._engine.state.device)

    def set_learning_rate(self, learning_rate: float) -> None:
        """Set the learning rate (float32; NaN, infinite or negative values raise ValueError)."""
        self._engine.set_learning_rate(learning_rate)
        if self._torch_optimizer is not None:
            self._torch_optimizer.param_groups[0]["lr"] = self._engine.learning_rate

    def get_learning_rate(self) -> float:
        """The current learning rate (the float32 value the next step uses)."""
        if self._torch_optimizer is not None:
            self._torch_optimizer.pull_learning_rate()
        return self._engine.learning_rate

    @property
    def torch_optimizer(self) -> TorchOptimizerAdapter:
        """A ``torch.optim.Optimizer`` over the same state, for ``torch.optim.lr_scheduler``.

        From the first access on, its ``param_groups[0]["lr"]`` is the learning rate: schedulers
        write it, ``step()`` applies it, ``set_learning_rate`` updates it.
        """
        if self._torch_optimizer is None:
            self._torch_optimizer = TorchOptimizerAdapter(self._engine)
        return self._torch_optimizer


class _MultiplicativeLRScheduler:
    """Sets ``initial_lr * factor(completed steps)`` on the optimizer at construction and each step()."""

    def __init__(self, optimizer: Optimizer, initial_lr: float) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer must be an ort_torch_train Optimizer; got {type(optimizer).__name__}")
        self._optimizer = optimizer
        self._check_not_over(optimizer._engine.completed_steps)
        optimizer._engine.set_initial_learning_rate(initial_lr)
        self.step()

    def _check_not_over(self, completed_steps: int) -> None:
        """Raise if the schedule, started after ``completed_steps`` steps, could only give learning rate 0."""

    def step(self) -> None:
        """Recompute the learning rate from the optimizer's completed-step count."""
        engine = self._optimizer._engine
        factor = self._factor(engine.completed_steps)
        self._optimizer.set_learning_rate(scheduled_learning_rate(engine.initial_learning_rate, factor))

    def _factor(self, step: int) -> float:
        raise NotImplementedError


class LinearLRScheduler(_MultiplicativeLRScheduler):
    """Linear warmup from 0 to ``initial_lr`` over ``warmup_step_count`` steps, then linear decay to 0
    at ``total_step_count`` (ORT's documented semantics; see ``linear_with_warmup``).

    Note: onnxruntime-training 1.19.2's Python binding swaps ``warmup_step_count`` and
    ``total_step_count`` when they are passed positionally; this class implements the documented
    behaviour. To replay an ORT 1.19.2 run, pass the two counts in swapped order.

    Args:
        optimizer: the Optimizer whose learning rate it sets.
        warmup_step_count: steps of linear warmup from 0.
        total_step_count: the step at which the rate reaches 0.
        initial_lr: the peak learning rate.

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.api import CheckpointState, Module, Optimizer, LinearLRScheduler

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)
        scheduler = LinearLRScheduler(optimizer, warmup_step_count=2, total_step_count=10, initial_lr=1e-3)
        for step in range(10):
            module.step(optimizer, x, y)
            scheduler.step()  # after optimizer.step(), as in ORT's loop
        ```
    """

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, total_step_count: int, initial_lr: float) -> None:
        check_schedule_counts(warmup_step_count, total_step_count)
        self.warmup_step_count = warmup_step_count
        self.total_step_count = total_step_count
        super().__init__(optimizer, initial_lr)

    def _check_not_over(self, completed_steps: int) -> None:
        check_schedule_not_over(type(self).__name__, completed_steps, self.total_step_count)

    def _factor(self, step: int) -> float:
        return linear_with_warmup(step, self.warmup_step_count, self.total_step_count)


class CosineLRScheduler(_MultiplicativeLRScheduler):
    """Linear warmup to ``initial_lr``, then cosine decay to ``min_lr_ratio * initial_lr`` at
    ``total_step_count``.

    Args:
        optimizer: the Optimizer whose learning rate it sets.
        warmup_step_count: steps of linear warmup from 0.
        total_step_count: the step at which the cosine ends.
        initial_lr: the peak learning rate.
        min_lr_ratio: the final rate as a share of ``initial_lr``.

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.api import CheckpointState, Module, Optimizer, CosineLRScheduler

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)
        scheduler = CosineLRScheduler(optimizer, warmup_step_count=2, total_step_count=10, initial_lr=1e-3, min_lr_ratio=0.1)
        for step in range(10):
            module.step(optimizer, x, y)
            scheduler.step()
        ```
    """

    def __init__(
        self,
        optimizer: Optimizer,
        warmup_step_count: int,
        total_step_count: int,
        initial_lr: float,
        min_lr_ratio: float = 0.0,
    ) -> None:
        check_schedule_counts(warmup_step_count, total_step_count)
        cosine_with_warmup(0, warmup_step_count, total_step_count, min_lr_ratio)  # validates min_lr_ratio
        self.warmup_step_count = warmup_step_count
        self.total_step_count = total_step_count
        self.min_lr_ratio = min_lr_ratio
        super().__init__(optimizer, initial_lr)

    def _check_not_over(self, completed_steps: int) -> None:
        if self.min_lr_ratio == 0:
            check_schedule_not_over(type(self).__name__, completed_steps, self.total_step_count)

    def _factor(self, step: int) -> float:
        return cosine_with_warmup(step, self.warmup_step_count, self.total_step_count, self.min_lr_ratio)


class ConstantWithWarmupLRScheduler(_MultiplicativeLRScheduler):
    """Linear warmup to ``initial_lr`` over ``warmup_step_count`` steps, then constant.

    Args:
        optimizer: the Optimizer whose learning rate it sets.
        warmup_step_count: steps of linear warmup from 0.
        initial_lr: the rate after warmup.

    Examples:
        ```python
        import numpy as np
        from ort_torch_train.api import CheckpointState, Module, Optimizer, ConstantWithWarmupLRScheduler

        state = CheckpointState.load_checkpoint("artifacts/checkpoint")  # the README Quick start's artifacts
        module = Module("artifacts/training_model.onnx", state, "artifacts/eval_model.onnx")
        optimizer = Optimizer("artifacts/optimizer_model.onnx", module)
        x = np.random.default_rng(0).standard_normal((16, 20), dtype=np.float32)
        y = x[:, :5].argmax(axis=1)
        scheduler = ConstantWithWarmupLRScheduler(optimizer, warmup_step_count=3, initial_lr=1e-3)
        for step in range(5):
            module.step(optimizer, x, y)
            scheduler.step()
        ```
    """

    def __init__(self, optimizer: Optimizer, warmup_step_count: int, initial_lr: float) -> None:
        constant_with_warmup(0, warmup_step_count)  # validates warmup_step_count
        self.warmup_step_count = warmup_step_count
        super().__init__(optimizer, initial_lr)

    def _factor(self, step: int) -> float:
        return constant_with_warmup(step, self.warmup_step_count)


def _sharded_engine(
    spec: OptimizerSpec, module: TrainableModule, implementation: str | None, loss_scaler: LossScaler | None
) -> OptimizerEngine:
    """A ZeRO-1 optimizer engine over a distributed module's trainable parameters, whose checkpoints
    save the moments gathered from every rank's shard."""
    data_parallel = module.data_parallel
    if data_parallel is None:
        raise DistributedError(
            "Optimizer(shard_state=True) needs a distributed Module (Module(..., distributed=True)); this one is not"
        )
    state, names = module.training_state, module.trainable_parameter_names
    shards = ShardedTensors(state, names, data_parallel.group)
    engine = OptimizerEngine(spec, state, names, implementation=implementation, loss_scaler=loss_scaler, tensors=shards)
    data_parallel.checkpoint.gather_moments_from(engine, shards)
    return engine
