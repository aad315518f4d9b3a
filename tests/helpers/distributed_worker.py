"""One rank of the distributed tests (tests/integration/test_distributed.py launches two), and the runs they compare.

``python -m tests.helpers.distributed_worker SCENARIO OUT_DIR`` with torchrun's env (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). Each rank writes ``OUT_DIR/<run>_rank<r>.npz`` (losses, parameters) and
``OUT_DIR/errors_rank<r>.json`` (the misuse errors it saw).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

MLP = FIXTURES / "mlp_ce_adamw_sched"
TRANSFORMER = FIXTURES / "transformer"
MLP_OPTIMIZERS = FIXTURES / "mlp_optimizers"
SGD_MODEL = MLP_OPTIMIZERS / "optimizers" / "sgd.onnx"
CLIP_MODEL = MLP_OPTIMIZERS / "optimizers" / "adamw_wd_clip.onnx"
STEPS = 20

# name -> (fixture, optimizer model or None for the fixture's, Module/Optimizer options, steps)
RUNS = {
    "mlp_adamw_sched": (MLP, None, {}, STEPS),
    "transformer_adamw_sched": (TRANSFORMER, None, {}, STEPS),
    "mlp_sgd": (MLP_OPTIMIZERS, SGD_MODEL, {}, STEPS),
    "mlp_sharded_clip": (MLP_OPTIMIZERS, CLIP_MODEL, {"shard_state": True}, STEPS),
    "mlp_adamw_sched_sharded": (MLP, None, {"shard_state": True}, STEPS),
    "mlp_accumulate": (MLP, None, {"accumulate": True}, 6),
    "transformer_sharded": (TRANSFORMER, None, {"shard_state": True}, 6),
    "mlp_compiled": (MLP, None, {"compile": True}, STEPS),
    "mlp_compiled_sharded": (MLP_OPTIMIZERS, CLIP_MODEL, {"compile": True, "shard_state": True}, 6),
    "mlp_sharded_clip_6": (MLP_OPTIMIZERS, CLIP_MODEL, {"shard_state": True}, 6),  # mlp_compiled_sharded, eager
}
SCENARIOS = {
    "eager": [
        "mlp_adamw_sched",
        "transformer_adamw_sched",
        "mlp_sgd",
        "mlp_sharded_clip",
        "mlp_accumulate",
        "transformer_sharded",
    ],
    "compiled": ["mlp_compiled", "mlp_compiled_sharded"],
}


def batches(fixture: Path, step: int) -> list[np.ndarray]:
    """The fixture's inputs of one step (the full batch)."""
    keys = json.loads((fixture / "expected.json").read_text()).get("data_keys", {}).get("train") or [
        "x_train",
        "y_train",
    ]
    with np.load(fixture / "data.npz") as data:
        return [data[key][step] for key in keys]


def part(arrays: list[np.ndarray], index: int, count: int) -> list[np.ndarray]:
    """The index-th of ``count`` equal slices of a batch: of each array's axis 0 (flattened token labels are
    sliced with their sequences)."""
    return [array[index * (len(array) // count) : (index + 1) * (len(array) // count)] for array in arrays]


def train(
    run: str,
    rank: int = 0,
    world_size: int = 1,
    checkpoint: Path | None = None,
    save_at: tuple[int, Path] | None = None,
    first_step: int = 0,
) -> dict[str, np.ndarray]:
    """Train ``run`` on this rank's share of each batch; return the losses and final parameters."""
    from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer

    fixture, optimizer_model, options, steps = RUNS[run]
    artifacts = fixture / "artifacts"
    state = CheckpointState.load_checkpoint(checkpoint or artifacts / "checkpoint")
    module = Module(
        artifacts / "training_model.onnx",
        state,
        artifacts / "eval_model.onnx",
        compile=options.get("compile", False),
        distributed=world_size > 1,
    )
    optimizer = Optimizer(
        optimizer_model or artifacts / "optimizer_model.onnx",
        module,
        shard_state=options.get("shard_state", False) and world_size > 1,
    )
    scheduler = LinearLRScheduler(optimizer, 3, STEPS, 0.01)
    losses = []
    for step in range(first_step, steps):
        inputs = batches(fixture, step)
        if options.get("accumulate"):  # two micro-batches: the first accumulates locally
            halves = [part(inputs, i, 2) for i in range(2)]
            if world_size > 1:
                with module.no_sync():
                    module(*part(halves[0], rank, world_size))
            else:
                module(*halves[0])
            loss = module(*part(halves[1], rank, world_size))
            optimizer.step()
            module.lazy_reset_grad()
        elif options.get("compile"):
            loss = module.step(optimizer, *part(inputs, rank, world_size))
        else:
            loss = module(*part(inputs, rank, world_size))
            optimizer.step()
            module.lazy_reset_grad()
        scheduler.step()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
        if save_at is not None and step + 1 == save_at[0]:
            CheckpointState.save_checkpoint(state, save_at[1], include_optimizer_state=True)
    params = {name: p.data.copy() for name, p in state.parameters}
    moments = state.training_state.optimizer.momentums
    moment_bytes = sum(t.numel() * t.element_size() for m in moments.values() for t in m.values())
    return {
        "losses": np.array(losses, dtype=np.float64),
        "moment_bytes": np.array(moment_bytes),
        **{f"param/{n}": v for n, v in params.items()},
    }


def legacy_train(
    rank: int = 0,
    world_size: int = 1,
    zero_stage: int = 0,
    mixed_precision: bool = False,
    recompute: str | None = None,
) -> dict[str, np.ndarray]:
    """The legacy TrainingSession (Adam, 2-step accumulation reduced once, ``use_mixed_precision`` as asked)
    on this rank's share of 8 batches, then its state (get_state) loaded into a new session that trains on
    2 more; the parameters and (whole, gathered under ZeRO stage 1) optimizer state. ``recompute``: "gelu"
    the model with a GELU, trained with ``gelu_recompute``; "attn_dropout" a Softmax's dropout, trained
    with ``attn_dropout_recompute``; "dropout" that model without it; the result's
    ``recomputed_segments`` counts the checkpointed regions of its training graph."""
    import torch

    from tests.helpers.legacy_models import LR, params_for, session

    settings = {
        "world_rank": rank,
        "world_size": world_size,
        "data_parallel_size": world_size,
        "gradient_accumulation_steps": 2,
        "allreduce_post_accumulation": True,
        "deepspeed_zero_stage": zero_stage,
        "use_mixed_precision": mixed_precision,
        "gelu_recompute": recompute == "gelu",
        "attn_dropout_recompute": recompute == "attn_dropout",
    }
    activation = {"gelu": "Gelu", "attn_dropout": "Softmax", "dropout": "Softmax"}.get(recompute or "", "Relu")
    sess = session(params_for("AdamOptimizer", **settings), activation)
    rng = np.random.default_rng(3)
    losses = []
    torch.manual_seed(rank)  # the dropout masks: each rank's own, the same with and without recompute
    for step in range(10):
        if step == 8:
            saved, sess = sess.get_state(), session(params_for("AdamOptimizer", **settings), activation)
            sess.load_state(saved, strict=True)
        x, y = rng.standard_normal((6, 4)).astype(np.float32), rng.integers(0, 3, 6).astype(np.int64)
        x, y = part([x, y], rank, world_size)
        losses.append(float(sess.run(["loss"], {"x": x, "y": y, LR: np.array([0.02], np.float32)})[0]))
    state = sess.get_model_state()["full_precision"]
    moments = {f"moment/{w}/{k}": v for w, values in sess.get_optimizer_state().items() for k, v in values.items()}
    held = getattr(sess._optimizer, "inner", sess._optimizer).moments  # the moments this rank keeps
    engine = sess._engine  # the last batch's converted training graph (cached: no conversion)
    params = [sess.training_state.params[name] for name in engine.train_layout.params]
    module = engine.train_graph.module_for([torch.from_numpy(x), torch.from_numpy(y)], params)
    segments = sum(hasattr(child, "segment") for child in module.children())
    return {
        "losses": np.array(losses),
        "recomputed_segments": np.array(segments),
        "held_moment_elements": np.array(sum(m.numel() for ms in held.values() for m in ms)),
        **{f"param/{n}": np.asarray(v) for n, v in state.items()},
        **moments,
    }


def fp16_overflow(rank: int, world_size: int) -> dict[str, np.ndarray]:
    """fp16 loss scaling, with and without sharded state: at step 2 rank 1 alone finds an inf in its
    (already averaged) gradient, in the slice it owns; every rank must skip that step."""
    from ort_torch_train.api import CheckpointState, Module, Optimizer

    artifacts = MLP / "artifacts"
    results = {}
    for run, shard_state in (("ddp", False), ("sharded", True)):
        state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
        module = Module(artifacts / "training_model.onnx", state, distributed=True, mixed_precision="fp16")
        optimizer = Optimizer(artifacts / "optimizer_model.onnx", module, shard_state=shard_state)
        skipped = []
        for step in range(4):
            module(*part(batches(MLP, step), rank, world_size))
            if step == 2 and rank == 1:
                last = state.training_state.params[module.trainable_parameter_names[-1]]
                last.grad.view(-1)[-1] = float("inf")
            optimizer.step()
            module.lazy_reset_grad()
            skipped.append(optimizer.last_step_skipped)
        results[f"{run}/skipped"] = np.array(skipped)
        results[f"{run}/scale"] = np.array(module.precision.loss_scaler.get_scale())
        results.update({f"{run}/param/{n}": p.data.copy() for n, p in state.parameters})
    return results


def misuse_errors(rank: int) -> dict[str, str]:
    """The errors raised by wrapping a Module in DDP and by ranks starting from different checkpoints."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.errors import CheckpointError, DistributedError

    artifacts = MLP / "artifacts"
    errors = {}
    module = Module(artifacts / "training_model.onnx", CheckpointState.load_checkpoint(artifacts / "checkpoint"))
    try:
        DistributedDataParallel(module)
    except DistributedError as error:
        errors["ddp_wrap"] = str(error)
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    if rank == 1:
        name = next(n for n, _ in state.parameters)
        state.parameters[name] = state.parameters[name].data + np.float32(1e-3)
    try:
        Module(artifacts / "training_model.onnx", state, distributed=True)
    except DistributedError as error:
        errors["different_checkpoints"] = str(error)
    module = Module(
        artifacts / "training_model.onnx",
        CheckpointState.load_checkpoint(artifacts / "checkpoint"),
        artifacts / "eval_model.onnx",
        distributed=True,
    )
    module.eval()  # eval stays local: ranks evaluate different batches without any collective
    with torch.no_grad():
        module(*part(batches(MLP, 0), rank, 2))
    Optimizer(artifacts / "optimizer_model.onnx", module, shard_state=True)
    try:  # a rank's moment slices are not a checkpoint: only save_checkpoint gathers them
        module.training_state.to_bytes(include_optimizer_state=True)
    except CheckpointError as error:
        errors["shard_saved_alone"] = str(error)
    return errors


def lost_rank(rank: int) -> dict[str, str]:
    """Rank 1 dies after construction; rank 0's next train step must raise, not hang."""
    from ort_torch_train.api import CheckpointState, Module
    from ort_torch_train.errors import DistributedError

    artifacts = MLP / "artifacts"
    module = Module(
        artifacts / "training_model.onnx", CheckpointState.load_checkpoint(artifacts / "checkpoint"), distributed=True
    )
    if rank == 1:
        os._exit(0)
    try:
        module(*part(batches(MLP, 0), rank, 2))
    except DistributedError as error:
        return {"lost_rank": str(error)}
    return {}


def cached_compile(rank: int, world_size: int, cache: Path) -> dict[str, np.ndarray]:
    """mlp_compiled with the compile cache directory ``cache`` (empty on the first launch; each rank saves
    the steps it compiles there); whether it held entries and how many saved steps loaded."""
    import logging

    import torch.distributed as dist

    from ort_torch_train.training.compile.cache import load_compile_cache

    messages = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("ort_torch_train.training.compile.precompiled")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    found = load_compile_cache(cache)
    dist.barrier()  # every rank looked before any saves
    result = train("mlp_compiled", rank, world_size)
    loaded = sum(message.startswith("loaded the saved train step") for message in messages)
    return {**result, "found": np.array(found), "loaded": np.array(loaded)}


@contextmanager
def gloo_group() -> Iterator[tuple[int, int]]:
    """This process in torchrun's gloo group (its deadline scaled), as (rank, world size); on leaving, once every
    rank got there, the group is destroyed."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=scaled(20)))
    yield dist.get_rank(), dist.get_world_size()
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    import torch.distributed as dist

    scenario, out = sys.argv[1], Path(sys.argv[2])
    if scenario == "legacy_mpi":  # launched with mpirun's variables: the legacy session makes the group
        rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
        np.savez(out / f"legacy_mpi_rank{rank}.npz", **legacy_train(rank, int(os.environ["OMPI_COMM_WORLD_SIZE"])))
        dist.barrier()
        dist.destroy_process_group()
        return
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=scaled(20)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    errors = {}
    if scenario == "lost_rank":
        errors = lost_rank(rank)
    elif scenario in ("compiled", "compiled_cache"):  # the first launch compiles and saves, a later one loads
        result = cached_compile(rank, world_size, out / "compile_cache")
        np.savez(out / f"cached_compile_{'warm' if result['found'] else 'cold'}_rank{rank}.npz", **result)
        if scenario == "compiled":
            np.savez(out / f"mlp_compiled_rank{rank}.npz", **result)
            np.savez(out / f"mlp_compiled_sharded_rank{rank}.npz", **train("mlp_compiled_sharded", rank, world_size))
    elif scenario == "eager":
        for run in SCENARIOS[scenario]:
            save_at = (10, out / f"{run}.ckpt") if run == "mlp_sharded_clip" else None
            np.savez(out / f"{run}_rank{rank}.npz", **train(run, rank, world_size, save_at=save_at))
        resumed = train("mlp_adamw_sched", rank, world_size, checkpoint=out / "one_process_step10.ckpt", first_step=10)
        np.savez(out / f"resumed_rank{rank}.npz", **resumed)
        resumed = train(
            "mlp_adamw_sched_sharded", rank, world_size, checkpoint=out / "one_process_step10.ckpt", first_step=10
        )
        np.savez(out / f"resumed_sharded_rank{rank}.npz", **resumed)
        np.savez(out / f"legacy_rank{rank}.npz", **legacy_train(rank, world_size))
        np.savez(out / f"legacy_zero_rank{rank}.npz", **legacy_train(rank, world_size, zero_stage=1))
        np.savez(out / f"fp16_rank{rank}.npz", **fp16_overflow(rank, world_size))
        errors = misuse_errors(rank)
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    (out / f"errors_rank{rank}.json").write_text(json.dumps(errors))
    if scenario != "lost_rank":
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
