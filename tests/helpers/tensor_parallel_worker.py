"""One rank of the tensor-parallel tests (tests/integration/test_tensor_parallel.py launches 2 or 4).

``python -m tests.helpers.tensor_parallel_worker SCENARIOS OUT_DIR`` (joined by ",", run in turn:
``dist_rank_scenarios``) with torchrun's env. Each rank
writes ``OUT_DIR/<run>_rank<r>.npz`` (losses, parameters, the bytes it holds per parameter), the
checkpoints rank 0 saves, and
``OUT_DIR/errors_rank<r>.json`` (the errors of the bad-input cases, class and message). The
``two_ranks`` scenario, in one launch of 2 ranks: the transformer's MLP pair split (plain, resumed,
legacy, recomputed with sharded state), then ``OUT_DIR/attention`` (``tests/helpers/attention_model.py``)
trained with its heads and MLP split, then the bad-input cases (``OUT_DIR/odd_heads`` among them).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from ort_torch_train.state.training_state import TrainingState
from ort_torch_train.torch_internals import TorchDispatchMode
from tests.helpers.dist_rank_scenarios import run_scenarios
from tests.helpers.distributed_worker import MLP_OPTIMIZERS, TRANSFORMER, batches, gloo_group, part
from tests.helpers.sharding_worker import contiguous_round_trip

STEPS = 6
# the recompute run's optimizer: SGD with a gradient clip that bites (0.25 against norms above 1), so the
# parameters show a wrong global norm (a whole gradient counted once per rank)
OPTIMIZER_MODELS = {"recompute_sharded": MLP_OPTIMIZERS / "optimizers" / "sgd_clip.onnx"}
ATTENTION, ODD_HEADS = "attention", "odd_heads"  # attention fixtures made in OUT_DIR before the ranks start


class Collectives(TorchDispatchMode):
    """Counts the functional collectives (DTensor's) that run inside it, by op."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        if "c10d" in name:
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def train(
    out: Path,
    run: str,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    rank: int = 0,
    recompute: int | None = None,
    shard_state: bool = False,
    fixture: Path = TRANSFORMER,
    checkpoint: Path | None = None,
) -> None:
    """Train ``fixture`` (the transformer's by default) for ``STEPS`` steps (each data-parallel replica on its share of the
    batch; ``shard_state`` asks for data parallel, of one replica with tensor parallel on every rank),
    save the checkpoint (with its optimizer state) and write losses and parameters. ``checkpoint``: the
    state (and moments) to start from instead of the fixture's."""
    from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer

    artifacts = fixture / "artifacts"
    state = CheckpointState.load_checkpoint(checkpoint or artifacts / "checkpoint")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = Module(
            artifacts / "training_model.onnx",
            state,
            artifacts / "eval_model.onnx",
            distributed=data_parallel_size > 1 or shard_state,
            tensor_parallel_size=tensor_parallel_size,
            recompute=recompute,
        )
    optimizer = Optimizer(
        OPTIMIZER_MODELS.get(run, artifacts / "optimizer_model.onnx"), module, shard_state=shard_state
    )
    CheckpointState.save_checkpoint(state, out / f"{run}_step0.ckpt", include_optimizer_state=True)
    whole_buffers = contiguous_round_trip(module)
    scheduler = LinearLRScheduler(optimizer, 3, STEPS if checkpoint is None else 2 * STEPS, 0.01)  # resumed: 6 done
    replica = rank // tensor_parallel_size
    losses = []
    collectives = {}
    for step in range(STEPS):
        with Collectives() as counted:  # the collectives the step runs (none in one process)
            loss = module(*part(batches(fixture, step), replica, data_parallel_size))
        collectives = collectives or counted.counts
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.step()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    module.eval()
    eval_loss = module(*part(batches(fixture, 0), replica, data_parallel_size))
    CheckpointState.save_checkpoint(state, out / f"{run}.ckpt", include_optimizer_state=True)
    if run == "tensor_parallel":  # every rank gathers the whole weights; each writes its own file
        module.export_model_for_inferencing(out / f"{run}_inference_rank{rank}.onnx", ["logits"])
    np.savez(
        out / f"{run}_rank{rank}.npz",
        losses=np.array(losses, dtype=np.float64),
        eval_loss=np.asarray(eval_loss, dtype=np.float64),
        collectives=np.array(json.dumps(collectives)),
        held=np.array(json.dumps(held_bytes(state.training_state))),
        warnings=np.array([str(w.message) for w in caught if "tensor_parallel_size" in str(w.message)]),
        **{f"param/{name}": np.array(p.data) for name, p in state.parameters},
        **whole_buffers,
    )


def held_bytes(training_state: TrainingState) -> dict[str, int]:
    """The bytes this rank holds per parameter: its tensor, gradient and moments (a DTensor's local shard)."""
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor | None) -> int:
        if tensor is None:
            return 0
        held = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        return held.numel() * held.element_size()

    moments = {} if training_state.optimizer is None else training_state.optimizer.momentums
    return {
        name: local(param) + local(param.grad) + sum(local(moment) for moment in moments.get(name, {}).values())
        for name, param in training_state.params.items()
    }


def legacy_train(out: Path, run: str, horizontal_parallel_size: int, rank: int = 0, world_size: int = 1) -> None:
    """The legacy TrainingSession (Adam) on ``horizontal_parallel_size`` ranks, 4 steps on the same batches."""
    from tests.helpers.legacy_models import LR, params_for, session

    settings = {"world_rank": rank, "world_size": world_size, "horizontal_parallel_size": horizontal_parallel_size}
    sess = session(params_for("AdamOptimizer", **settings))
    rng = np.random.default_rng(3)
    losses = []
    for _ in range(4):
        x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6).astype(np.int64)
        losses.append(float(sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.02], np.float32)})[0]))
    state = sess.get_model_state()["full_precision"]
    np.savez(
        out / f"{run}_rank{rank}.npz",
        losses=np.array(losses),
        **{f"param/{n}": np.asarray(v) for n, v in state.items()},
    )


def odd_hidden_session(rank: int) -> None:
    """A legacy session with horizontal_parallel_size=2 on a model whose pair has 5 hidden features."""
    from onnx import numpy_helper

    from ort_torch_train.legacy import TrainingSession
    from tests.helpers.legacy_models import forward_model, params_for

    model = forward_model()
    for index, initializer in enumerate(model.graph.initializer):
        value = numpy_helper.to_array(initializer)
        if initializer.name in ("fc1.weight", "fc1.bias", "fc2.weight"):
            cut = value[:, :5] if initializer.name == "fc2.weight" else value[:5]
            model.graph.initializer[index].CopyFrom(numpy_helper.from_array(cut, initializer.name))
    settings = {"world_rank": rank, "world_size": 2, "horizontal_parallel_size": 2}
    TrainingSession(model.SerializeToString(), params_for("AdamOptimizer", **settings))


def bad_input(rank: int, out: Path) -> dict[str, str]:
    """Each misuse on 2 ranks, as ``class: message`` (``out/odd_heads``: an attention fixture of 3 heads,
    made before the ranks start)."""
    from ort_torch_train.api import CheckpointState, Module

    errors = {}
    cases = {
        # rank 1 asks for data parallel too: the ranks' settings differ
        "different_settings": ("transformer", {"tensor_parallel_size": 2, "distributed": rank == 1}, "checkpoint"),
        "size_not_dividing": ("transformer", {"tensor_parallel_size": 3, "distributed": True}, "checkpoint"),
        "no_pattern": ("bce", {"tensor_parallel_size": 2}, "checkpoint"),
        "heads_not_dividing": (out / ODD_HEADS, {"tensor_parallel_size": 2}, "checkpoint"),
        # its parameters not loaded yet: nothing to cut into shards (nor moments to save gathered)
        "nominal_state": ("mlp_ce_adamw_sched", {"tensor_parallel_size": 2}, "nominal_checkpoint"),
    }
    try:  # the legacy model with 5 hidden features instead of 6: no equal halves
        odd_hidden_session(rank)
    except Exception as error:  # recorded for the test to check
        errors["hidden_not_dividing"] = f"{type(error).__name__}: {error}"
    for case, (fixture, options, checkpoint) in cases.items():
        artifacts = TRANSFORMER.parent / fixture / "artifacts"  # an absolute ``fixture`` path stays itself
        try:
            Module(
                artifacts / "training_model.onnx", CheckpointState.load_checkpoint(artifacts / checkpoint), **options
            )
        except Exception as error:  # recorded for the test to check
            errors[case] = f"{type(error).__name__}: {error}"
        else:
            errors[case] = "no error"
    return errors


def main() -> None:
    scenarios, out = sys.argv[1], Path(sys.argv[2])
    with gloo_group() as (rank, world_size):

        def run(scenario: str) -> None:
            if scenario == "two_ranks":
                train(out, "tensor_parallel", tensor_parallel_size=world_size, rank=rank)
                resumed_from = out / "tensor_parallel.ckpt"  # with AdamW's moments: cut into each rank's shards
                train(out, "resumed", tensor_parallel_size=world_size, rank=rank, checkpoint=resumed_from)
                legacy_train(out, "legacy", world_size, rank, world_size)
                train(
                    out, "recompute_sharded", tensor_parallel_size=world_size, rank=rank, recompute=2, shard_state=True
                )
                train(out, "attention", tensor_parallel_size=world_size, rank=rank, fixture=out / ATTENTION)
                (out / f"errors_rank{rank}.json").write_text(json.dumps(bad_input(rank, out)))
            elif scenario == "tensor_and_data_parallel":
                data_parallel_size = world_size // 2
                train(
                    out,
                    "tensor_and_data_parallel",
                    tensor_parallel_size=2,
                    data_parallel_size=data_parallel_size,
                    rank=rank,
                )
            else:
                raise ValueError(f"unknown scenario {scenario!r}")

        run_scenarios(scenarios.split(","), out, rank, run)


if __name__ == "__main__":
    main()
