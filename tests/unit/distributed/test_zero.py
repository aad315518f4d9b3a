"""ZeRO stage 1 in one process: the sharded tensor provider (``distributed/zero.py``) on a gloo group of one rank,
where this rank's slices are the whole flattened tensors, against the plain optimizer engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ort_torch_train.api import CheckpointState, Module, Optimizer
from ort_torch_train.distributed.zero import FlatShard, ShardedTensors
from ort_torch_train.errors import DistributedError
from ort_torch_train.optim.adamw import ADAMW_ALGORITHM
from ort_torch_train.optim.engine import OptimizerEngine
from ort_torch_train.optim.optimizer_model import OptimizerSpec
from ort_torch_train.optim.sgd import SGD_ALGORITHM
from ort_torch_train.state.training_state import TrainingState
from tests.helpers import distributed_worker as worker
from tests.helpers.tolerances import assert_close_to_terms

NAMES = ["fc2.weight", "fc1.bias", "fc1.weight"]
SHAPES = {"fc1.weight": (8, 4), "fc1.bias": (8,), "fc2.weight": (3, 8)}
HF_ADAMW = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "weight_decay": 0.01, "adam_mode": 1, "correct_bias": 1}
SPECS = {
    "adamw": OptimizerSpec(ADAMW_ALGORITHM, ADAMW_ALGORITHM.hyperparameters(HF_ADAMW)),
    "adamw clipped": OptimizerSpec(ADAMW_ALGORITHM, ADAMW_ALGORITHM.hyperparameters(HF_ADAMW), clip_max_norm=0.5),
    "sgd clipped": OptimizerSpec(SGD_ALGORITHM, SGD_ALGORITHM.hyperparameters(), clip_max_norm=0.5),
}


@pytest.fixture
def group(tmp_path: Path) -> Iterator[dist.ProcessGroup]:
    """A gloo process group of this process alone, destroyed after the test."""
    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def make_state() -> TrainingState:
    gen = torch.Generator().manual_seed(0)
    return TrainingState({n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in SHAPES.items()})


def set_grads(state: TrainingState, step: int) -> None:
    gen = torch.Generator().manual_seed(1000 + step)
    for name in NAMES:
        state.params[name].grad.copy_(torch.randn(state.params[name].shape, generator=gen))


def term_magnitudes(steps: int) -> dict[str, dict[str, torch.Tensor]]:
    """Per parameter, the sum of the absolute values of the terms AdamW's moments sum over ``steps`` of
    ``set_grads`` (a clip only scales them down): (1 - beta) * beta**age * |g|, and the same with g**2."""
    beta1, beta2 = HF_ADAMW["alpha"], HF_ADAMW["beta"]
    sums = {name: {"momentum0": torch.zeros(SHAPES[name]), "momentum1": torch.zeros(SHAPES[name])} for name in NAMES}
    for step in range(steps):
        gen = torch.Generator().manual_seed(1000 + step)
        for name in NAMES:
            grad = torch.randn(SHAPES[name], generator=gen)
            sums[name]["momentum0"].mul_(beta1).add_((1 - beta1) * grad.abs())
            sums[name]["momentum1"].mul_(beta2).add_((1 - beta2) * grad.square())
    return sums


@pytest.mark.parametrize("name", list(SPECS))
def test_one_rank_steps_like_the_whole_tensors(group: dist.ProcessGroup, name: str) -> None:
    spec = SPECS[name]
    whole_state, sharded_state = make_state(), make_state()
    initial = make_state().params
    whole = OptimizerEngine(spec, whole_state, NAMES, implementation="foreach")
    sharded = OptimizerEngine(
        spec, sharded_state, NAMES, implementation="foreach", tensors=ShardedTensors(sharded_state, NAMES, group)
    )
    assert whole.fuses_into_step and not sharded.fuses_into_step
    for step in range(3):
        for state, engine in ((whole_state, whole), (sharded_state, sharded)):
            set_grads(state, step)
            engine.set_learning_rate(0.01)
            assert engine.step()
    assert sharded_state.optimizer.step == whole_state.optimizer.step == 3
    # the clip sums the norms in another order (per slice, not one buffer): its scale, and every term it
    # scales, may differ in the last bits, so the results agree to a few units in the last place of their terms
    exact = spec.clip_max_norm is None
    terms = term_magnitudes(3)
    for param in NAMES:
        expected = whole_state.params[param].detach()
        got = sharded_state.params[param].detach()
        if exact:
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        else:  # the initial value plus the steps' updates
            assert_close_to_terms(
                got, expected, initial[param].detach().abs() + (expected - initial[param]).abs(), 1e-6
            )
        for key, moment in whole_state.optimizer.momentums[param].items():  # SGD's momentum0 too: zeros
            sharded_moment = sharded_state.optimizer.momentums[param][key]
            assert sharded_moment.shape == (moment.numel(),)  # this rank's slice: all of it, flattened
            if exact:
                torch.testing.assert_close(sharded_moment.view(moment.shape), moment, rtol=0, atol=0)
            else:
                assert_close_to_terms(sharded_moment.view(moment.shape), moment, terms[param][key], 1e-6)


def test_a_checkpoints_whole_moments_are_cut_to_the_slices(group: dist.ProcessGroup) -> None:
    whole_state = make_state()
    whole = OptimizerEngine(SPECS["adamw"], whole_state, NAMES)
    set_grads(whole_state, 0)
    whole.step()
    resumed = TrainingState.load(whole_state.to_bytes(include_optimizer_state=True))
    shards = ShardedTensors(resumed, NAMES, group)
    engine = OptimizerEngine(SPECS["adamw"], resumed, NAMES, tensors=shards)
    for param in NAMES:
        for key, moment in whole_state.optimizer.momentums[param].items():
            assert torch.equal(resumed.optimizer.momentums[param][key], moment.view(-1))
    gathered = shards.gathered_momentums(engine)
    assert list(gathered) == NAMES
    for param in NAMES:
        assert gathered[param].keys() == {"momentum0", "momentum1"}
        for key, moment in gathered[param].items():
            assert torch.equal(moment, whole_state.optimizer.momentums[param][key])


def test_sharded_state_needs_one_dtype_and_an_element_per_rank(group: dist.ProcessGroup) -> None:
    state = make_state()
    state.freeze(["fc1.bias"], dtype=None)
    state.add_trainable("fc1.bias", torch.zeros(8, dtype=torch.float64))
    with pytest.raises(DistributedError, match="share one dtype and device"):
        ShardedTensors(state, NAMES, group)
    with pytest.raises(DistributedError, match="rank 0 of 1 owns no element"):
        ShardedTensors(make_state(), [], group)


def test_flat_shard_of_one_rank_owns_everything(group: dist.ProcessGroup) -> None:
    tensors = [torch.arange(6.0).view(2, 3), torch.arange(4.0)]
    shard = FlatShard([t.numel() for t in tensors], group)
    assert (shard.rank, shard.world_size, shard.shard_size, shard.owned_size) == (0, 1, 10, 10)
    assert shard.pieces == [(0, 0, 6), (1, 0, 4)]
    owned = shard.owned(tensors)
    assert [piece.tolist() for piece in owned] == [list(range(6)), list(range(4))]
    wholes = [torch.zeros(6), torch.zeros(4)]
    shard.gather_into(wholes, [piece * 2 for piece in owned])
    assert [whole.tolist() for whole in wholes] == [[2.0 * i for i in range(6)], [2.0 * i for i in range(4)]]


def test_sharded_optimizer_saves_the_whole_moments(group: dist.ProcessGroup, tmp_path: Path) -> None:
    artifacts = worker.MLP / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(artifacts / "training_model.onnx", state, distributed=True)
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module, shard_state=True)
    inputs = worker.batches(worker.MLP, 0)
    module.train()
    for _ in range(2):
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
    slices = state.training_state.optimizer.momentums
    CheckpointState.save_checkpoint(state, tmp_path / "checkpoint", include_optimizer_state=True)
    saved = TrainingState.load(tmp_path / "checkpoint")
    assert saved.optimizer.step == 2
    for name, moments in saved.optimizer.momentums.items():
        shape = saved.params[name].shape
        for key, moment in moments.items():
            assert moment.shape == shape
            np.testing.assert_array_equal(moment.numpy(), slices[name][key].view(shape).numpy())


def test_distributed_needs_a_process_group() -> None:
    assert not dist.is_initialized()
    artifacts = worker.MLP / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    with pytest.raises(DistributedError, match="init_process_group"):
        Module(artifacts / "training_model.onnx", state, distributed=True)
    module = Module(artifacts / "training_model.onnx", state)
    with pytest.raises(DistributedError, match="distributed=True"):
        Optimizer(artifacts / "optimizer_model.onnx", module, shard_state=True)
