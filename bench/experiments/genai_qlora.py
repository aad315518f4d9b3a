"""LoRA on an onnxruntime-genai builder model, fp32 against int4 (QLoRA): peak resident set and step time.

``prepare`` makes a random-init Llama-shaped ``transformers`` model (default: hidden 768, 12 layers, MLP
2048, 12 heads over 4 KV heads, vocabulary 32000: 125M parameters; ``--size 345m``: hidden 1024, 24
layers, MLP 2816, 16 heads over 4; never committed), builds it with
onnxruntime-genai's model builder for the CPU at fp32 and at int4 (MatMulNBits, block 32), and writes LoRA
training artifacts for each (``generate_artifacts(lora=LoraConfig(r=8, targets=["all-linear"]))``,
``LossType.LanguageModelLoss``, AdamW) twice: ``plain`` as a LoRA user writes them (the weights LoRA does
not target stay graph constants) and ``frozen`` (every builder weight named in ``frozen_params``, so a
checkpoint parameter). Each precision then trains in its own process, so that its peak resident set is
its own: the resident set after the imports, after loading the checkpoint and after building the Module
and its optimizer, its peak over the steps (sampled every millisecond; the first step converts the
graph), the process's peak (``ru_maxrss``) and the median step time (forward, backward, AdamW on the
adapters) after one warmup step. ``all`` prints a table with the int4/fp32 ratios (target: int4 peak RSS
<= 0.45x fp32's at the same batch).

    python bench/experiments/genai_qlora.py all --out bench/.cache/genai_qlora --steps 5 [--size small|125m|345m] [--artifacts plain|frozen] [--tied] [--json result.json]
    python bench/experiments/genai_qlora.py run DIR --precision fp32|int4 [--artifacts plain|frozen] [--steps 5] [--recompute N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

from memory import RssSampler, in_own_process, memory_mib  # noqa: E402

sys.path.insert(0, str(BENCH.parent / "examples"))
from genai_lora import write_byte_tokenizer  # noqa: E402  (the builder needs a tokenizer; ids are drawn at random)

PRECISIONS = ("fp32", "int4")
ARTIFACTS = ("plain", "frozen")
FULL = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
            num_key_value_heads=4, vocab_size=32000)  # fmt: skip
SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256)  # fmt: skip
LARGE = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=32000,
)  # fmt: skip  (345M parameters)
LLAMA_3_2_1B = dict(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    rope_theta=500000.0,
)  # fmt: skip  (Llama-3.2-1B's shape: 1.24B parameters with the embedding tied)
SIZES = {"small": SMALL, "125m": FULL, "345m": LARGE, "1b": LLAMA_3_2_1B}


def prepare(
    out: Path, size: str, tokens: int, tied: bool = False, rank: int = 8, kinds: tuple[str, ...] = ARTIFACTS
) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    sizes = SIZES[size]
    config = transformers.LlamaConfig(
        **sizes, max_position_embeddings=max(tokens, 128), bos_token_id=1, eos_token_id=2, tie_word_embeddings=tied
    )
    model = transformers.LlamaForCausalLM(config)
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(out / "hf")
    write_byte_tokenizer(out / "hf")
    for precision in PRECISIONS:
        built = out / f"built-{precision}"
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(out / "hf"), "-o", str(built)]
        command += ["-p", precision, "-e", "cpu", "-c", str(out / "builder-cache")]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if not (built / "model.onnx").is_file():
            raise SystemExit(
                f"the builder failed for {precision}:\n{completed.stdout[-2000:]}{completed.stderr[-4000:]}"
            )
        for kind in kinds:
            write_artifacts(built, out / f"artifacts-{precision}-{kind}", frozen=kind == "frozen", rank=rank)
    shape = {"vocab": config.vocab_size, "parameters": parameters, "tied": tied, "rank": rank}
    (out / "shape.json").write_text(json.dumps(shape))


def write_artifacts(built: Path, artifacts: Path, frozen: bool, rank: int = 8) -> None:
    """LoRA artifacts of a builder model; with ``frozen`` every weight is a frozen checkpoint parameter,
    else the weights LoRA does not target stay graph constants."""
    import onnx

    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
    from ort_torch_train.lora import LoraConfig

    model = onnx.load(str(built / "model.onnx"), load_external_data=False)
    weights = [init.name for init in model.graph.initializer if len(init.dims) >= 1 and min(init.dims) > 0]
    del model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        generate_artifacts(
            str(built / "model.onnx"),
            frozen_params=weights if frozen else None,
            loss=LossType.LanguageModelLoss,
            optimizer=OptimType.AdamW,
            artifact_directory=artifacts,
            lora=LoraConfig(r=rank, alpha=2 * rank, targets=["all-linear"]),
        )


def run(
    directory: Path, precision: str, kind: str, steps: int, threads: int, batch: int, tokens: int, recompute: int | None
) -> dict:
    import numpy as np

    from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads

    imported_rss = memory_mib()["VmRSS"]
    set_threads(threads)  # pinned: the library's default follows the load
    shape = json.loads((directory / "shape.json").read_text())
    artifacts = directory / f"artifacts-{precision}-{kind}"
    with RssSampler() as loading:
        state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    loaded_rss = memory_mib()["VmRSS"]
    with RssSampler() as building:
        module = Module(artifacts / "training_model.onnx", state, recompute=recompute)
        optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    built_rss = memory_mib()["VmRSS"]
    rng = np.random.default_rng(0)
    losses, cpu_times = [], []

    def train_step() -> float:
        ids = rng.integers(3, shape["vocab"], (batch, tokens), dtype=np.int64)
        start, start_cpu = time.perf_counter(), time.process_time()
        losses.append(float(module.step(optimizer, ids, np.ones_like(ids), ids)))  # empty past key/values
        cpu_times.append(time.process_time() - start_cpu)  # every thread of the process, the sampler's too
        return time.perf_counter() - start

    with RssSampler() as first_step:
        first_step_s = train_step()
    load_before = os.getloadavg()[0]
    with RssSampler() as later_steps:
        times = [train_step() for _ in range(steps)]
    return {
        "precision": precision,
        "artifacts": kind,
        "recompute": recompute,
        "parameters": shape["parameters"],
        "tied": shape.get("tied", False),
        "trainable_parameters": module.parameters_size(True),
        "batch": batch,
        "tokens": tokens,
        "rss_imported_mib": round(imported_rss, 1),
        "rss_checkpoint_loaded_mib": round(loaded_rss, 1),
        "peak_rss_loading_mib": round(loading.peak["VmRSS"], 1),
        "peak_rss_building_mib": round(building.peak["VmRSS"], 1),
        "rss_built_mib": round(built_rss, 1),
        "peak_rss_steps_mib": round(max(first_step.peak["VmRSS"], later_steps.peak["VmRSS"]), 1),
        "peak_rss_first_step_mib": round(first_step.peak["VmRSS"], 1),
        "peak_rss_later_steps_mib": round(later_steps.peak["VmRSS"], 1),
        "rss_after_steps_mib": round(memory_mib()["VmRSS"], 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "median_step_s": statistics.median(times),
        "first_step_s": first_step_s,
        "step_s": times,
        "step_cpu_s": cpu_times[1:],
        "cores_used_in_steps": sum(cpu_times[1:]) / sum(times),  # CPU seconds per wall second, of --threads
        "load_average_1min": [load_before, os.getloadavg()[0]],  # before and after the later steps
        "losses": losses,
    }


def run_all(
    out: Path,
    size: str,
    kind: str,
    steps: int,
    threads: int,
    batch: int,
    tokens: int,
    recompute: int | None,
    tied: bool = False,
    rank: int = 8,
) -> list[dict]:
    if not (out / "shape.json").is_file():
        prepare(out, size, tokens, tied, rank, kinds=(kind,))
    results = []
    for precision in PRECISIONS:  # each in its own process: its own peak RSS
        arguments = ["run", str(out), "--precision", precision, "--artifacts", kind, "--steps", str(steps)]
        arguments += [*(["--recompute", str(recompute)] if recompute else []), "--threads", str(threads)]
        results.append(in_own_process(__file__, *arguments, "--batch", str(batch), "--tokens", str(tokens)))
    return results


def table(results: list[dict]) -> str:
    fp32 = results[0]
    lines = [
        "| precision | artifacts | parameters | trainable | batch x tokens | RSS built (MiB) | peak RSS in steps (MiB) | vs fp32 "
        "| process peak RSS (MiB) | vs fp32 | step (s) | vs fp32 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['precision']} | {r['artifacts']} | {r['parameters']:,} | {r['trainable_parameters']:,} | {r['batch']} x {r['tokens']} "
            f"| {r['rss_built_mib']} | {r['peak_rss_steps_mib']} | {r['peak_rss_steps_mib'] / fp32['peak_rss_steps_mib']:.2f}x "
            f"| {r['peak_rss_mib']} | {r['peak_rss_mib'] / fp32['peak_rss_mib']:.2f}x "
            f"| {r['median_step_s']:.3f} | {r['median_step_s'] / fp32['median_step_s']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict] | dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    every = commands.add_parser("all")
    every.add_argument("--out", type=Path, default=Path("bench/.cache/genai_qlora"))
    every.add_argument(
        "--size", choices=SIZES, default="125m", help="small: a 2-layer, hidden-64 Llama to check the script"
    )
    every.add_argument("--artifacts", choices=ARTIFACTS, default="plain")
    every.add_argument("--batch", type=int, default=4)
    every.add_argument("--tokens", type=int, default=128)
    every.add_argument("--steps", type=int, default=5)
    every.add_argument("--threads", type=int, default=2)
    every.add_argument("--json", type=Path, help="also write the results here")
    every.add_argument("--rank", type=int, default=8, help="LoRA's r (alpha 2r) on every linear weight")
    every.add_argument("--recompute", type=int, help="recompute segments (Module's recompute=), on both sides")
    every.add_argument(
        "--tied",
        action="store_true",
        help="tie the embedding and LM head (SmolLM, Llama 3.2): the int4 embedding is then GatherBlockQuantized",
    )
    single = commands.add_parser("run")
    single.add_argument("directory", type=Path)
    single.add_argument("--precision", choices=PRECISIONS, required=True)
    single.add_argument("--artifacts", choices=ARTIFACTS, default="plain")
    single.add_argument("--steps", type=int, default=5)
    single.add_argument("--threads", type=int, default=2)
    single.add_argument("--batch", type=int, default=4)
    single.add_argument("--tokens", type=int, default=128)
    single.add_argument("--recompute", type=int)
    args = parser.parse_args(argv)
    if args.command == "run":
        result = run(
            args.directory,
            args.precision,
            args.artifacts,
            args.steps,
            args.threads,
            args.batch,
            args.tokens,
            args.recompute,
        )
        print(json.dumps(result))
        return result
    results = run_all(
        args.out,
        args.size,
        args.artifacts,
        args.steps,
        args.threads,
        args.batch,
        args.tokens,
        args.recompute,
        args.tied,
        args.rank,
    )
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
