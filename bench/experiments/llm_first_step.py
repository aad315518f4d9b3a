"""The first LoRA step of an LLM-sized builder model: Module construction + first eager step, against
Hugging Face PEFT's model load + first step on the same weights and batch.

``prepare`` makes a random-init ``transformers`` Llama of SmolLM-135M's shape (hidden 576, 30 layers, MLP
1536, 9 heads over 3 KV heads, vocabulary 49152, tied embeddings; ``--layers`` changes the depth,
``--small`` makes a 2-layer hidden-64 one to check the script), builds it with onnxruntime-genai's model
builder for the CPU (fp32, and int4 with ``--int4``) and writes LoRA artifacts (``generate_artifacts(lora=
LoraConfig(r=8, targets=["all-linear"]))``, ``LanguageModelLoss``, AdamW), as genai_qlora.py does.

Each side runs in its own process, in turns (ours, PEFT, ours, ...; ``--rounds``), timing from after its
imports:

- ours: ``CheckpointState.load_checkpoint``, ``Module`` + ``Optimizer`` construction, the first
  ``module.step`` (forward, backward, AdamW), split into the graph conversion, the graph passes (the
  library's INFO lines give both) and the rest (the step's run), then a second step;
- PEFT: ``AutoModelForCausalLM.from_pretrained`` + ``get_peft_model`` (r=8, alpha 16, the seven
  projections) + ``torch.optim.AdamW``, the first step (forward with labels, backward, update), a second.

Both run eager float32 (int4 rows: ours on the int4 build, PEFT still float32) on the same token batch with
the same thread count. ``--before ROOT`` runs ours also from another checkout's tree (a "before" figure).
``all`` prints a table with ours / PEFT for load + first step (target: <= 1.5x).

    python bench/experiments/llm_first_step.py all --out bench/.cache/llm_first_step [--int4] [--precisions int4] [--rounds 2] [--before ROOT] [--json result.json]
    python bench/experiments/llm_first_step.py ours DIR --precision fp32|int4 [--root ROOT]
    python bench/experiments/llm_first_step.py peft DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))
sys.path.insert(0, str(BENCH / "experiments"))

from memory import in_own_process  # noqa: E402

SMOLLM = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3, vocab_size=49152)
SMALL = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def prepare(out: Path, layers: int, small: bool, int4: bool, tokens: int) -> None:
    import torch
    import transformers
    from genai_qlora import write_artifacts, write_byte_tokenizer

    torch.manual_seed(0)
    sizes = SMALL if small else SMOLLM
    config = transformers.LlamaConfig(
        **sizes, num_hidden_layers=2 if small else layers, max_position_embeddings=max(tokens, 128),
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(out / "hf")
    write_byte_tokenizer(out / "hf")
    for precision in ("fp32", "int4") if int4 else ("fp32",):
        built = out / f"built-{precision}"
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(out / "hf"), "-o", str(built)]
        command += ["-p", precision, "-e", "cpu", "-c", str(out / "builder-cache")]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if not (built / "model.onnx").is_file():
            raise SystemExit(f"the builder failed for {precision}:\n{completed.stderr[-4000:]}")
        write_artifacts(built, out / f"artifacts-{precision}", frozen=False)
    shape = {"vocab": config.vocab_size, "layers": config.num_hidden_layers, "parameters": model.num_parameters()}
    (out / "shape.json").write_text(json.dumps(shape))


class _Durations(logging.Handler):
    """The seconds the library's INFO lines report for converting and preparing the training graph."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seconds: dict[str, float] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for phase, start in (("conversion", "converted the training graph"), ("passes", "prepared the training graph")):
            if message.startswith(start):
                self.seconds[phase] = self.seconds.get(phase, 0.0) + float(message.rsplit(" in ", 1)[1].split()[0])


def batch(vocab: int, rows: int, tokens: int):
    import numpy as np

    return np.random.default_rng(0).integers(3, vocab, (rows, tokens), dtype=np.int64)


def ours(directory: Path, precision: str, rows: int, tokens: int, threads: int, root: str | None) -> dict:
    if root is not None:
        from checkout import import_checkout

        import_checkout(root)
    import numpy as np

    from ort_torch_train.api import CheckpointState, Module, Optimizer, set_threads

    durations = _Durations()
    logging.getLogger("ort_torch_train").addHandler(durations)
    logging.getLogger("ort_torch_train").setLevel(logging.INFO)
    set_threads(threads)
    artifacts = directory / f"artifacts-{precision}"
    ids = batch(json.loads((directory / "shape.json").read_text())["vocab"], rows, tokens)
    started = time.perf_counter()
    state = CheckpointState.load_checkpoint(artifacts / "checkpoint")
    loaded = time.perf_counter()
    module = Module(artifacts / "training_model.onnx", state, artifacts / "eval_model.onnx")
    optimizer = Optimizer(artifacts / "optimizer_model.onnx", module)
    built = time.perf_counter()
    first = float(module.step(optimizer, ids, np.ones_like(ids), ids))
    stepped = time.perf_counter()
    module.step(optimizer, ids, np.ones_like(ids), ids)
    second = time.perf_counter() - stepped
    conversion, passes = durations.seconds.get("conversion", 0.0), durations.seconds.get("passes", 0.0)
    return {
        "side": "ours" if root is None else f"ours ({root})",
        "precision": precision,
        "checkpoint_s": loaded - started,
        "construction_s": built - loaded,
        "first_step_s": stepped - built,
        "conversion_s": conversion,
        "passes_s": passes,
        "first_step_run_s": stepped - built - conversion - passes,
        "load_and_first_step_s": stepped - started,
        "second_step_s": second,
        "first_loss": first,
    }


def peft(directory: Path, rows: int, tokens: int, threads: int) -> dict:
    import peft as hf_peft
    import torch
    import transformers

    torch.set_num_threads(threads)
    ids = torch.from_numpy(batch(json.loads((directory / "shape.json").read_text())["vocab"], rows, tokens))
    started = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(directory / "hf", dtype=torch.float32)
    model = hf_peft.get_peft_model(model, hf_peft.LoraConfig(r=8, lora_alpha=16, target_modules=PROJECTIONS))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    loaded = time.perf_counter()

    def step() -> float:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return float(loss)

    first = step()
    stepped = time.perf_counter()
    step()
    return {
        "side": "peft",
        "precision": "fp32",
        "load_s": loaded - started,
        "first_step_s": stepped - loaded,
        "load_and_first_step_s": stepped - started,
        "second_step_s": time.perf_counter() - stepped,
        "first_loss": first,
    }


def run_all(out: Path, args: argparse.Namespace) -> dict:
    if not (out / "shape.json").is_file():
        prepare(out, args.layers, args.small, args.int4, args.tokens)
    common = ["--rows", str(args.rows), "--tokens", str(args.tokens), "--threads", str(args.threads)]
    built = ("fp32", "int4") if (out / "artifacts-int4").is_dir() else ("fp32",)
    precisions = [precision for precision in built if precision in (args.precisions or built)]
    runs: list[dict] = []
    for _ in range(args.rounds):
        for precision in precisions:
            runs.append(in_own_process(__file__, "ours", str(out), "--precision", precision, *common))
            if args.before:
                arguments = ["ours", str(out), "--precision", precision, "--root", args.before, *common]
                runs.append(in_own_process(__file__, *arguments))
        runs.append(in_own_process(__file__, "peft", str(out), *common))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    shape = json.loads((out / "shape.json").read_text())
    return {
        "shape": shape,
        "rows": args.rows,
        "tokens": args.tokens,
        "threads": args.threads,
        "load": uptime,
        "runs": runs,
    }


def table(result: dict) -> str:
    groups: dict[tuple[str, str], list[dict]] = {}
    for run in result["runs"]:
        groups.setdefault((run["side"], run["precision"]), []).append(run)
    peft_total = statistics.median(r["load_and_first_step_s"] for r in groups[("peft", "fp32")])
    lines = [
        "| side | precision | runs | load (s) | construction (s) | conversion (s) | passes (s) | first step run (s) "
        "| load + first step (s) | vs PEFT | second step (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (side, precision), runs in groups.items():

        def median(key: str, runs: list[dict] = runs) -> str:
            values = [r[key] for r in runs if key in r]
            return f"{statistics.median(values):.2f}" if values else "-"

        total = statistics.median(r["load_and_first_step_s"] for r in runs)
        load = median("checkpoint_s") if side != "peft" else median("load_s")
        run_s = median("first_step_run_s") if side != "peft" else median("first_step_s")
        lines.append(
            f"| {side} | {precision} | {len(runs)} | {load} | {median('construction_s')} | {median('conversion_s')} "
            f"| {median('passes_s')} | {run_s} | {total:.2f} | {total / peft_total:.2f}x | {median('second_step_s')} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    every = commands.add_parser("all")
    every.add_argument("--out", type=Path, default=Path("bench/.cache/llm_first_step"))
    every.add_argument("--layers", type=int, default=30)
    every.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 Llama to check the script")
    every.add_argument("--int4", action="store_true", help="also the builder's int4 build (ours only)")
    every.add_argument("--precisions", nargs="+", choices=("fp32", "int4"), help="ours on these builds only")
    every.add_argument("--rounds", type=int, default=1)
    every.add_argument("--before", help="also run ours from this checkout's tree")
    every.add_argument("--json", type=Path, help="also write the results here")
    for command in (every, commands.add_parser("ours"), commands.add_parser("peft")):
        if command is not every:
            command.add_argument("directory", type=Path)
        command.add_argument("--rows", type=int, default=4)
        command.add_argument("--tokens", type=int, default=128)
        command.add_argument("--threads", type=int, default=2)
        if command.prog.endswith("ours"):
            command.add_argument("--precision", choices=("fp32", "int4"), default="fp32")
            command.add_argument("--root", help="the checkout whose ort_torch_train runs")
    args = parser.parse_args(argv)
    if args.command == "ours":
        result = ours(args.directory, args.precision, args.rows, args.tokens, args.threads, args.root)
    elif args.command == "peft":
        result = peft(args.directory, args.rows, args.tokens, args.threads)
    else:
        result = run_all(args.out, args)
        print(table(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return result
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
