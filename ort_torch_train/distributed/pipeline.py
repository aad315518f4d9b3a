"""Pipeline-parallel training on torch.distributed.pipelining: the training graph cut into stages
(``pipeline_plan.py``), stage ``k`` run by rank ``k`` of the group as a ``PipelineStage`` under
``ScheduleGPipe`` or ``Schedule1F1B``.

Each batch is split into ``micro_batches`` equal parts along axis 0. The last stage's loss for a
micro-batch is scaled so that the micro-batches' gradients add up to the full batch's (by
``1 / micro_batches`` for a mean over the batch, 1 for a sum), and the step returns the batch's loss
(their mean or sum) on every rank. The schedules do not rescale the gradients (``scale_grads=False``),
so they accumulate across steps as ORT's do until ``lazy_reset_grad``.

Every rank keeps the whole state: after a step each stage's gradients are broadcast from the rank
that computed them, so the optimizer's update (ORT's math, unchanged) gives every rank the same
parameters, rank 0 writes the checkpoint (``DistributedCheckpoint``) and eval runs locally.
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
from ort_torch_train.distributed.checkpoint import DistributedCheckpoint
from ort_torch_train.distributed.data_parallel import require_identical
from ort_torch_train.distributed.pipeline_plan import PipelineOptions, StageGraph, cut_graph, loss_reduction
from ort_torch_train.errors import DistributedError, InputError
from ort_torch_train.graph.layout import GraphLayout
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
    ) -> None:
        self.options = options
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.reduction = reduction
        self.checkpoint = DistributedCheckpoint(group)
        self._last_rank = (
            dist.get_global_rank(group, len(stages) - 1) if group is not dist.group.WORLD else len(stages) - 1
        )
        params = state.params
        self._stage_params = [[params[name] for name in stage.params] for stage in stages]
        self._stage_grads = [[param for param in stage if param.requires_grad] for stage in self._stage_params]
        self._device = next(iter(params.values())).device if params else torch.device("cpu")
        # this stage's runner and those before it (their outputs give this stage's example inputs)
        self._runners = [_StageRunner(stage, opsets, self._device) for stage in stages[: self.rank + 1]]
        self._module = _StageModule(self._runners[self.rank], self._stage_params[self.rank], self.is_last)
        self._schedules: dict[tuple, Any] = {}  # by the micro-batch's input signature
        self._target = torch.zeros(options.micro_batches, device=self._device)  # one entry per micro-batch

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
        trainable = [param for stage in self._stage_grads for param in stage]
        for param in trainable:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            elif reset:
                param.grad.zero_()  # in place: the gradient tensors are never replaced
        try:
            schedule = self._schedule_for(inputs)
            if self.rank == 0:
                merged = schedule.step(*inputs, target=self._target if self.is_last else None)
            elif self.is_last:
                merged = schedule.step(target=self._target)
            else:
                merged = schedule.step()
            outputs = self._batch_outputs(merged) if self.is_last else None
            payload: list[Any] = [outputs]
            dist.broadcast_object_list(payload, src=self._last_rank, group=self.group)
            self._share_gradients()
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
        its inputs' and outputs' shapes: found by running the stages up to this one on the first
        micro-batch (every rank holds every parameter and gets the batch)."""
        micro_batch = [tensor[: tensor.shape[0] // self.options.micro_batches] for tensor in inputs]
        key = tuple((tuple(t.shape), t.dtype) for t in micro_batch)
        schedule = self._schedules.get(key)
        if schedule is not None:
            return schedule
        values: tuple[Tensor, ...] = tuple(micro_batch)
        for index, runner in enumerate(self._runners[:-1]):
            values = tuple(_example(value) for value in runner(values, self._stage_params[index]))
        outputs = tuple(_example(value) for value in self._module(*values))
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

    def _share_gradients(self) -> None:
        """Every stage's gradients broadcast from the rank that computed them to the others."""
        with torch.no_grad():
            for stage, params in enumerate(self._stage_grads):
                if not params:
                    continue
                grads = [param.grad for param in params]
                source = dist.get_global_rank(self.group, stage) if self.group is not dist.group.WORLD else stage
                flat = torch.cat([grad.reshape(-1) for grad in grads])  # type: ignore[union-attr]
                dist.broadcast(flat, src=source, group=self.group)
                if stage != self.rank:
                    for grad, part in zip(grads, flat.split([grad.numel() for grad in grads])):  # type: ignore[union-attr]
                        grad.copy_(part.view_as(grad))  # type: ignore[union-attr]


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
    settings, that there is a rank per stage and a parameter set, then cuts the graph; from now on the
    state's checkpoints are written once, by rank 0."""
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
    parallel = PipelineParallel(stages, opsets, state, options, group, reduction)
    state.coordinate_saves(parallel.checkpoint)
    return parallel
