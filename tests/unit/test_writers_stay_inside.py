"""Every writer in the product, given an output (or a name read from a file) that tries to leave the folder
the user named (a symlink to a file outside, a ``..`` name, an absolute name), refuses and leaves the
victim untouched (``fileio.path_inside``, which ``atomic_write`` applies to every file it writes).

The writers (``grep -rn "atomic_write\\|open(.*[wa]\\|shutil.copy\\|os.replace" ort_torch_train``):
fileio.atomic_write(_bytes); the checkpoint (checkpoint/pair.py, CheckpointState.save_checkpoint); ONNX
models and their external data (export/external_data.py: export_model_for_inferencing, save_model);
LoRA exports (export_unmerged_model, export_adapter, export_peft, export_for_genai); safetensors
(checkpoint/safetensors.py); generate_artifacts (artifacts/generate.py, its prefix); the legacy
session's save_as_onnx; the metrics file (trainer/loggers.JsonlLogger); the CLI's train (--output,
OUTPUT.options.json, --summary, --metrics; a resumed run's saved options: tests/unit/cli/
test_cli_resume_trust.py) and convert; the compile cache's entries (training/compile/cache_store.py;
its library restore keeps inductor's own names: cache_entries._library_target); the native build's
copied headers (native/build.py); a package's program folders (training/package/programs.py, ``fileio.atomic_folder``). TensorBoard and MLflow write inside the folder the user names.
"""

from __future__ import annotations

import importlib
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from ort_torch_train.api import CheckpointState
from ort_torch_train.artifacts import LossType, OptimType, generate_artifacts
from ort_torch_train.checkpoint.odtc import write_checkpoint
from ort_torch_train.checkpoint.safetensors import save_safetensors
from ort_torch_train.errors import PathOutsideError
from ort_torch_train.export.external_data import write_model
from ort_torch_train.fileio import atomic_write_bytes
from ort_torch_train.lora import LoraConfig
from ort_torch_train.lora.export import export_adapter, export_unmerged_model
from ort_torch_train.lora.genai import export_for_genai
from ort_torch_train.lora.peft import export_peft
from ort_torch_train.trainer import JsonlLogger
from ort_torch_train.training.compile.cache_store import CacheStore
from ort_torch_train.training.package.programs import unpack_program
from tests.helpers.legacy_models import params_for, session
from tests.unit.cli.test_cli import ort_case, run_cli, sample_major_npz
from tests.unit.lora.helpers import make_artifacts, mlp, trained

pytest.importorskip("onnxruntime")
VICTIM = b"a file outside the folder, not the product's to write\n"


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("artifacts")
    make_artifacts(folder, LoraConfig(r=2, alpha=4, targets=["0.weight"]))
    return trained(folder, steps=1)


@pytest.fixture(scope="module")
def cnn_data(tmp_path_factory) -> tuple[Path, Path]:
    case = ort_case("cnn")
    return case / "artifacts", sample_major_npz(case, tmp_path_factory.mktemp("data") / "train.npz")


def _cli(capsys, *args: object) -> None:
    code, _, err = run_cli(capsys, *args)
    assert code != 0 and ("symbolic link" in err or "not an ORT checkpoint" in err), err


def _genai(module, target: Path) -> None:
    built = target.parent.parent / "built"
    built.mkdir(exist_ok=True)
    module.export_model_for_inferencing(built / "model.onnx", ["logits"])
    (built / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": target.name}}}))
    export_for_genai(module, built, target.parent)


def _model_with_an_initializer() -> onnx.ModelProto:
    weight = onnx.numpy_helper.from_array(np.ones(16, np.float32), "w")
    node = onnx.helper.make_node("Add", ["x", "w"], ["y"])
    value = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        [node], "g", [value("x", onnx.TensorProto.FLOAT, [16])], [value("y", onnx.TensorProto.FLOAT, [16])], [weight]
    )
    return onnx.helper.make_model(graph)


def _archive() -> bytes:
    """A program archive of one file."""
    data = io.BytesIO()
    with zipfile.ZipFile(data, "w") as archive:
        archive.writestr("archive/data/aotinductor/model/kernel.cpp", "// kernel\n")
    return data.getvalue()


def _train(capsys, cnn_data, target: Path, *flags: object) -> None:
    artifacts, data = cnn_data
    _cli(capsys, "train", artifacts, "--data", data, "--batch-size", 8, "--steps", 1, "--quiet", *flags)


def _writers(module, capsys, cnn_data) -> dict[str, tuple[str, Callable[[Path], object]]]:
    """Writer -> (the file name it writes in the folder, a call writing it)."""
    state = module.training_state
    return {
        "atomic_write_bytes": ("file", lambda p: atomic_write_bytes(p, b"x")),
        "CheckpointState.save_checkpoint": (
            "ckpt",
            lambda p: CheckpointState.save_checkpoint(CheckpointState(state), p),
        ),
        "checkpoint manifest": ("ckpt.manifest", lambda p: write_checkpoint(state.to_record(), p.parent / "ckpt", 0)),
        "checkpoint external data": ("ckpt.data", lambda p: write_checkpoint(state.to_record(), p.parent / "ckpt", 0)),
        "export_model_for_inferencing": ("m.onnx", lambda p: module.export_model_for_inferencing(p, ["logits"])),
        "model external data": (
            "m.onnx.data",
            lambda p: write_model(_model_with_an_initializer(), p.parent / "m.onnx", external_data=True),
        ),
        "export_unmerged_model": ("u.onnx", lambda p: export_unmerged_model(module, p, ["logits"])),
        "export_adapter": ("a.onnx_adapter", lambda p: export_adapter(module, p)),
        "export_peft": ("adapter_model.safetensors", lambda p: export_peft(module, p.parent)),
        "export_peft config": ("adapter_config.json", lambda p: export_peft(module, p.parent)),
        "export_for_genai": ("model.onnx", lambda p: _genai(module, p)),
        "save_safetensors": ("w.safetensors", lambda p: save_safetensors({"w": torch.ones(2)}, p)),
        "generate_artifacts": (
            "checkpoint",
            lambda p: generate_artifacts(
                mlp(),
                example_inputs=(torch.zeros(6, 8),),
                input_names=["features"],
                output_names=["logits"],
                loss=LossType.CrossEntropyLoss,
                optimizer=OptimType.AdamW,
                artifact_directory=p.parent,
            ),
        ),  # fmt: skip
        "legacy save_as_onnx": ("legacy.onnx", lambda p: session(params_for()).save_as_onnx(p)),
        "JsonlLogger": ("metrics.jsonl", lambda p: JsonlLogger(p).log(1, {"loss": 1.0})),
        "compile cache entry": (
            "entry",
            lambda p: CacheStore(p.parent.parent).write("step", "k", "f", b"x"),
        ),
        "package program": ("program", lambda p: unpack_program(_archive(), p)),
        "train --output": ("c", lambda p: _train(capsys, cnn_data, p, "--output", p)),
        "train OUTPUT.options.json": (
            "c.options.json",
            lambda p: _train(capsys, cnn_data, p, "--output", p.parent / "c"),
        ),
        "train --summary": (
            "s.json",
            lambda p: _train(capsys, cnn_data, p, "--output", p.parent / "c", "--summary", p),
        ),
        "train --metrics": (
            "m.jsonl",
            lambda p: _train(capsys, cnn_data, p, "--output", p.parent / "c", "--metrics", p),
        ),
        "convert": (
            "w.pt",
            lambda p: _cli(capsys, "convert", ort_case("cnn") / "artifacts" / "checkpoint", p),
        ),
    }


WRITERS = [
    "atomic_write_bytes", "CheckpointState.save_checkpoint", "checkpoint manifest", "checkpoint external data",
    "export_model_for_inferencing", "model external data", "export_unmerged_model", "export_adapter", "export_peft",
    "export_peft config", "export_for_genai", "save_safetensors", "generate_artifacts", "legacy save_as_onnx",
    "JsonlLogger", "compile cache entry", "package program", "train --output", "train OUTPUT.options.json", "train --summary",
    "train --metrics", "convert",
]  # fmt: skip


@pytest.mark.parametrize("writer", WRITERS)
def test_a_symlink_leading_out_of_the_folder_is_refused(writer, module, capsys, cnn_data, tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    name, write = _writers(module, capsys, cnn_data)[writer]
    folder = tmp_path / "out"
    if writer == "compile cache entry":
        store = CacheStore(tmp_path / "out" / "cache")
        link = store.path_of("step", "k", "f")
    else:
        folder.mkdir()
        link = folder / name
    link.symlink_to(victim)
    try:
        write(link)
    except (PathOutsideError, AssertionError) as error:
        if isinstance(error, AssertionError) and "symbolic link" not in str(error):
            raise
    else:
        if not writer.startswith(("train", "convert")):  # the CLI rows assert their own refusal
            pytest.fail(f"{writer} wrote through {link} -> {victim}")
    assert victim.read_bytes() == VICTIM


def test_the_writers_listed_are_every_writer(module, capsys, cnn_data) -> None:
    assert sorted(WRITERS) == sorted(_writers(module, capsys, cnn_data))


@pytest.mark.parametrize("how", ["dotdot", "absolute"])
def test_names_read_or_given_that_leave_the_folder_are_refused(how, module, tmp_path) -> None:
    victim = tmp_path / "victim.onnx"
    victim.write_bytes(VICTIM)
    name = "../victim.onnx" if how == "dotdot" else str(victim)
    built = tmp_path / "built"
    built.mkdir()
    module.export_model_for_inferencing(built / "model.onnx", ["logits"])
    (built / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": name}}}))
    with pytest.raises(PathOutsideError, match="model.decoder.filename"):
        export_for_genai(module, built, tmp_path / "out")
    prefix = "../victim.onnx-" if how == "dotdot" else str(tmp_path / "victim-")
    with pytest.raises(PathOutsideError, match="prefix"):
        generate_artifacts(str(built / "model.onnx"), artifact_directory=tmp_path / "artifacts", prefix=prefix)
    assert victim.read_bytes() == VICTIM and not list(tmp_path.glob("victim-*"))


def test_the_native_build_replaces_a_link_instead_of_writing_through(tmp_path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "header.h.tmp").symlink_to(victim)
    source = tmp_path / "header.h"
    source.write_text("/* header */\n")
    importlib.import_module("ort_torch_train.native.build")._copy(source, tmp_path / "include" / "header.h")
    assert victim.read_bytes() == VICTIM and (tmp_path / "include" / "header.h").read_text() == "/* header */\n"
    assert np.all([not path.is_symlink() for path in (tmp_path / "include").iterdir()])
