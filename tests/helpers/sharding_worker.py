"""One rank of the sharded-training tests (tests/unit/distributed/test_fully_sharded.py launches 2 or 4).

``python -m tests.helpers.sharding_worker SCENARIOS OUT_DIR`` with torchrun's env. ``SCENARIOS``: one or more
scenarios joined by "," run in turn in one launch, each ``<run>:<sharding>[:<option>]`` and marked done in turn (``dist_rank_scenarios.run_scenarios``), (a run of ``RUNS``,
"zero2" or "zero3", "none" for one process on the whole batches; an option of ``OPTIONS``: recompute, bf16 /
fp16 mixed precision, or compiled steps, with recompute or without):
each rank trains on its share of every batch and writes ``<scenario>_rank<r>.npz`` (the losses, the final
whole parameters, the last step's whole gradients, the eval loss, the graphs Dynamo traced in the scenario by each step's end) and rank 0 the checkpoint ``<scenario>.ckpt``. ``resume:<sharding>``
loads the ``mlp`` run's checkpoint saved after 3 steps and trains the rest. ``legacy:<stage>``: the legacy
session with ``deepspeed_zero_stage`` 2 or 3 (``distributed_worker.legacy_train``; ``legacy:<stage>:fp16``
with ``use_mixed_precision``, ``legacy:<stage>:<recompute>`` with ``recompute`` of ``legacy_train``,
``legacy:<stage>:layers`` ``OUT_DIR/bert.onnx`` with ``transformer_layer_recompute``:
``legacy_bert.sharded_layers_train``). ``fit:<sharding>[:<option>]``: the
trainer's ``fit`` with averaged gradient accumulation. ``misuse``: the errors
each rank saw (``misuse_rank<r>.json``).
"""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tests.helpers.dist_rank_scenarios import run_scenarios
from tests.helpers.distributed_worker import CLIP_MODEL, MLP, MLP_OPTIMIZERS, batches, legacy_train, part
from tests.helpers.paths import FIXTURES
from tests.helpers.timeouts import scaled

if TYPE_CHECKING:
    from ort_torch_train.api import Module

TRANSFORMER = FIXTURES / "transformer"
STEPS = 6
WARMUP, PEAK_LEARNING_RATE = 2, 0.01
LEARNING_RATES_SUM = sum(  # LinearLRScheduler's rates over the steps: up for WARMUP steps, then down to 0
    PEAK_LEARNING_RATE * (step / WARMUP if step < WARMUP else (STEPS - step) / (STEPS - WARMUP))
    for step in range(STEPS)
)
TIED_LM = "tied_lm"  # a fixture folder made in OUT_DIR by ``make_tied_lm`` before the ranks start
RUNS = {  # fixture, optimizer model (None: the fixture's), two micro-batches per step
    "mlp": (MLP, None, False),
    "mlp_clip_accumulate": (MLP_OPTIMIZERS, CLIP_MODEL, True),
    "transformer": (TRANSFORMER, None, False),
    TIED_LM: (Path(TIED_LM), None, False),
}


def make_tied_lm(out: Path) -> None:
    """``OUT_DIR/tied_lm``, laid out as a fixture (artifacts/, data.npz, expected.json): a 1-layer GPT-2
    (``transformers``) whose output projection is its token embedding, every parameter trained."""
    import torch

    from ort_torch_train.artifacts import AdamW, LossType, generate_artifacts
    from tests.helpers.lora_models import BATCH, TOKENS, tiny_lm
    from tests.helpers.lora_models import batches as lm_batches

    folder = out / TIED_LM
    generate_artifacts(
        tiny_lm("gpt2"),
        example_inputs=(torch.zeros(BATCH, TOKENS, dtype=torch.int64),),
        input_names=["tokens"],
        output_names=["logits"],
        loss=LossType.CrossEntropyLoss,
        optimizer=AdamW(),
        artifact_directory=folder / "artifacts",
    )
    data = lm_batches(STEPS)
    np.savez(
        folder / "data.npz",
        tokens=np.stack([t.numpy() for t, _ in data]),
        labels=np.stack([y.numpy() for _, y in data]),
    )
    (folder / "expected.json").write_text(json.dumps({"data_keys": {"train": ["tokens", "labels"]}}))


OPTIONS = {
    "": {},
    "recompute": {"recompute": True},
    "bf16": {"mixed_precision": "bf16"},
    "fp16": {"mixed_precision": "fp16"},
    "compile": {"compile": {"backend": "aot_eager"}},
    "compile_recompute": {"compile": {"backend": "aot_eager"}, "recompute": True},
    "inductor": {"compile": True},
    "inductor_recompute": {"compile": True, "recompute": True},
}


def train(scenario: str, rank: int, world_size: int, out: Path) -> dict[str, np.ndarray]:
    """Train the scenario's run on this rank's share of each batch (see the module doc)."""
    from ort_torch_train.api import CheckpointState, LinearLRScheduler, Module, Optimizer
    from ort_torch_train.torch_internals import compile_counters

    run, sharding, *option = scenario.split(":")
    resume = run == "resume"
    fixture, optimizer_model, accumulate = RUNS["mlp" if resume else run]
    fixture = out / fixture if run == TIED_LM else fixture
    artifacts = fixture / "artifacts"
    state = CheckpointState.load_checkpoint(out / "mlp:none.at3.ckpt" if resume else artifacts / "checkpoint")
    traced_before = compile_counters()["stats"]["unique_graphs"]  # the scenarios run before it in this process
    module = Module(
        artifacts / "training_model.onnx",
        state,
        artifacts / "eval_model.onnx",
        sharding=None if sharding == "none" else sharding,
        **OPTIONS[option[0] if option else ""],
    )
    optimizer = Optimizer(optimizer_model or artifacts / "optimizer_model.onnx", module)
    whole_buffers = {}
    if run == "mlp" and not option:  # before the first step: the save, and the flat buffer out and back in
        CheckpointState.save_checkpoint(state, out / f"{scenario}.step0.ckpt", include_optimizer_state=True)
        whole_buffers = contiguous_round_trip(module)
    scheduler = LinearLRScheduler(optimizer, WARMUP, STEPS, PEAK_LEARNING_RATE)
    losses: list[float] = []
    graphs: list[int] = []  # the graphs Dynamo traced in this scenario by the end of each step
    saved = 0, 0, 0  # one process's compiled run is not counted: the one-graph step refuses saved-tensor hooks
    if sharding != "none" or "compile" not in OPTIONS[option[0] if option else ""]:
        saved = saved_for_backward(lambda: module(*part(batches(fixture, 0), rank, world_size)))
        module.lazy_reset_grad()
    for step in range(3 if resume else 0, STEPS):
        inputs = batches(fixture, step)
        if accumulate:  # two micro-batches: the first accumulates locally
            halves = [part(inputs, i, 2) for i in range(2)]
            if sharding != "none":
                with module.no_sync():
                    module(*part(halves[0], rank, world_size))
            else:
                module(*halves[0])
            loss = module(*part(halves[1], rank, world_size))
        else:
            loss = module(*part(inputs, rank, world_size))
        optimizer.step()
        module.lazy_reset_grad()
        scheduler.step()
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
        graphs.append(compile_counters()["stats"]["unique_graphs"] - traced_before)
        if step == 2 and not resume:
            CheckpointState.save_checkpoint(state, out / f"{scenario}.at3.ckpt", include_optimizer_state=True)
    CheckpointState.save_checkpoint(state, out / f"{scenario}.ckpt", include_optimizer_state=True)
    grads = {f"grad/{n}": p.grad.copy() for n, p in state.parameters}  # the last step's, gathered
    module.eval()
    eval_loss = module(*part(batches(fixture, 0), rank, world_size))
    return {
        "losses": np.array(losses, dtype=np.float64),
        "eval_loss": np.asarray(eval_loss, dtype=np.float64).reshape(-1),
        "saved_elements": np.array(saved[0]),
        "saved_tensors": np.array(saved[1]),
        "saved_activation_bytes": np.array(saved[2]),
        "traced_graphs": np.array(graphs),
        **{f"param/{n}": p.data.copy() for n, p in state.parameters},
        **grads,
        **whole_buffers,
    }


def contiguous_round_trip(module: Module) -> dict[str, np.ndarray]:
    """``get_contiguous_parameters`` (every parameter), then a changed buffer of the trainable ones copied in
    and read back, then the first copied back in (the run goes on from its own values)."""
    first = module.get_contiguous_parameters(trainable_only=False).numpy().copy()
    trainable = module.get_contiguous_parameters(trainable_only=True).numpy().copy()
    changed = trainable * 2 + np.arange(trainable.size, dtype=np.float32) / trainable.size
    module.copy_buffer_to_parameters(changed, trainable_only=True)
    copied = module.get_contiguous_parameters(trainable_only=False).numpy().copy()
    module.copy_buffer_to_parameters(first, trainable_only=False)
    restored = module.get_contiguous_parameters(trainable_only=False).numpy()
    assert np.array_equal(restored, first), "copy_buffer_to_parameters(trainable_only=False) did not restore"
    return {"contiguous/first": first, "contiguous/copied": copied}


def saved_for_backward(step: Callable[[], object]) -> tuple[int, int, int]:
    """What ``step``'s forward keeps for its backward, outside recomputed regions: how many tensor elements,
    how many tensors, and the bytes of its floating-point tensors that are neither parameters nor their views
    (activations; a checkpoint inside a compiled graph keeps the RNG state, bytes, to replay its random numbers)."""
    import torch

    elements = tensors = activation_bytes = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal elements, tensors, activation_bytes
        elements += tensor.numel()
        tensors += 1
        base = tensor if tensor._base is None else tensor._base
        if tensor.is_floating_point() and not (base.is_leaf and base.requires_grad):  # not a parameter (view)
            activation_bytes += tensor.nbytes
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return elements, tensors, activation_bytes


def fit_run(sharding: str, rank: int, world_size: int, option: str = "") -> dict[str, np.ndarray]:
    """``fit`` on the mlp run: two micro-batches a step averaged (``grad_accum_reduction="mean"``), the
    first under ``no_sync``, with the ``OPTIONS`` named by ``option``; the losses fit reports (the ranks'
    mean) and the final whole parameters."""
    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.trainer import fit

    artifacts = MLP / "artifacts"
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    module = Module(
        artifacts / "training_model.onnx", state, sharding=None if sharding == "none" else sharding, **OPTIONS[option]
    )
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    data = [
        tuple(part(half, rank, world_size))
        for step in range(STEPS)
        for half in (part(batches(MLP, step), index, 2) for index in range(2))
    ]
    result = fit(module, optimizer, data, max_steps=STEPS, grad_accum=2, grad_accum_reduction="mean")
    return {
        "losses": np.array(result.losses, dtype=np.float64),
        **{f"param/{n}": p.data.copy() for n, p in state.parameters},
    }


def misuse(rank: int) -> dict[str, str]:
    """What a sharded Module raises on this rank: ranks launched with different settings (rank 0 "zero3",
    the others "zero2"), a model whose ranks start from different parameters, and a nominal state."""
    from ort_torch_train.api import CheckpointState, Module
    from ort_torch_train.errors import DistributedError, NominalStateError

    artifacts = MLP / "artifacts"
    errors = {}
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    try:
        Module(artifacts / "training_model.onnx", state, sharding="zero3" if rank == 0 else "zero2")
    except DistributedError as error:
        errors["settings"] = str(error)
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    if rank == 1:
        state.parameters["0.bias"].data = state.parameters["0.bias"].data + 1
    try:
        Module(artifacts / "training_model.onnx", state, sharding="zero3")
    except DistributedError as error:
        errors["parameters"] = str(error)
    try:  # its parameters not loaded yet: nothing to cut into shards (nor moments to save gathered)
        Module(
            artifacts / "training_model.onnx",
            CheckpointState.load_checkpoint(artifacts / "nominal_checkpoint"),
            sharding="zero2",
        )
    except NominalStateError as error:
        errors["nominal"] = str(error)
    return errors


def main() -> None:
    import torch.distributed as dist

    scenarios, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=scaled(20)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    run_scenarios(scenarios.split(","), out, rank, lambda scenario: run(scenario, out, rank, world_size))
    dist.destroy_process_group()


def run(scenario: str, out: Path, rank: int, world_size: int) -> None:
    """One scenario on this rank: its results written to ``OUT_DIR`` (see the module doc)."""
    if scenario == "misuse":
        (out / f"misuse_rank{rank}.json").write_text(json.dumps(misuse(rank)))
    elif scenario.startswith("fit:"):
        _, sharding, *option = scenario.split(":")
        np.savez(out / f"{scenario}_rank{rank}.npz", **fit_run(sharding, rank, world_size, *option))
    elif scenario.startswith("legacy:"):  # deepspeed_zero_stage 2 or 3, and ":fp16" or a recompute
        _, stage, *option = scenario.split(":")
        if option == ["layers"]:
            from tests.helpers.legacy_bert import sharded_layers_train

            results = sharded_layers_train(out / "bert.onnx", rank, world_size, zero_stage=int(stage))
            np.savez(out / f"{scenario}_rank{rank}.npz", **results)
            return
        fp16, recompute = option == ["fp16"], None if option in ([], ["fp16"]) else option[0]
        results = legacy_train(rank, world_size, zero_stage=int(stage), mixed_precision=fp16, recompute=recompute)
        np.savez(out / f"{scenario}_rank{rank}.npz", **results)
    else:
        np.savez(out / f"{scenario}_rank{rank}.npz", **train(scenario, rank, world_size, out))


if __name__ == "__main__":
    main()
