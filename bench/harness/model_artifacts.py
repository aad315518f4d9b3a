"""Training artifacts for the benchmark models, cached under bench/.cache/ by a hash of the model spec.

The model is exported here (this venv has the model's packages, e.g. ``transformers``); ORT 1.19.2's
``generate_artifacts`` then makes the artifacts (in ``.venv-ort``, or ``ORT_TRAINING_PYTHON``) when it is
there; otherwise this project's generator does, and ORT cannot be timed. Run in the ORT venv as

    python bench/harness/model_artifacts.py DIRECTORY

to generate the artifacts of DIRECTORY/base_model.onnx (trainable names in requires_grad.json) with
onnxruntime-training.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from models import OPSET, BenchModel

HARNESS = Path(__file__).resolve().parent
ORT_PYTHON = Path(os.environ.get("ORT_TRAINING_PYTHON", HARNESS.parents[1] / ".venv-ort" / "bin" / "python"))
ARTIFACT_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")


@dataclass(frozen=True)
class ArtifactSet:
    """A directory of artifacts plus the fixed batch (x.npy, y.npy); ``ort_missing`` says why ORT cannot run them."""

    directory: Path
    generator: str
    ort_missing: str | None


def export_base_model(model: BenchModel) -> tuple[onnx.ModelProto, list[str]]:
    """The model exported as the fixtures are (``export_for_training``, dynamic batch)."""
    x, _ = model.batch_arrays()
    return export_for_training(model.build(), torch.from_numpy(x), {"input": {0: "batch"}, "logits": {0: "batch"}})


def export_for_training(
    module: torch.nn.Module, example: torch.Tensor, dynamic_axes: dict[str, dict[int, str]]
) -> tuple[onnx.ModelProto, list[str]]:
    """``module`` exported by the legacy exporter (opset 17, training mode, input "input", output
    "logits", ``dynamic_axes``).

    LayerNormalization nodes get their Mean/InvStdDev outputs, which ORT's gradient builder needs
    (docs: ORT_SEMANTICS.md section 6). Returns the model and the trainable initializer names.
    """
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            buffer,
            dynamo=False,
            opset_version=OPSET,
            training=torch.onnx.TrainingMode.TRAINING,
            do_constant_folding=False,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes=dynamic_axes,
        )
    proto = onnx.load_from_string(buffer.getvalue())
    for node in proto.graph.node:
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            stem = node.name or node.output[0]
            node.output.extend([f"{stem}_saved_mean", f"{stem}_saved_inv_std_dev"])
    parameters = {name for name, _ in module.named_parameters()}
    return proto, [init.name for init in proto.graph.initializer if init.name in parameters]


def generate_with_ort(directory: Path) -> None:
    """onnxruntime-training's generate_artifacts on an exported model (in the ORT venv; writes temp.onnx to the cwd)."""
    import onnxruntime
    from onnxruntime.training import artifacts as ort_artifacts

    onnxruntime.set_default_logger_severity(3)
    requires_grad = json.loads((directory / "requires_grad.json").read_text())
    ort_artifacts.generate_artifacts(
        str(directory / "base_model.onnx"),
        requires_grad=requires_grad,
        frozen_params=[],
        loss=ort_artifacts.LossType.CrossEntropyLoss,
        optimizer=ort_artifacts.OptimType.AdamW,
        artifact_directory=str(directory),
    )
    print(json.dumps({"generator": f"onnxruntime-training {onnxruntime.__version__}"}))


def generate_with_ours(model: BenchModel, directory: Path) -> None:
    """Export and run this project's generate_artifacts."""
    base, requires_grad = export_base_model(model)
    onnx.save(base, str(directory / "base_model.onnx"))
    generate_ours(base, requires_grad, directory)


def generate_ours(base: onnx.ModelProto, requires_grad: list[str], directory: Path) -> None:
    """This project's generate_artifacts with the benchmarks' loss and optimizer (cross-entropy, AdamW)."""
    from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts

    generate_artifacts(
        base,
        requires_grad=requires_grad,
        frozen_params=[],
        loss=LossType.CrossEntropyLoss,
        optimizer=OptimType.AdamW,
        artifact_directory=directory,
    )


def cache_key(model: BenchModel, generator: str) -> str:
    """A hash of the model spec, the generator, torch's version and this code (models.py, model_artifacts.py)."""
    digest = hashlib.sha256(json.dumps([model.describe(), generator, torch.__version__]).encode())
    for source in ("models.py", "model_artifacts.py"):
        digest.update((HARNESS / source).read_bytes())
    return digest.hexdigest()[:16]


def prepare_artifacts(model: BenchModel, cache: Path, use_ort: bool) -> ArtifactSet:
    """Cached artifacts for ``model``: ORT's when ``use_ort`` and its venv work, else this project's."""
    reason = "--no-ort given" if not use_ort else None
    if use_ort and not ORT_PYTHON.exists():
        reason = f"onnxruntime-training venv not found ({ORT_PYTHON}; `make ort-venv` builds it)"
    if reason is None:
        directory = cache / f"{model.name}-ort-{cache_key(model, 'ort')}"
        try:
            generator = _cached(directory, model, lambda tmp: _run_ort_generator(model, tmp))
            return ArtifactSet(directory, generator, None)
        except RuntimeError as exc:
            reason = f"ORT generate_artifacts failed: {exc}"
    directory = cache / f"{model.name}-ours-{cache_key(model, 'ours')}"
    generator = _cached(directory, model, lambda tmp: _run_our_generator(model, tmp))
    return ArtifactSet(directory, generator, reason)


def _cached(directory: Path, model: BenchModel, make: Callable[[Path], str]) -> str:
    """Make the artifacts and the batch into a temporary sibling, then rename it to ``directory``."""
    done = directory / "generator.json"
    if done.is_file():
        return json.loads(done.read_text())["generator"]
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=directory.name + ".", dir=directory.parent))
    try:
        generator = make(tmp)
        x, y = model.batch_arrays()
        np.save(tmp / "x.npy", x)
        np.save(tmp / "y.npy", y)
        (tmp / "generator.json").write_text(json.dumps({"generator": generator}))
        shutil.rmtree(directory, ignore_errors=True)
        tmp.rename(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return generator


def _run_our_generator(model: BenchModel, directory: Path) -> str:
    generate_with_ours(model, directory)
    return "ort_torch_train"


def _run_ort_generator(model: BenchModel, directory: Path) -> str:
    base, requires_grad = export_base_model(model)
    onnx.save(base, str(directory / "base_model.onnx"))
    (directory / "requires_grad.json").write_text(json.dumps(requires_grad))
    with tempfile.TemporaryDirectory() as cwd:
        proc = subprocess.run(
            [str(ORT_PYTHON), str(Path(__file__).resolve()), str(directory.resolve())],
            capture_output=True,
            text=True,
            cwd=cwd,
            timeout=900,
        )
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["generator"]


if __name__ == "__main__":
    generate_with_ort(Path(sys.argv[1]))
