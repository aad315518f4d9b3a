"""A pipeline stage's own state: each rank holds the parameters its stage reads, their gradients and
their optimizer moments, and nothing of the other stages.

The parameters of the other stages stay in the state's table (their names, shapes, dtypes and
trainable flags give the checkpoint its layout) as storage-less placeholders on the "meta" device,
without gradient or moments. What reads whole values does so collectively, as a sharded run does:
``TrainingState.whole_parameter`` (``state.parameters[name]``) broadcasts the value from the rank
of its stage (``StageParameters``), and a checkpoint save gathers every stage's parameters and
moments the same way before rank 0 writes what one process writes (``PipelineCheckpoint``). The
optimizer's kernels run on this stage's parameters only (``StageTensors``); the gradient clip uses
the norm of every stage's gradients together (one all-reduce of the squared norms).

A parameter that several stages read (a tied embedding) is held whole by each of them, as Megatron
holds its embedding: after each backward its gradient is summed over its holders (``SharedGradients``:
one all-reduce on a subgroup of those ranks), so every holder applies the same update to the same
values and moments; the clip counts it once (on its first holder), and a checkpoint reads it from its
first holder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ort_torch_train.distributed.checkpoint import DistributedCheckpoint
from ort_torch_train.errors import DistributedError
from ort_torch_train.optim.algorithm import OptimizerAlgorithm
from ort_torch_train.optim.clip import clip_grad_norm_, global_norm, scale_to_norm
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.tensor_lists import KernelTensors, WholeTensors
from ort_torch_train.state.training_state import TrainingState

PLACEHOLDER_DEVICE = torch.device("meta")  # where another stage's parameters are: shape and dtype, no storage


class StageOwnership:
    """Which ranks of the pipeline ``group`` hold each of the state's parameters ``names``: the ranks of the
    stages reading it (``stage_params``: each stage's), rank 0 for a parameter that no stage reads. A
    parameter read by several stages (a tied embedding) is held whole by each of them; its first holder
    (``stage_of``) is the one that sends its value and counts its gradient in the clip's norm."""

    def __init__(
        self, stage_params: Sequence[Sequence[str]], names: Sequence[str], group: Any, device: torch.device
    ) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.device = device
        self.stages = len(stage_params)
        holders: dict[str, list[int]] = {name: [] for name in names}
        for stage, read in enumerate(stage_params):
            for name in read:
                holders[name].append(stage)
        self.holders = {name: tuple(stages) or (0,) for name, stages in holders.items()}
        self.stage_of = {name: stages[0] for name, stages in self.holders.items()}
        self.held = tuple(name for name, stages in self.holders.items() if self.rank in stages)
        self.shared = tuple(name for name in self.held if len(self.holders[name]) > 1)

    def counts(self, name: str) -> bool:
        """Whether this rank counts ``name`` once for the whole pipeline (it is its first holder)."""
        return self.stage_of[name] == self.rank

    def broadcast(self, held: Tensor | None, shape: Sequence[int], dtype: torch.dtype, name: str) -> Tensor:
        """``held`` (on the rank holding ``name``) sent to every rank of the group: a collective."""
        stage = self.stage_of[name]
        if stage == self.rank:
            assert held is not None  # the owner holds its own values
            value = held.detach().contiguous()
        else:
            value = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        dist.broadcast(value, group=self.group, group_src=stage)
        return value


class SharedGradients:
    """Sums the gradients of the parameters several stages hold over their holders after each backward
    (one all-reduce per set of holders, on a subgroup of their ranks), leaving what earlier steps
    accumulated as it was. Made on every rank of the pipeline at once: each subgroup is made by all."""

    def __init__(self, ownership: StageOwnership, params: Mapping[str, nn.Parameter]) -> None:
        group = ownership.group
        sets: dict[tuple[int, ...], list[str]] = {}
        for name, stages in ownership.holders.items():  # the same order on every rank
            if len(stages) > 1:
                sets.setdefault(stages, []).append(name)
        self._sums: list[tuple[Any, list[nn.Parameter]]] = []
        for stages, names in sets.items():
            ranks = [stage if group is dist.group.WORLD else dist.get_global_rank(group, stage) for stage in stages]
            subgroup = dist.new_group(ranks)
            trained = [params[name] for name in names if params[name].requires_grad]
            if ownership.rank in stages and trained:
                self._sums.append((subgroup, trained))

    @torch.no_grad()
    def set_aside(self, reset: bool) -> list[Tensor | None]:
        """The gradients accumulated so far of this rank's shared parameters (``None`` where there are
        none or ``reset`` drops them), which are zeroed: call before a backward."""
        earlier: list[Tensor | None] = []
        for _, params in self._sums:
            for param in params:
                grad = param.grad
                earlier.append(None if grad is None or reset else grad.clone())
                if grad is not None:
                    grad.zero_()
        return earlier

    @torch.no_grad()
    def sum_over_holders(self, earlier: Sequence[Tensor | None]) -> None:
        """After a backward: each shared gradient is this step's sum over its holders, plus ``earlier``."""
        earlier_of = iter(earlier)
        for subgroup, params in self._sums:
            grads = [param.grad if param.grad is not None else torch.zeros_like(param) for param in params]
            flat = torch.cat([grad.reshape(-1) for grad in grads])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=subgroup)
            for param, piece in zip(params, flat.split([grad.numel() for grad in grads])):
                total = piece.view_as(param)
                before = next(earlier_of)
                if before is not None:
                    total = total + before
                if param.grad is None:
                    param.grad = total.clone()
                else:
                    param.grad.copy_(total)  # in place: the gradient tensors are never replaced


def keep_stage_only(state: TrainingState, ownership: StageOwnership) -> None:
    """Replace the parameters that no node of this rank's stage reads by placeholders (no storage, no
    gradient) and drop their moments; a new generation of the state's tensors starts."""
    held = set(ownership.held)
    others = [name for name in state.params if name not in held]
    for name in others:
        param = state.params[name]
        state.params[name] = nn.Parameter(
            torch.empty(param.shape, dtype=param.dtype, device=PLACEHOLDER_DEVICE), requires_grad=param.requires_grad
        )
    if state.optimizer is not None:
        for name in others:
            state.optimizer.momentums.pop(name, None)
    state.follow_parameters()


class StageParameters:
    """A pipeline state's ``ParameterSource``: whole values broadcast from the rank of their stage."""

    def __init__(self, state: TrainingState, ownership: StageOwnership) -> None:
        self._state = state
        self._ownership = ownership

    def whole(self, name: str) -> Tensor:
        """Parameter ``name``'s value on every rank (a collective: every rank of the pipeline calls it)."""
        param = self._state.params[name]
        try:
            return self._ownership.broadcast(param, param.shape, param.dtype, name)
        except RuntimeError as error:
            raise DistributedError(
                f"reading parameter {name!r} of a pipeline: every rank must read it (its stage "
                f"{self._ownership.stage_of[name]} sends it); a rank died, timed out or read another: {error}"
            ) from error


class StageTensors(WholeTensors):
    """An OptimizerEngine's tensor provider for one pipeline stage: this stage's trainable parameters,
    their gradients and moments; the clip's norm that of every stage's gradients together."""

    fuses_into_step = False

    def __init__(self, ownership: StageOwnership) -> None:
        self.ownership = ownership
        self._counted: list[nn.Parameter] = []  # the parameters whose gradients this rank adds to the norm
        self._counts_all = True

    def kernel_tensors(
        self, state: TrainingState, param_names: Sequence[str], algorithm: OptimizerAlgorithm
    ) -> KernelTensors:
        """This stage's lists (``TensorProvider``)."""
        held = [name for name in param_names if name in set(self.ownership.held)]
        self._counted = [state.params[name] for name in held if self.ownership.counts(name)]
        self._counts_all = len(self._counted) == len(held)
        return super().kernel_tensors(state, held, algorithm)

    def clip_gradients(self, grads: list[Tensor], max_norm: float) -> None:
        """Clip by the norm of every stage's gradients together (one all-reduce), a parameter held by
        several stages counted once."""
        if self._counts_all:
            clip_grad_norm_(grads, max_norm, group=self.ownership.group)
            return
        counted = [param.grad for param in self._counted if param.grad is not None]
        squared = torch.zeros((), dtype=grads[0].dtype, device=grads[0].device)
        if counted:
            squared = global_norm(counted).square()
        dist.all_reduce(squared, op=dist.ReduceOp.SUM, group=self.ownership.group)
        scale_to_norm(grads, squared.sqrt(), max_norm)


class PipelineCheckpoint(DistributedCheckpoint):
    """Saves a pipeline's checkpoint: a collective (every stage's parameters and moments broadcast from
    its rank), then rank 0 writes what one process writes."""

    def __init__(self, group: Any, ownership: StageOwnership) -> None:
        super().__init__(group)
        self.ownership = ownership

    def gathered(
        self, state: TrainingState, target: str, include_optimizer_state: bool, counted: bool = False
    ) -> tuple[dict[str, Tensor] | None, dict[str, dict[str, Tensor]] | None]:
        """The whole parameters and (``include_optimizer_state``) moments, gathered from every stage."""
        if not counted:
            self._await_every_rank(target)
        with self._failures(target, "gathering every stage's parameters"), torch.no_grad():
            params = {
                name: self.ownership.broadcast(param, param.shape, param.dtype, name)
                for name, param in state.params.items()
            }
            if not include_optimizer_state or state.optimizer is None:
                return params, None
            return params, self._moments(state.optimizer.momentums)

    def _moments(self, momentums: Mapping[str, Mapping[str, Tensor]]) -> dict[str, dict[str, Tensor]]:
        """Every stage's moments on every rank: their names, shapes and dtypes first, then their values."""
        held = {
            name: [
                (key, tuple(moment.shape), str(moment.dtype).removeprefix("torch.")) for key, moment in moments.items()
            ]
            for name, moments in momentums.items()
        }
        layouts: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(layouts, held, group=self.group)
        whole: dict[str, dict[str, Tensor]] = {}
        for layout in layouts:
            for name, entries in layout.items():
                if name in whole:  # a parameter several stages hold: read from its first holder once
                    continue
                whole[name] = {
                    key: self.ownership.broadcast(momentums.get(name, {}).get(key), shape, getattr(torch, dtype), name)
                    for key, shape, dtype in entries
                }
        return whole


def held_bytes(state: TrainingState) -> int:
    """The bytes of parameters, gradients and optimizer moments this rank holds (placeholders hold none)."""
    tensors = [tensor for param in state.params.values() for tensor in (param, param.grad) if tensor is not None]
    if state.optimizer is not None:
        tensors += [moment for moments in state.optimizer.momentums.values() for moment in moments.values()]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors if tensor.device != PLACEHOLDER_DEVICE)


def stage_optimizer_engine(
    ownership: StageOwnership, engine: type[OptimizerEngine], **arguments: Any
) -> OptimizerEngine:
    """An optimizer engine (``engine(**arguments, tensors=...)``) whose kernels run on this stage's
    parameters; raises DistributedError on every rank when a stage trains no parameter."""
    trained = {stage for name in arguments["param_names"] for stage in ownership.holders.get(name, ())}
    idle = [stage for stage in range(ownership.stages) if stage not in trained]
    if idle:
        raise DistributedError(
            f"pipeline Optimizer: stages {idle} read no trained parameter, so their ranks have nothing to "
            "update; cut the graph so that every stage reads one"
        )
    return engine(**arguments, tensors=StageTensors(ownership))
