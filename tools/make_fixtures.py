"""Make the project's reference fixtures with the real onnxruntime-training 1.19.2.

Run with the ORT venv's Python from the repository root:

    .venv-ort/bin/python tools/make_fixtures.py [--only NAME ...] [--jobs N] [--out DIR]

Each fixture is built in its own subprocess (a fresh onnxblock name counter, torch and ORT RNG),
so `--only` reproduces exactly the files a full run writes. See tests/fixtures/README.md.
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fixture_extras as fx  # noqa: E402
import fixture_io as fio  # noqa: E402
import fixture_record as rec  # noqa: E402
import fixture_record_saved as after_training  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from fixture_export import (  # noqa: E402
    OPSET,
    artifacts_args,
    error_without_batchnorm_trim,
    error_without_layernorm_patch,
    export_kwargs,
    export_model,
    generate,
    patch_layernorm_outputs,
    torch_param_names,
)
from fixture_ort_format import write_ort_format_artifacts  # noqa: E402
from fixture_specs import BY_NAME, FIXTURES, FixtureSpec, make_data  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures"


def seed_everything(seed: int) -> None:
    """Seed python, numpy, torch and ORT (ORT's seed only matters for Dropout)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    ort.set_seed(seed)
    ort.set_default_logger_severity(3)  # generate_artifacts logs every graph transformer otherwise


def header(spec: FixtureSpec, base: onnx.ModelProto, model: torch.nn.Module, args: dict, patches: dict) -> dict:
    """The descriptive part of expected.json (export settings, generate_artifacts args, data keys)."""
    inits = [i.name for i in base.graph.initializer]
    kw = export_kwargs(spec)
    return {
        "name": spec.name,
        "description": spec.description,
        "opset": OPSET,
        "seed": spec.seed,
        "versions": {
            "onnxruntime": ort.__version__,
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "numpy": np.__version__,
        },
        "export": {
            "exporter": "torch.onnx.export legacy (dynamo=False)",
            "training": "TrainingMode.TRAINING",
            "do_constant_folding": False,
            **kw,
        },
        "generate_artifacts": {
            **args,
            "loss": spec.loss
            if spec.loss != "custom"
            else "custom onnxblock: tools/fixture_specs.py WeightedMseL1 (0.7*MSE + 0.3*L1)",
            "optimizer": spec.optimizer,
            "nominal_checkpoint": spec.nominal_checkpoint,
            "additional_output_names": spec.additional_output_names,
        },
        "data_keys": {
            "train": [f"{i.key}_train" for i in spec.inputs] + ["y_train"],
            "eval": [f"{i.key}_eval" for i in spec.inputs] + ["y_eval"],
            "inputs": {i.name: f"{i.key}_train / {i.key}_eval" for i in spec.inputs},
            "target": "y_train / y_eval",
            "call": "module(" + ", ".join(f"{i.key}_train[i]" for i in spec.inputs) + ", y_train[i])",
        },
        "batch": spec.batch,
        "eval_batch": spec.eval_batch,
        "base_model_initializers": inits,
        "torch_params_missing_from_initializers": [n for n in torch_param_names(model) if n not in inits],
        "torch_buffers": [n for n, _ in model.named_buffers()],
        "patches": patches,
        "session_options": "intra_op_num_threads=1, inter_op_num_threads=1 (Module and InferenceSession)",
        "notes": list(spec.notes),
    }


def export_and_generate(spec: FixtureSpec, out: Path) -> tuple[rec.FixtureRun, dict]:
    """data.npz, base_model.onnx and artifacts/; returns the run and the expected.json header."""
    seed_everything(spec.seed)
    data = make_data(spec)
    fio.save_npz(out / "data.npz", data)
    torch.manual_seed(spec.seed)
    model = spec.build_model()
    base = export_model(spec, model, data)
    patches: dict = {}
    raw = base.SerializeToString()
    if ln := patch_layernorm_outputs(base):
        (out / "unpatched").mkdir(exist_ok=True)
        (out / "unpatched" / "base_model.onnx").write_bytes(raw)
        patches["base_model_layernorm_outputs_added"] = {
            "nodes": ln,
            "why": "ORT's gradient builder needs LayerNormalization's Mean/InvStdDev outputs",
            "original": "unpatched/base_model.onnx",
        }
    onnx.save(base, str(out / "base_model.onnx"))
    args = artifacts_args(spec, base, model)
    if ln:
        patches["base_model_layernorm_outputs_added"]["ort_error_without_patch"] = error_without_layernorm_patch(
            spec, out / "unpatched" / "base_model.onnx", args
        )
    if bn := generate(
        spec, out / "base_model.onnx", out / "artifacts", args, keep_original_eval=out / "unpatched" / "eval_model.onnx"
    ):
        patches["eval_model_batchnorm_outputs_trimmed"] = {
            "nodes": bn,
            "why": "eval BatchNormalization(training_mode=0) kept 3 outputs; ORT refuses to load it",
            "original": "unpatched/eval_model.onnx",
            "ort_error_without_patch": error_without_batchnorm_trim(
                out / "artifacts", out / "unpatched" / "eval_model.onnx"
            ),
        }
    return rec.FixtureRun(spec, out, data, base), header(spec, base, model, args, patches)


def record_training(run: rec.FixtureRun, exp: dict, arrays: dict) -> None:
    """The 20-step run, eval, saved checkpoints, inference export and resume (in this order)."""
    state, module = run.open()
    opt, sched, setup = rec.make_optimizer(run, module)
    exp.update(setup)
    exp["optimizer_model"] = fio.optimizer_node_summary(run.art / "optimizer_model.onnx")
    train, arr = rec.train_steps(run, state, module, opt, sched)
    arrays.update(arr)
    if run.spec.scheduler:
        exp["scheduler"]["check"] = rec.scheduler_check(run.spec.scheduler, train)
        exp["scheduler"]["keyword_call_probe"] = rec.scheduler_keyword_probe(run)
    train["loop"] = (
        "module.train(); loss=module(...); optimizer.step(); "
        + ("scheduler.step(); " if sched else "")
        + "module.lazy_reset_grad()"
    )
    train["eval_loss"], eval_arrays = rec.evaluate(run, module)
    train["eval"] = "module.eval(); module(x_eval, ..., y_eval)"
    exp["train"] = train
    arrays["eval_loss"] = np.float32(train["eval_loss"])
    arrays.update(eval_arrays)
    final = rec.param_values(state)
    arrays.update({f"final__{n}": v for n, v in final.items()})
    arrays["final_contiguous_trainable"] = rec.contiguous(module, True)
    arrays["final_contiguous_all"] = rec.contiguous(module, False)
    exp.update(after_training.save_checkpoints(run, state))
    saved = fio.read_checkpoint(run.out / "final_checkpoint_with_optimizer", with_data=True)
    exp["final_checkpoint_optimizer_groups"] = fio.optimizer_groups_summary(saved)
    arrays.update(fio.optimizer_state_arrays(saved))
    exp["inference_export"], outputs = after_training.inference_export(run, module, final)
    fio.save_npz(run.out / "inference_outputs.npz", outputs)
    exp["resume"] = after_training.resume(run, module, opt)


def record_extras(run: rec.FixtureRun, exp: dict, arrays: dict) -> None:
    """Nominal checkpoint, dropout probe, BatchNorm stats check and optimizer variants."""
    spec = run.spec
    if spec.nominal_checkpoint:
        init = {k[len("init__") :]: v for k, v in arrays.items() if k.startswith("init__")}
        exp["nominal_checkpoint_behaviour"] = fx.nominal_behaviour(run, init, exp["gradient_semantics"]["loss_call1"])
    if spec.stochastic:
        exp["dropout_observation"] = fx.dropout_probe(
            run, {k: exp["generate_artifacts"][k] for k in ("requires_grad", "frozen_params")}
        )
        exp["nondeterministic_training"] = True
        exp["nondeterminism_note"] = (
            "Dropout(p=0.5) draws from ORT's RNG (seeded here with onnxruntime.set_seed), which a torch "
            "re-implementation cannot reproduce: train losses, gradients, final parameters, optimizer state "
            "and resume losses are ORT's own and only reproducible with ORT. Deterministic, hence comparable: "
            "the eval graph has no randomness (Dropout is identity, BatchNorm uses the constant running stats), "
            "so gradient_semantics.eval_loss_initial_params (eval before any optimizer step), eval_loss and "
            "inference_outputs are exact functions of the init__* / final__* parameters; dropout_observation "
            "gives the observed drop fraction and the scale of kept values."
        )
    if spec.track_frozen_each_step:
        exp["running_stats_check"] = fx.batchnorm_stats_check(run, spec.lr)
    if spec.optimizer_variants:
        exp["optimizer_variants"], arr = fx.optimizer_variants(run, spec.lr)
        arrays.update(arr)


def write_summaries(out: Path) -> None:
    """graphs.json (every ONNX file) and checkpoint_dump.json (every checkpoint's structure)."""
    graphs = {str(p.relative_to(out)): fio.graph_summary(p) for p in sorted(out.rglob("*.onnx"))}
    graphs = {k.removeprefix("artifacts/"): v for k, v in graphs.items()}
    fio.save_json(out / "graphs.json", graphs)
    cks = [
        out / "artifacts" / "checkpoint",
        out / "artifacts" / "nominal_checkpoint",
        out / "final_checkpoint_with_optimizer",
        out / "final_checkpoint_no_optimizer",
    ]
    fio.save_json(
        out / "checkpoint_dump.json", {str(p.relative_to(out)): fio.read_checkpoint(p) for p in cks if p.exists()}
    )


def build_fixture(spec: FixtureSpec, root: Path) -> None:
    """Make tests/fixtures/<name>/ from scratch."""
    out = root / spec.name
    fio.SCRUB[str(out)] = "<fixture_dir>"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run, exp = export_and_generate(spec, out)
    info, arrays = rec.record_setup(run)
    exp.update(info)
    exp["gradient_semantics"], grad_arrays = rec.gradient_semantics(run)
    arrays.update(grad_arrays)
    if not spec.stochastic:
        init = {k[len("init__") :]: v for k, v in arrays.items() if k.startswith("init__")}
        exp["torch_crosscheck_first_step"] = rec.torch_crosscheck(
            run,
            init,
            exp["gradient_semantics"]["loss_call1"],
            {k[len("grad_step1__") :]: v for k, v in grad_arrays.items() if k.startswith("grad_step1__")},
        )
    record_training(run, exp, arrays)
    record_extras(run, exp, arrays)
    if spec.ort_format:
        write_ort_format_artifacts(run)
    fio.save_npz(out / "arrays.npz", arrays)
    write_summaries(out)
    exp["arrays_npz_keys_note"] = "keys use '__' as separator, e.g. final__0.weight, grad_step1__0.weight"
    exp["files"] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) + ["expected.json"]
    fio.save_json(out / "expected.json", exp)


def run_worker(name: str, root: Path) -> int:
    """Subprocess entry point: build one fixture."""
    t0 = time.time()
    build_fixture(BY_NAME[name], root)
    print(f"[{name}] done in {time.time() - t0:.1f}s", flush=True)
    return 0


def spawn(name: str, root: Path) -> tuple[str, int, str]:
    """Build one fixture in a fresh interpreter; returns (name, returncode, output).

    Each worker gets its own working directory: onnxblock writes a scratch `temp.onnx` into the cwd.
    """
    with tempfile.TemporaryDirectory(prefix=f"fixture_{name}_") as cwd:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--out", str(root.resolve())]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    return name, proc.returncode, proc.stdout if proc.returncode == 0 else proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", choices=sorted(BY_NAME), help="fixtures to (re)build")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output root (default tests/fixtures)")
    parser.add_argument("--jobs", type=int, default=2, help="fixtures built in parallel (default 2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        return run_worker(ns.worker, ns.out)
    if not ort.__version__.startswith("1.19.2"):
        parser.error(f"needs onnxruntime-training 1.19.2, found {ort.__version__}")
    names = ns.only or [f.name for f in FIXTURES]
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, ns.jobs)) as pool:
        for name, rc, output in pool.map(lambda n: spawn(n, ns.out), names):
            print(output.strip() if rc == 0 else f"[{name}] FAILED (rc={rc})\n{output}", flush=True)
            failed += [name] if rc else []
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
