"""Memory and step time of sharded training (FSDP2 ZeRO-2/ZeRO-3) against one process and DDP, gloo on CPU.

A GPT-2-shaped language model (``transformers`` GPT2LMHeadModel from the harness's ``tiny_transformer``:
tied embeddings, pre-LN blocks) trains with ORT's loop on ``Module(sharding=...)``; a world of N ranks
gives each rank 1/N of the fixed batch. Per rank it reports the bytes of parameters + gradients +
optimizer moments: at rest after the steps, and the peak during one step, sampled after every tensor
operation (a TorchDispatchMode), counting the gathered (unsharded) parameters and gradients FSDP2 holds
at that moment, so the layer-wise gather shows; the largest number of layers gathered at once is
reported too. DDP's bucket buffers and the activations are not counted. Timed steps run without the
sampler; the ratios compare each sharding with DDP on the same ranks, in the same run. With
``--compile`` every configuration runs compiled steps (DDP and one process: the one-graph step;
sharding: each unit's stretch compiled), the first step (compilation) among the warmup steps; the
sampler, which sees no operation inside a compiled graph, is not run, so only the bytes at rest are
reported. ``--worlds`` chooses the world sizes, ``--modes`` the configurations besides one process.

Mode "pipeline" runs one stage per rank (``Module(pipeline=PipelineOptions(N, micro_batches=4))``, GPipe,
stages balanced by parameter count), every rank given the whole batch: a rank then holds its stage's
parameters, gradients and moments; the tied embedding is held by the first and the last stage both.
``--untied`` gives the model its own output projection (``tie_word_embeddings=False``) in every configuration.

    .venv/bin/python bench/experiments/sharding_memory.py [--steps 4] [--warmup 1] [--layers 8] [--hidden 256]
        [--compile] [--worlds 2,4] [--modes ddp,zero2,zero3] [--untied]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from ort_torch_train.distributed.launch import run_local_ranks

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))


MODES = ("ddp", "zero2", "zero3", "pipeline")


def configurations(worlds: list[int], modes: list[str]) -> list[tuple[str, int, str | None]]:
    """(name, world size, mode) of each run: one process, then each of ``modes`` on each world size."""
    return [("one process", 1, None), *((f"{mode} x{n}", n, mode) for n in worlds for mode in modes)]


def bench_model(layers: int, hidden: int, untied: bool = False):  # type: ignore[no-untyped-def]  # a BenchModel
    """The GPT-2-shaped BenchModel: ``layers`` blocks of width ``hidden``, vocab 2048, 32 tokens, batch 8;
    ``untied``: the output projection its own parameter."""
    from lm_models import tiny_transformer
    from models import BenchModel

    def build():  # type: ignore[no-untyped-def]
        model = tiny_transformer("gpt2", vocab=2048, hidden=hidden, layers=layers, heads=4, tokens=32)
        if untied:
            import torch

            gpt2 = model.model
            gpt2.config.tie_word_embeddings = False
            gpt2.lm_head.weight = torch.nn.Parameter(gpt2.transformer.wte.weight.detach().clone())
        return model

    embeddings = "untied" if untied else "tied"
    return BenchModel(
        f"gpt2-shaped-{layers}x{hidden}{'-untied' if untied else ''}",
        f"transformers gpt2 (random init, hidden {hidden}, {layers} layers, vocab 2048, 32 tokens, {embeddings} embeddings)",
        build,
        (32,),
        batch=8,
        classes=2048,
        steps=4,
        warmup=1,
        vocab=2048,
        language_model=True,
    )


def _storage_bytes(tensors: list, seen: set) -> int:
    total = 0
    for tensor in tensors:
        if tensor is None or tensor.device.type == "meta":  # another pipeline stage's placeholder: no storage
            continue
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if storage.nbytes() and key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def held_bytes(state, sharded) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(parameters + gradients + moments bytes this rank holds now, layers whose parameters are gathered)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    seen: set = set()
    moments = [m for ms in state.optimizer.momentums.values() for m in ms.values()] if state.optimizer else []
    total = _storage_bytes(moments, seen)
    if sharded is None:
        params = list(state.params.values())
        return total + _storage_bytes([p.detach() for p in params] + [p.grad for p in params], seen), 0
    gathered = 0
    for module in sharded.modules():
        if not isinstance(module, FSDPModule):
            continue
        group = module._get_fsdp_state()._fsdp_param_group  # FSDP2's internals: bench-only accounting
        layer_bytes = 0
        for fsdp_param in group.fsdp_params if group else []:
            grad = fsdp_param.sharded_param.grad
            total += _storage_bytes([fsdp_param._sharded_param_data], seen)
            total += _storage_bytes([grad.to_local() if isinstance(grad, DTensor) else grad], seen)
            layer_bytes += _storage_bytes(list(getattr(fsdp_param, "all_gather_outputs", [])), seen)
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            total += _storage_bytes([None if unsharded is None else unsharded.grad], seen)
        total += layer_bytes
        gathered += layer_bytes > 0 and module is not sharded
    return total, gathered


def worker(directory: Path, steps: int, warmup: int, mode: str, compile: bool) -> None:
    """One rank: timed steps, then (eager) one step under the sampler; print a JSON report."""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.distributed.pipeline_plan import PipelineOptions

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    sharding = mode if mode in ("zero2", "zero3") else None
    piped = mode == "pipeline"
    module = Module(
        directory / "training_model.onnx",
        state,
        distributed=world_size > 1 and sharding is None and not piped,
        sharding=sharding,
        compile=compile,
        pipeline=PipelineOptions(stages=world_size, micro_batches=4) if piped else None,
    )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    x, y = np.load(directory / "x.npy"), np.load(directory / "y.npy").reshape(len(np.load(directory / "x.npy")), -1)
    share = len(x) if piped else len(x) // world_size  # a pipeline's every rank gets the whole batch
    first = 0 if piped else rank * share
    inputs = [torch.from_numpy(a[first : first + share].copy()) for a in (x, y)]
    inputs[1] = inputs[1].reshape(-1)
    times = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        module(*inputs)
        optimizer.step()
        module.lazy_reset_grad()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    training_state = state.training_state
    sharded = module.data_parallel.sharded_module if sharding else None
    rest, _ = held_bytes(training_state, sharded)
    peak = {"bytes": 0, "layers": 0}

    class Sampler(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            held, layers = held_bytes(training_state, sharded)
            peak["bytes"], peak["layers"] = max(peak["bytes"], held), max(peak["layers"], layers)
            return out

    if not compile:
        with Sampler():
            module(*inputs)
            optimizer.step()
            module.lazy_reset_grad()
    report = {"rank": rank, "step_s": times, "rest_bytes": rest, "peak_bytes": peak["bytes"], "layers": peak["layers"]}
    print(json.dumps(report), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def run_world(world_size: int, mode: str, directory: Path, args: argparse.Namespace) -> list[dict]:
    """Launch ``world_size`` ranks (env:// rendezvous, as torchrun), every one reaped; each rank's report."""
    command = [sys.executable, __file__, "--worker", str(directory), "--mode", mode]
    command += ["--steps", str(args.steps), "--warmup", str(args.warmup), *(["--compile"] if args.compile else [])]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "ORT_TORCH_TRAIN_THREADS": "1"}
    outputs = run_local_ranks(command, world_size, args.timeout, environment)
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--worker", type=Path)
    parser.add_argument("--mode", default="single", help=argparse.SUPPRESS)  # a worker's setting
    parser.add_argument("--compile", action="store_true", help="compiled steps (inductor) in every configuration")
    parser.add_argument("--worlds", default="2,4", help="the world sizes, comma-separated")
    parser.add_argument("--modes", default="ddp,zero2,zero3", help=f"configurations besides one process, of {MODES}")
    parser.add_argument("--untied", action="store_true", help="the output projection its own parameter")
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.steps, args.warmup, args.mode, args.compile)
        return
    from model_artifacts import prepare_artifacts

    modes = args.modes.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"--modes: {unknown} are not among {MODES}")
    model = bench_model(args.layers, args.hidden, args.untied)
    artifacts = prepare_artifacts(model, BENCH / ".cache", use_ort=False)
    results = {}
    for name, world_size, mode in configurations([int(n) for n in args.worlds.split(",")], modes):
        reports = run_world(world_size, mode or "single", artifacts.directory, args)
        results[name] = {
            "median_step_s": statistics.median(reports[0]["step_s"]),
            "rest_bytes_per_rank": max(r["rest_bytes"] for r in reports),
            "rest_bytes_each_rank": [r["rest_bytes"] for r in sorted(reports, key=lambda r: r["rank"])],
            "peak_bytes_per_rank": max(r["peak_bytes"] for r in reports),
            "most_layers_gathered": max(r["layers"] for r in reports),
        }
    one = results["one process"]
    for name, result in results.items():
        world = name.rsplit("x", 1)[-1] if "x" in name else None
        result["peak_vs_one_process"] = (
            result["peak_bytes_per_rank"] / one["peak_bytes_per_rank"] if not args.compile else None
        )
        result["rest_vs_one_process"] = result["rest_bytes_per_rank"] / one["rest_bytes_per_rank"]
        if world is not None and f"ddp x{world}" in results:
            result["step_time_vs_ddp"] = result["median_step_s"] / results[f"ddp x{world}"]["median_step_s"]
    load = os.getloadavg()
    print(
        json.dumps(
            {
                "model": model.describe(),
                "compile": args.compile,
                "cpu_count": os.cpu_count(),
                "loadavg": load,
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
