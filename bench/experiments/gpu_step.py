"""GPT-2 small (124M) in bf16 on one GPU: this project's one-graph step against the hand-written model.

    python bench/experiments/gpu_step.py --out DIR [--batches 8x512 16x1024] [--modes max-autotune ...]

Both sides train the same ``transformers`` GPT-2 (GPT-2 small's shape, random init, dropout 0, the same
initial weights) on the same batch, with float32 weights under bf16 autocast and an LM cross-entropy loss:

- **ours**: the model exported to ONNX (legacy exporter, dynamic batch and sequence axes), made into
  artifacts by this project's ``generate_artifacts`` (AdamW), trained by ``Module.step`` (forward,
  backward and ORT's AdamW as one compiled graph) with ``compile=<mode>``;
- **torch**: the model itself (``attn_implementation="sdpa"``) under ``torch.compile(mode=<mode>)``, and
  ``torch.optim.AdamW(foreach=True, capturable=True)`` with a tensor learning rate whose ``step`` is
  compiled with the same mode (torch's compiled-optimizer recipe: inductor fuses the update).

The mode decides CUDA graphs on both sides alike: ``max-autotune`` records them, ``max-autotune-no-cudagraphs``
does not. Each configuration is compiled and warmed up, then timed in blocks of steps between two
synchronisations (CUDA events); tokens/s is the median block's. Configurations run one after the other
in this process (a dedicated GPU), each freed before the next. Writes DIR/gpu_step.json after every
configuration and DIR/gpu_step.md at the end. ``--device cpu --tiny`` checks the script on a CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

from lm_models import TransformersLogits  # noqa: E402
from model_artifacts import export_for_training, generate_ours  # noqa: E402
from runners import ours_module  # noqa: E402

from ort_torch_train.training.compile.settings import records_cuda_graphs  # noqa: E402

LR = 1e-4
SEED = 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", nargs="+", default=["8x512", "16x1024"], help="BATCHxTOKENS")
    parser.add_argument("--modes", nargs="+", default=["max-autotune", "max-autotune-no-cudagraphs"])
    parser.add_argument("--sides", nargs="+", default=["torch", "ours"], choices=["torch", "ours"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of hidden 64 (checks the script)")
    return parser.parse_args(argv)


def gpt2(tiny: bool, positions: int) -> torch.nn.Module:
    """GPT-2 small's shape (or a tiny one), random init with a fixed seed, no dropout, SDPA attention."""
    import transformers

    shape = dict(n_embd=64, n_layer=2, n_head=2) if tiny else dict(n_embd=768, n_layer=12, n_head=12)
    config = transformers.GPT2Config(
        vocab_size=50257,
        n_positions=positions,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        use_cache=False,
        attn_implementation="sdpa",
        **shape,
    )
    torch.manual_seed(SEED)
    return TransformersLogits(transformers.GPT2LMHeadModel(config)).train()


def make_artifacts(model: torch.nn.Module, directory: Path) -> None:
    """Export (dynamic batch and tokens) and generate this project's artifacts (cross-entropy, AdamW)."""
    example = torch.zeros(2, 16, dtype=torch.int64)
    axes = {"input": {0: "batch", 1: "tokens"}, "logits": {0: "rows"}}
    generate_ours(*export_for_training(model, example, axes), directory)


def ours_step(artifacts: Path, mode: str, device: str, x: torch.Tensor, y: torch.Tensor):
    module, optimizer = ours_module(
        artifacts, LR, device=device, compile=mode, mixed_precision="bf16", dynamic=False, compile_cache=False
    )

    def step() -> torch.Tensor:
        return module.step(optimizer, x, y)

    return step


def torch_step(model: torch.nn.Module, mode: str, x: torch.Tensor, y: torch.Tensor):
    learning_rate = torch.tensor(LR, device=x.device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, eps=1e-8, weight_decay=0.0, foreach=True, capturable=True
    )
    graphs = records_cuda_graphs({"mode": mode}) and x.is_cuda

    def model_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(inputs.device.type, dtype=torch.bfloat16):
            return torch.nn.functional.cross_entropy(model(inputs), targets)

    compiled_loss = torch.compile(model_loss, mode=mode, dynamic=False)

    @torch.compile(mode=mode, dynamic=False)
    def update() -> None:
        optimizer.step()

    def step() -> torch.Tensor:
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        optimizer.zero_grad(set_to_none=True)
        loss = compiled_loss(x, y)
        loss.backward()
        update()
        return loss.detach().clone()

    return step


def time_blocks(step, args: argparse.Namespace, tokens: int) -> dict:
    """Compile and warm up, then time ``args.blocks`` blocks of ``args.steps`` steps; tokens/s per block."""
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    started = time.perf_counter()
    loss = step()
    sync()
    first = time.perf_counter() - started
    first_loss = float(loss)
    for _ in range(args.warmup - 1):
        loss = step()
    sync()
    block_seconds = []
    for _ in range(args.blocks):
        begin = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        sync()
        block_seconds.append(time.perf_counter() - begin)
    median = float(np.median(block_seconds))
    return {
        "first_step_s": first,
        "block_s": block_seconds,
        "step_ms": 1000 * median / args.steps,
        "tokens_per_s": tokens * args.steps / median,
        "spread": (max(block_seconds) - min(block_seconds)) / median,
        "first_loss": first_loss,
        "last_loss": float(loss),
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }


def run_config(side: str, mode: str, batch: int, tokens: int, args, artifacts: Path, x, y) -> dict:
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    torch._dynamo.reset()
    if side == "ours":
        step = ours_step(artifacts, mode, args.device, x, y)
    else:
        step = torch_step(gpt2(args.tiny, 1024).to(args.device), mode, x, y)
    try:
        return time_blocks(step, args, batch * tokens)
    finally:
        del step
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


def render(results: list[dict]) -> str:
    lines = [
        "| batch | mode | CUDA graphs | torch tokens/s | ours tokens/s | ours / torch | torch step | ours step "
        "| first step torch / ours | first loss torch / ours | last loss torch / ours |",
        "|---|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    keys = sorted({(r["batch"], r["mode"]) for r in results}, key=lambda k: (k[0], k[1]))
    for batch, mode in keys:
        pair = {r["side"]: r for r in results if (r["batch"], r["mode"]) == (batch, mode)}
        t, o = pair.get("torch", {}), pair.get("ours", {})

        def show(r: dict, key: str, fmt: str) -> str:
            return format(r[key], fmt) if key in r else r.get("error", "-")[:60]

        ratio = f"{o['tokens_per_s'] / t['tokens_per_s']:.3f}x" if "tokens_per_s" in t and "tokens_per_s" in o else "-"
        lines.append(
            f"| {batch} | {mode} | {'yes' if records_cuda_graphs({'mode': mode}) else 'no'} | {show(t, 'tokens_per_s', ',.0f')} "
            f"| {show(o, 'tokens_per_s', ',.0f')} | {ratio} | {show(t, 'step_ms', '.2f')} ms | {show(o, 'step_ms', '.2f')} ms "
            f"| {show(t, 'first_step_s', '.0f')} s / {show(o, 'first_step_s', '.0f')} s "
            f"| {show(t, 'first_loss', '.5f')} / {show(o, 'first_loss', '.5f')} "
            f"| {show(t, 'last_loss', '.5f')} / {show(o, 'last_loss', '.5f')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    header = {
        "command": " ".join([Path(sys.executable).name, "bench/experiments/gpu_step.py", *(argv or sys.argv[1:])]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor(),
        "cpus": os.cpu_count(),
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    results: list[dict] = []
    with tempfile.TemporaryDirectory() as scratch:
        artifacts = Path(scratch)
        began = time.perf_counter()
        make_artifacts(gpt2(args.tiny, 1024), artifacts)
        header["artifacts_s"] = time.perf_counter() - began
        print(f"artifacts made in {header['artifacts_s']:.0f} s", flush=True)
        for shape in args.batches:
            batch, tokens = (int(v) for v in shape.split("x"))
            rng = np.random.default_rng(SEED)
            ids = rng.integers(0, 50257, size=(batch, tokens + 1))
            x = torch.from_numpy(ids[:, :-1].copy()).to(args.device)
            y = torch.from_numpy(ids[:, 1:].reshape(-1).copy()).to(args.device)
            for mode in args.modes:
                for side in args.sides:
                    record = {"batch": shape, "mode": mode, "side": side}
                    began = time.perf_counter()
                    try:
                        record.update(run_config(side, mode, batch, tokens, args, artifacts, x, y))
                    except Exception as exc:  # a failed configuration is reported, the others still run
                        record["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                    record["wall_s"] = time.perf_counter() - began
                    results.append(record)
                    print(json.dumps(record), flush=True)
                    (args.out / "gpu_step.json").write_text(
                        json.dumps({"header": header, "results": results}, indent=1)
                    )
    table = render(results)
    (args.out / "gpu_step.md").write_text(
        f"Command: `{header['command']}`\n\nStarted {header['started']} on {header['device']} ({header['cpus']} CPUs), "
        f"torch {header['torch']}, Python {header['python']}.\n\n{table}\n"
    )
    print(table)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
