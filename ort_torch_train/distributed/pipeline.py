"""Pipeline-parallel training on torch.distributed.pipelining: the training graph cut into stages
(``pipeline_plan.py``), stage ``k`` run by rank ``k`` of the group as a ``PipelineStage`` under
``ScheduleGPipe`` or ``Schedule1F1B``.

Each batch is split into ``micro_batches`` equal parts along axis 0. The last stage's loss for a
micro-batch is scaled so that the micro-batches' gradients add up to the full batch's (by
``1 / micro_batches`` for a mean over the batch, 1 for a sum), and the step returns the batch's loss
(their mean or sum) on every rank. The schedules do not rescale the gradients (``scale_grads=False``),
so they accumulate across steps as ORT's do until ``lazy_reset_grad``.

Each rank holds its stage's state only (``pipeline_state.py``): the parameters its stage reads, their
gradients and moments; the other stages' parameters are storage-less placeholders. The optimizer's
update (ORT's math, unchanged) runs on each stage's own parameters, the gradient clip on the norm of
every stage's gradients together. Reading a parameter's whole value (``state.parameters[name]``) and
saving a checkpoint are collectives: the value is broadcast from its stage's rank, and rank 0 writes
what one process writes. An eval step gathers the eval graph's parameters from their stages to every
rank (a collective) and runs there. A parameter that several stages read (a tied embedding) is held
by each of them, its gradient summed over them after the backward (``pipeline_state.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import onnx
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ort_torch_train.convert.graph import TensorSpec, convert_graph
from ort_torch_train.distributed.data_parallel import require_identical
from ort_torch_train.distributed.pipeline_plan import PipelineOptions, StageGraph, cut_graph, loss_reduction
from ort_torch_train.distributed.pipeline_state import (
    PipelineCheckpoint,
    SharedGradients,
    StageOwnership,
    StageParameters,
    keep_stage_only,
    stage_optimizer_engine,
)
from ort_torch_train.errors import DistributedError, InputError
from ort_torch_train.graph.layout import GraphLayout
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.passes.pipeline import run_eager
from ort_torch_train.state.training_state import TrainingState

_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
_SIGNATURES_KEPT = 8  # input signatures whose conversions and schedules are kept (a last partial batch adds one)
_COLLECTIVE_WORDS = ("gloo", "Gloo", "NCCL", "nccl", "timed out", "Timed out", "Connection", "closed", "peer")


class _StageRunner:
    """One stage's graph run as torch code, converted (and rewritten for eager runs) once per input signature."""

    def __init__(self, stage: StageGraph, opsets: dict[str, int], device: torch.device) -> None:
        self.stage = stage
        self.opsets = opsets
        self.device = device
        self._modules: dict[tuple, Callable[..., Any]] = {}

    def __call__(self, inputs: Sequence[Tensor], params: Sequence[Tensor]) -> tuple[Tensor, ...]:
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        module = self._modules.get(key)
        if module is None:
            examples = (*inputs, *params)
            converted = convert_graph(
                self.stage.graph,
                self.opsets,
                [TensorSpec(tuple(t.shape), t.dtype) for t in examples],
                training=True,
                examples=examples,
                constants=self.stage.constants,
            )
            module = self._modules[key] = run_eager(converted, self.device).to(self.device)
            _forget_oldest(self._modules)
        return tuple(module(*inputs, *params))


class _StageModule(nn.Module):
    """A stage over the state's own Parameter objects, as PipelineStage wants it: activations in, out.
    The last stage gives the loss as a 1-element tensor (the micro-batches' losses concatenate)."""

    def __init__(self, runner: _StageRunner, params: Sequence[nn.Parameter], last: bool) -> None:
        super().__init__()
        self.params = nn.ParameterList(params)
        self._runner = runner
        self._last = last

    def forward(self, *activations: Tensor) -> tuple[Tensor, ...]:
        outputs = self._runner(activations, list(self.params))
        if not self._last:
            return tuple(output.contiguous() for output in outputs)  # sent as they are laid out
        names = self._runner.stage.outputs
        scalars = [names[i] for i, output in enumerate(outputs[1:], 1) if output.dim() == 0]
        if scalars:
            raise InputError(
                f"pipeline: the training graph's outputs {scalars} are scalars; only the loss may be one "
                "(the other outputs are concatenated across micro-batches)"
            )
        return (outputs[0].reshape(1), *outputs[1:])


class PipelineParallel:
    """Runs a training graph's train steps as a pipeline across the ranks of ``group`` (see the module doc)."""

    def __init__(
        self,
        stages: Sequence[StageGraph],
        opsets: dict[str, int],
        state: TrainingState,
        options: PipelineOptions,
        group: Any,
        reduction: str,
        device: torch.device,
    ) -> None:
        self.options = options
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.reduction = reduction
        self._device = device
        self.ownership = StageOwnership([stage.params for stage in stages], list(state.params), group, device)
        self.checkpoint = PipelineCheckpoint(group, self.ownership)
        self._shared = SharedGradients(self.ownership, state.params)  # a collective: subgroups made by all
        self._last_rank = (
            dist.get_global_rank(group, len(stages) - 1) if group is not dist.group.WORLD else len(stages) - 1
        )
        params = [state.params[name] for name in stages[self.rank].params]
        self._trainable = [param for param in params if param.requires_grad]
        self._module = _StageModule(_StageRunner(stages[self.rank], opsets, device), params, self.is_last)
        self._schedules: dict[tuple, Any] = {}  # by the micro-batch's input signature
        self._target = torch.zeros(options.micro_batches, device=device)  # one entry per micro-batch

    @property
    def is_last(self) -> bool:
        """Whether this rank runs the last stage (the one computing the loss)."""
        return self.rank == self.world_size - 1

    def _micro_batch_loss(self, outputs: tuple[Tensor, ...], target: Tensor) -> Tensor:
        scale = 1.0 / self.options.micro_batches if self.reduction == "mean" else 1.0
        return outputs[0].sum() * scale

    def train_step(self, inputs: Sequence[Tensor], reset: bool) -> tuple[Tensor, ...]:
        """Forward and backward of one batch through the pipeline (gradients zeroed first when ``reset``);
        the training graph's outputs, the same on every rank."""
        self._check_batch(inputs)
        for param in self._trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            elif reset:
                param.grad.zero_()  # in place: the gradient tensors are never replaced
        earlier = self._shared.set_aside(reset)
        try:
            schedule = self._schedule_for(inputs)
            if self.rank == 0:
                merged = schedule.step(*inputs, target=self._target if self.is_last else None)
            elif self.is_last:
                merged = schedule.step(target=self._target)
            else:
                merged = schedule.step()
            self._shared.sum_over_holders(earlier)
            outputs = self._batch_outputs(merged) if self.is_last else None
            payload: list[Any] = [outputs]
            dist.broadcast_object_list(payload, src=self._last_rank, group=self.group)
        except RuntimeError as error:
            if any(word in str(error) for word in _COLLECTIVE_WORDS):
                raise DistributedError(
                    f"pipeline train step on rank {self.rank} of {self.world_size}: a collective failed "
                    f"(a rank died, timed out or diverged): {error}"
                ) from error
            raise
        return tuple(payload[0])

    def _schedule_for(self, inputs: Sequence[Tensor]) -> Any:
        """The schedule over this stage for micro-batches of these inputs' shapes, its PipelineStage given
        its inputs' and outputs' shapes: found by running the first micro-batch through the stages, each
        rank sending its stage's outputs to the next (every rank gets the batch; the ranks build a
        schedule for the same signatures at the same step)."""
        micro_batch = [tensor[: tensor.shape[0] // self.options.micro_batches] for tensor in inputs]
        key = tuple((tuple(t.shape), t.dtype) for t in micro_batch)
        schedule = self._schedules.get(key)
        if schedule is not None:
            return schedule
        values = tuple(_example(value) for value in micro_batch) if self.rank == 0 else self._receive_examples()
        outputs = tuple(_example(value) for value in self._module(*values))
        if not self.is_last:
            sent = [[(value.detach().cpu(), value.requires_grad) for value in outputs]]
            dist.send_object_list(sent, group=self.group, group_dst=self.rank + 1)
        stage = PipelineStage(
            self._module,
            self.rank,
            self.world_size,
            self._device,
            input_args=values,
            output_args=outputs,
            group=self.group,
        )
        schedule = self._schedules[key] = _SCHEDULES[self.options.schedule](
            stage, n_microbatches=self.options.micro_batches, loss_fn=self._micro_batch_loss, scale_grads=False
        )
        _forget_oldest(self._schedules)
        return schedule

    def _receive_examples(self) -> tuple[Tensor, ...]:
        """The previous stage's outputs for the first micro-batch, as this stage's example inputs."""
        received: list[Any] = [None]
        dist.recv_object_list(received, group=self.group, group_src=self.rank - 1)
        return tuple(value.to(self._device).requires_grad_(grad) for value, grad in received[0])

    def optimizer_engine(self, engine: type[OptimizerEngine], **arguments: Any) -> OptimizerEngine:
        """An optimizer engine (built as ``engine(**arguments, tensors=...)``) whose kernels run on this
        stage's parameters."""
        return stage_optimizer_engine(self.ownership, engine, **arguments)

    def _check_batch(self, inputs: Sequence[Tensor]) -> None:
        count = self.options.micro_batches
        for position, tensor in enumerate(inputs):
            if tensor.dim() == 0 or tensor.shape[0] % count:
                size = "a scalar" if tensor.dim() == 0 else f"a batch of {tensor.shape[0]}"
                raise InputError(
                    f"pipeline micro_batches={count}: input {position} holds {size}; every input's axis 0 must "
                    f"divide into {count} equal micro-batches"
                )

    def _batch_outputs(self, merged: Any) -> tuple[Tensor, ...]:
        """The training graph's outputs for the whole batch from the last stage's merged micro-batch outputs."""
        merged = tuple(merged) if isinstance(merged, (tuple, list)) else (merged,)
        losses = merged[0].detach()
        loss = losses.mean() if self.reduction == "mean" else losses.sum()
        return (loss, *(output.detach() for output in merged[1:]))


def _forget_oldest(cache: dict) -> None:
    while len(cache) > _SIGNATURES_KEPT:
        del cache[next(iter(cache))]


def _example(value: Tensor) -> Tensor:
    """``value`` cut from its autograd graph, still marked as needing a gradient when it did."""
    return value.detach().contiguous().requires_grad_(value.requires_grad)


def _settings_digest(options: PipelineOptions, device: torch.device) -> Tensor:
    digest = hashlib.blake2b(repr(options).encode(), digest_size=32).digest()
    return torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)


def pipeline_parallel(
    graph: onnx.GraphProto,
    opsets: dict[str, int],
    layout: GraphLayout,
    constants: Mapping[str, Tensor],
    state: TrainingState,
    options: PipelineOptions,
    group: Any,
) -> PipelineParallel:
    """Pipeline parallelism for the forward training ``graph`` (its ``layout``'s user inputs, then
    parameters) over ``state``: checks on every rank, before any step, that the ranks share the
    settings, that there is a rank per stage and a parameter set, then cuts the graph. From now on the
    state holds this rank's stage only, its whole parameters are read from their stages and its
    checkpoints are gathered to rank 0, which writes them (a collective)."""
    state.require_loaded("perform pipeline-parallel training")
    device = next(iter(state.params.values())).device if state.params else torch.device("cpu")
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    require_identical(
        {"pipeline": _settings_digest(options, device)},
        group,
        "pipeline settings",
        f"every rank must pass the same pipeline options (this rank: {options})",
    )
    if world_size != options.stages:
        raise DistributedError(
            f"pipeline stages={options.stages}: expected one rank per stage, the process group has {world_size} "
            f"ranks (rank {rank}); launch {options.stages} processes"
        )
    stages = cut_graph(
        graph, layout.user_inputs, {name: state.params[name].numel() for name in layout.params}, constants, options
    )
    reduction = loss_reduction(graph, layout.user_outputs[0]) if options.micro_batches > 1 else "mean"
    require_identical(dict(state.params), group, "parameters")
    parallel = PipelineParallel(stages, opsets, state, options, group, reduction, device)
    keep_stage_only(state, parallel.ownership)
    state.coordinate_reads(StageParameters(state, parallel.ownership))
    state.coordinate_saves(parallel.checkpoint)
    return parallel
