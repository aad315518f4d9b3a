"""LoRA against full fine-tuning on a GPT-2-small-shaped model (124M parameters, transformers' GPT2Config).

``prepare`` exports a random-init ``transformers`` GPT-2 (default config: 12 layers, hidden 768, vocab
50257) and writes plain training artifacts (CrossEntropy, AdamW; every parameter trainable). Each
variant then runs in its own process, so that its peak resident set is its own:

- ``full``: ``Module`` on the plain artifacts, every parameter trained;
- ``lora``: ``Module(..., lora=LoraConfig(r=8, alpha=16, targets=attention and MLP weights))``, the
  base frozen in float32;
- ``lora-bf16``: the same with ``frozen_dtype=torch.bfloat16``.

With ``--compile`` each variant runs ``Module(compile=True)`` and ``module.step`` (one compiled graph per step),
its batch axis and labels dynamic (the default); ``--compile fixed`` compiles for the one shape (``dynamic=False``).

Each reports the trainable parameters (count and share), the resident set after building the
Module, its peak during the steps (sampled every millisecond): over all of them, in the first one alone
(which converts the graph) and in the steps after it (training proper), and over the whole process
(``ru_maxrss``, which includes loading the checkpoint: its file bytes and its tensors at once), and the
median step time (forward, backward, AdamW update) over ``--steps`` steps after one warmup step. ``all`` runs ``prepare`` then every
variant and prints a table with the ratios against ``full`` (targets: trainable < 1 %, peak RSS
<= 0.5x with float32 frozen weights and lower with bfloat16, step time <= 0.8x).

    python bench/experiments/lora.py all --out bench/.cache/lora --steps 10 [--small] [--compile [fixed]] [--json result.json]
    python bench/experiments/lora.py prepare --out DIR [--small]
    python bench/experiments/lora.py run DIR --variant full|lora|lora-bf16 [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

from lm_models import TransformersLogits  # noqa: E402
from memory import RssSampler, in_own_process, memory_mib  # noqa: E402

VARIANTS = ("full", "lora", "lora-bf16")
TARGETS = ["*attn.c_attn.weight", "*attn.c_proj.weight", "*mlp.c_fc.weight", "*mlp.c_proj.weight"]
SMALL = {"n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 256}


def peak_rss_mib() -> float:
    """The process's peak resident set so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prepare(out: Path, small: bool, batch: int, tokens: int) -> None:
    import torch
    import transformers

    from ort_torch_train.artifacts import AdamW, LossType, generate_artifacts

    torch.manual_seed(0)
    sizes = {**SMALL, "bos_token_id": 0, "eos_token_id": 0} if small else {}
    config = transformers.GPT2Config(
        n_positions=tokens, use_cache=False, attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, **sizes,
    )  # fmt: skip
    generate_artifacts(
        TransformersLogits(transformers.GPT2LMHeadModel(config)),
        example_inputs=(torch.zeros(batch, tokens, dtype=torch.int64),),
        input_names=["tokens"],
        output_names=["logits"],
        loss=LossType.CrossEntropyLoss,
        optimizer=AdamW(),
        artifact_directory=out,
    )
    (out / "shape.json").write_text(json.dumps({"batch": batch, "tokens": tokens, "vocab": config.vocab_size}))


def run(directory: Path, variant: str, steps: int, threads: int, compile: str | None = None) -> dict:
    import numpy as np
    import torch

    from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads
    from ort_torch_train.lora import LoraConfig

    set_threads(threads)  # pinned: the library's default follows the load
    shape = json.loads((directory / "shape.json").read_text())
    lora = None
    if variant != "full":
        lora = LoraConfig(
            r=8, alpha=16, targets=TARGETS, frozen_dtype=torch.bfloat16 if variant == "lora-bf16" else None
        )
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(
        directory / "training_model.onnx", state, lora=lora, compile=compile is not None, dynamic=compile != "fixed"
    )
    optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    built_rss = memory_mib()["VmRSS"]
    rng = np.random.default_rng(0)
    losses = []

    def train_step() -> float:
        tokens = rng.integers(0, shape["vocab"], (shape["batch"], shape["tokens"] + 1), dtype=np.int64)
        inputs = (tokens[:, :-1].copy(), tokens[:, 1:].reshape(-1).copy())
        start = time.perf_counter()
        if compile is not None:  # the three calls as one compiled graph
            losses.append(float(module.step(optimizer, *inputs)))
        else:
            losses.append(float(module(*inputs)))
            optimizer.step()
            module.lazy_reset_grad()
        return time.perf_counter() - start

    with RssSampler() as first_step:  # the first step converts the graph: untimed, its peak apart
        train_step()
    with RssSampler() as later_steps:
        times = [train_step() for _ in range(steps)]
    first, later = first_step.peak["VmRSS"], later_steps.peak["VmRSS"]
    trainable, total = module.parameters_size(True), module.parameters_size(False)
    return {
        "variant": variant + {None: "", "dynamic": " compiled", "fixed": " compiled, fixed shapes"}[compile],
        "trainable_parameters": trainable,
        "all_parameters": total,
        "trainable_share": trainable / total,
        "rss_built_mib": round(built_rss, 1),
        "peak_rss_steps_mib": round(max(first, later), 1),
        "peak_rss_first_step_mib": round(first, 1),
        "peak_rss_later_steps_mib": round(later, 1),
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "median_step_s": statistics.median(times),
        "losses": losses,
    }


def run_all(
    out: Path, small: bool, steps: int, threads: int, batch: int, tokens: int, compile: str | None = None
) -> list[dict]:
    if not (out / "checkpoint").is_file():
        prepare(out, small, batch, tokens)
    results = []
    for variant in VARIANTS:  # each in its own process: its own peak RSS
        arguments = ["run", str(out), "--variant", variant, "--steps", str(steps), "--threads", str(threads)]
        results.append(in_own_process(__file__, *arguments, *(["--compile", compile] if compile else [])))
    return results


def table(results: list[dict]) -> str:
    full = results[0]
    lines = [
        "| variant | trainable | share | RSS built (MiB) | peak RSS in steps (MiB) | vs full "
        "| peak RSS, first step (MiB) | peak RSS, later steps (MiB) | vs full "
        "| process peak RSS (MiB) | vs full | step (s) | step vs full |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        lines.append(
            f"| {result['variant']} | {result['trainable_parameters']:,} | {100 * result['trainable_share']:.2f}% "
            f"| {result['rss_built_mib']} | {result['peak_rss_steps_mib']} "
            f"| {result['peak_rss_steps_mib'] / full['peak_rss_steps_mib']:.2f}x "
            f"| {result['peak_rss_first_step_mib']} | {result['peak_rss_later_steps_mib']} "
            f"| {result['peak_rss_later_steps_mib'] / full['peak_rss_later_steps_mib']:.2f}x "
            f"| {result['peak_rss_mib']} | {result['peak_rss_mib'] / full['peak_rss_mib']:.2f}x "
            f"| {result['median_step_s']:.3f} | {result['median_step_s'] / full['median_step_s']:.2f}x |"
        )
    return "\n".join(lines)


COMPILE_OPTION: dict = dict(
    nargs="?",
    const="dynamic",
    choices=["dynamic", "fixed"],
    help="one compiled graph per step, with dynamic axes (the default) or for fixed shapes",
)


def main(argv: list[str] | None = None) -> list[dict] | dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("all", "prepare"):
        sub = commands.add_parser(name)
        sub.add_argument("--out", type=Path, default=Path("bench/.cache/lora"))
        sub.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 GPT-2 to check the script")
        sub.add_argument("--batch", type=int, default=4)
        sub.add_argument("--tokens", type=int, default=128)
    commands.choices["all"].add_argument("--steps", type=int, default=10)
    commands.choices["all"].add_argument("--threads", type=int, default=2)
    commands.choices["all"].add_argument("--json", type=Path, help="also write the results here")
    commands.choices["all"].add_argument("--compile", **COMPILE_OPTION)
    single = commands.add_parser("run")
    single.add_argument("artifacts", type=Path)
    single.add_argument("--variant", choices=VARIANTS, required=True)
    single.add_argument("--steps", type=int, default=10)
    single.add_argument("--threads", type=int, default=2)
    single.add_argument("--compile", **COMPILE_OPTION)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.out, args.small, args.batch, args.tokens)
        return None
    if args.command == "run":
        result = run(args.artifacts, args.variant, args.steps, args.threads, args.compile)
        print(json.dumps(result))
        return result
    results = run_all(args.out, args.small, args.steps, args.threads, args.batch, args.tokens, args.compile)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
