"""Past 2 GB: a GPT-2-large-shaped model (774M parameters, 3.1 GB of float32) end to end.

Each phase runs in its own process (its own time and peak resident set):

- ``export``: a random-init ``transformers`` GPT-2 (GPT2Config n_embd=1280, n_layer=36, n_head=20) exported
  with torch's exporter to ``base.onnx`` (external data past 2 GB);
- ``artifacts-frozen``: ``generate_artifacts(base.onnx, requires_grad=<last block and ln_f>,
  frozen_params=<the rest>)`` (CrossEntropy, AdamW), ORT's requires_grad=[...] list;
- ``artifacts-full``: the same with every parameter trainable;
- ``train-frozen`` / ``train-full``: ``Module`` + ``Optimizer``, one first step (``first-step-*``: it
  converts the graph, and the conversion's example run holds a copy of every graph input, parameters
  included) and ``--steps`` more, then
  ``save_checkpoint`` (with the optimizer state) and ``export_model_for_inferencing`` (which switches to external data by itself past
  2 GB); the eval logits are kept for ``infer``. Peak RSS of the steps, less the process's RSS before
  loading (interpreter, torch), is compared with parameters + gradients + AdamW moments + activations
  (the bytes autograd saves, counted on the first step): ``peak_over_expected``, target <= 1.2;
- ``infer-<variant>``: the export in onnxruntime (the installed, inference-only release), against the logits;
- ``ort-load-<variant>``: onnxruntime-training 1.19.2 (``.venv-ort``) loads the saved checkpoint.

Full training needs about 4x the parameters (13 GB at full size): ``--variants frozen`` leaves it out.
The script refuses to start a full-size run with less than ``--min-free-gb`` available.

    python bench/experiments/large_model.py all --out bench/.cache/large [--variants frozen,full] [--steps 3]
    python bench/experiments/large_model.py all --out /tmp/large-small --small   # checks the script (seconds)

It prints a table and writes the phases to ``--json`` (default ``bench/results/large_model.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH / "harness"))

from lm_models import TransformersLogits  # noqa: E402
from memory import RssSampler, in_own_process, memory_mib  # noqa: E402

GPT2_LARGE = {"n_embd": 1280, "n_layer": 36, "n_head": 20}
SMALL = {"n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 256}
SMALL_THRESHOLD = 4096  # bytes: the small model takes the external-data path too
ROOT = Path(__file__).resolve().parents[2]
ORT_PYTHON = Path(os.environ.get("ORT_TRAINING_PYTHON", ROOT / ".venv-ort" / "bin" / "python"))


def phase_result(name: str, start: float, sampler: RssSampler, **extra: object) -> dict:
    return {
        "phase": name,
        "seconds": round(time.perf_counter() - start, 2),
        "peak_rss_mib": round(sampler.peak["VmRSS"], 1),
        "peak_rss_anon_mib": round(sampler.peak.get("RssAnon", 0.0), 1),
        "process_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        **extra,
    }


def config(small: bool, tokens: int):  # noqa: ANN201  (transformers is imported lazily)
    import transformers

    sizes = {**SMALL, "bos_token_id": 0, "eos_token_id": 0} if small else GPT2_LARGE
    return transformers.GPT2Config(
        n_positions=tokens, use_cache=False, attn_implementation="eager", resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, **sizes,
    )  # fmt: skip


def export(out: Path, small: bool, batch: int, tokens: int) -> dict:
    import torch
    import transformers

    start = time.perf_counter()
    with RssSampler() as sampler:
        torch.manual_seed(0)
        gpt2 = config(small, tokens)
        with torch.no_grad():
            model = TransformersLogits(transformers.GPT2LMHeadModel(gpt2))
        parameters = sum(p.numel() for p in model.parameters())
        (out / "base").mkdir(parents=True, exist_ok=True)
        torch.onnx.export(
            model, (torch.zeros(batch, tokens, dtype=torch.int64),), str(out / "base" / "base.onnx"), dynamo=False,
            opset_version=17, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
            input_names=["tokens"], output_names=["logits"],
        )  # fmt: skip
    (out / "shape.json").write_text(json.dumps({"batch": batch, "tokens": tokens, "vocab": gpt2.vocab_size}))
    data = sum(path.stat().st_size for path in (out / "base").iterdir())
    return phase_result("export", start, sampler, parameters=parameters, onnx_bytes=data)


def trainable_subset(names: list[str], layers: int) -> list[str]:
    """ORT-style requires_grad list: the last transformer block and the final LayerNorm."""
    return [name for name in names if f".h.{layers - 1}." in name or ".ln_f." in name]


def artifacts(out: Path, variant: str, small: bool) -> dict:
    import onnx

    from ort_torch_train.artifacts import AdamW, LossType, generate_artifacts

    start = time.perf_counter()
    with RssSampler() as sampler:
        base = out / "base" / "base.onnx"
        light = onnx.load(base, load_external_data=False)
        params = [i.name for i in light.graph.initializer if i.name.startswith("model.") and i.data_type == 1]
        layers = (SMALL if small else GPT2_LARGE)["n_layer"]
        trainable = trainable_subset(params, layers) if variant == "frozen" else params
        generate_artifacts(
            base, requires_grad=trainable, frozen_params=[name for name in params if name not in trainable],
            loss=LossType.CrossEntropyLoss, optimizer=AdamW(), artifact_directory=out / variant,
            additional_output_names=["logits"],
            external_data_threshold=SMALL_THRESHOLD if small else None,
        )  # fmt: skip
    files = {path.name: path.stat().st_size for path in sorted((out / variant).iterdir())}
    return phase_result(f"artifacts-{variant}", start, sampler, files=files, trainable_names=len(trainable))


def train(out: Path, variant: str, steps: int, threads: int, small: bool) -> dict:
    import numpy as np
    import torch

    from ort_torch_train.api import CheckpointState, Module, Optimizer
    from ort_torch_train.export import external_data

    if small:
        external_data.EXTERNAL_DATA_THRESHOLD = SMALL_THRESHOLD
    from ort_torch_train.api import set_threads

    set_threads(threads)  # pinned: the library's default follows the load
    directory = out / variant
    shape = json.loads((out / "shape.json").read_text())
    phases = []
    baseline = memory_mib()["VmRSS"]  # the interpreter, torch and this project, before any tensor
    start = time.perf_counter()
    with RssSampler() as sampler:
        state = CheckpointState.load_checkpoint(directory / "checkpoint")
        module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx")
        optimizer = Optimizer(directory / "optimizer_model.onnx", module)
    phases.append(phase_result(f"load-{variant}", start, sampler))
    trainable, total = module.parameters_size(True), module.parameters_size(False)

    rng = np.random.default_rng(0)
    batches = [rng.integers(0, shape["vocab"], (shape["batch"], shape["tokens"] + 1)) for _ in range(steps + 1)]
    parameters = {t.untyped_storage().data_ptr() for t in module.training_state.params.values()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:  # activations only: saved weights are counted as parameters
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    def step(tokens: np.ndarray) -> float:
        module.train()
        loss = float(module(tokens[:, :-1].copy(), tokens[:, 1:].reshape(-1).copy())[0])
        optimizer.step()
        module.lazy_reset_grad()
        return loss

    start = time.perf_counter()
    with RssSampler() as sampler, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        losses = [step(batches[0])]  # converts the training graph
    phases.append(phase_result(f"first-step-{variant}", start, sampler))
    times = []
    start = time.perf_counter()
    with RssSampler() as sampler:
        for tokens in batches[1:]:
            began = time.perf_counter()
            losses.append(step(tokens))
            times.append(time.perf_counter() - began)
    state_bytes = total * 4 + 3 * trainable * 4  # parameters + gradients + AdamW's two moments (float32)
    activation_bytes = sum(saved.values())
    expected_mib = (state_bytes + activation_bytes) / 2**20
    phases.append(
        phase_result(
            f"train-{variant}",
            start,
            sampler,
            trainable_parameters=trainable,
            all_parameters=total,
            losses=losses,
            step_seconds=times,
            activation_mib=round(activation_bytes / 2**20, 1),
            expected_mib=round(expected_mib, 1),
            baseline_rss_mib=round(baseline, 1),
            peak_over_expected=round((sampler.peak["VmRSS"] - baseline) / expected_mib, 3),
        )  # fmt: skip
    )

    start = time.perf_counter()
    with RssSampler() as sampler:
        CheckpointState.save_checkpoint(state, directory / "trained_checkpoint", include_optimizer_state=True)
    phases.append(
        phase_result(f"save-{variant}", start, sampler, external=(directory / "trained_checkpoint.data").exists())
    )

    start = time.perf_counter()
    with RssSampler() as sampler:
        module.export_model_for_inferencing(directory / "inference.onnx", ["logits"])
    files = {p.name: p.stat().st_size for p in directory.iterdir() if p.name.startswith("inference.onnx")}
    phases.append(phase_result(f"export-{variant}", start, sampler, files=files))
    module.eval()
    _, logits = module(batches[0][:, :-1].copy(), batches[0][:, 1:].reshape(-1).copy())
    np.save(directory / "eval_tokens.npy", batches[0][:, :-1])
    np.save(directory / "eval_logits.npy", np.asarray(logits))
    return {"phases": phases}


def infer(out: Path, variant: str) -> dict:
    import numpy as np
    import onnxruntime

    directory = out / variant
    tokens, expected = np.load(directory / "eval_tokens.npy"), np.load(directory / "eval_logits.npy")
    start = time.perf_counter()
    with RssSampler() as sampler:
        session = onnxruntime.InferenceSession(str(directory / "inference.onnx"), providers=["CPUExecutionProvider"])
        (logits,) = session.run(None, {"tokens": tokens})
    error = float(np.abs(logits - expected).max())
    return phase_result(f"infer-{variant}", start, sampler, max_abs_error=error, onnxruntime=onnxruntime.__version__)


ORT_LOAD = """
import json, sys, time
from onnxruntime.training.api import CheckpointState
start = time.perf_counter()
state = CheckpointState.load_checkpoint(sys.argv[1])
names = list(state.parameters)
print(json.dumps({"phase": sys.argv[2], "seconds": round(time.perf_counter() - start, 2), "parameters": len(names)}))
"""


def ort_load(out: Path, variant: str) -> dict:
    if not ORT_PYTHON.exists():
        return {"phase": f"ort-load-{variant}", "skipped": f"no onnxruntime-training python at {ORT_PYTHON}"}
    checkpoint = out / variant / "trained_checkpoint"
    completed = subprocess.run(
        [str(ORT_PYTHON), "-c", ORT_LOAD, str(checkpoint), f"ort-load-{variant}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if completed.returncode != 0:
        return {"phase": f"ort-load-{variant}", "error": completed.stderr[-2000:]}
    return json.loads(completed.stdout.strip().splitlines()[-1])


def in_process(*arguments: str) -> dict:
    """Run one phase of this script in its own process; its JSON result."""
    return in_own_process(__file__, *arguments, cwd=ROOT)


def available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


def run_all(args: argparse.Namespace) -> list[dict]:
    if not args.small and available_gib() < args.min_free_gb:
        raise SystemExit(f"only {available_gib():.1f} GiB available, fewer than --min-free-gb {args.min_free_gb}")
    out, common = args.out, ["--small"] if args.small else []
    results = [in_process("export", str(out), "--batch", str(args.batch), "--tokens", str(args.tokens), *common)]
    for variant in args.variants.split(","):
        if not args.small and available_gib() < args.min_free_gb:  # the machine may be shared
            results.append({"phase": f"train-{variant}", "skipped": f"{available_gib():.1f} GiB available"})
            continue
        results.append(in_process("artifacts", str(out), "--variant", variant, *common))
        trained = in_process(
            "train", str(out), "--variant", variant, "--steps", str(args.steps), "--threads", str(args.threads), *common
        )
        results.extend(trained["phases"])
        results.append(in_process("infer", str(out), "--variant", variant))
        results.append(ort_load(out, variant))
    return results


def table(results: list[dict]) -> str:
    lines = ["| phase | seconds | peak RSS (MiB) | peak RssAnon (MiB) | notes |", "|---|---|---|---|---|"]
    for result in results:
        notes = {k: v for k, v in result.items() if k not in ("phase", "seconds", "peak_rss_mib", "peak_rss_anon_mib")}
        notes.pop("losses", None), notes.pop("step_seconds", None)
        lines.append(
            f"| {result['phase']} | {result.get('seconds', '')} | {result.get('peak_rss_mib', '')} "
            f"| {result.get('peak_rss_anon_mib', '')} | {json.dumps(notes)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> object:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    every = commands.add_parser("all")
    every.add_argument("--out", type=Path, default=Path("bench/.cache/large"))
    every.add_argument("--variants", default="frozen,full", help="frozen, full or frozen,full")
    every.add_argument("--steps", type=int, default=3)
    every.add_argument("--threads", type=int, default=2)
    every.add_argument("--min-free-gb", type=float, default=14.0)
    every.add_argument("--json", type=Path, default=Path("bench/results/large_model.json"))
    for name in ("export", "artifacts", "train", "infer"):
        sub = commands.add_parser(name)
        sub.add_argument("out", type=Path)
        sub.add_argument("--variant", choices=("frozen", "full"), default="frozen")
        sub.add_argument("--steps", type=int, default=3)
        sub.add_argument("--threads", type=int, default=2)
    for sub in (every, commands.choices["export"]):
        sub.add_argument("--batch", type=int, default=1)
        sub.add_argument("--tokens", type=int, default=128)
    for sub in (every, commands.choices["export"], commands.choices["artifacts"], commands.choices["train"]):
        sub.add_argument("--small", action="store_true", help="a 2-layer, hidden-64 GPT-2 to check the script")
    args = parser.parse_args(argv)
    result: object
    if args.command == "export":
        result = export(args.out, args.small, args.batch, args.tokens)
    elif args.command == "artifacts":
        result = artifacts(args.out, args.variant, args.small)
    elif args.command == "train":
        result = train(args.out, args.variant, args.steps, args.threads, args.small)
    elif args.command == "infer":
        result = infer(args.out, args.variant)
    else:
        results = run_all(args)
        print(table(results))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        return results
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
