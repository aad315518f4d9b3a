"""What the CLI commands share: the user-error type, finding artifact files, describing ONNX values."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from ort_torch_train.checkpoint.summary import CheckpointSummary, summarize_checkpoint
from ort_torch_train.cli.errors import CliError
from ort_torch_train.elem_types import ELEM_DTYPES, elem_type_name
from ort_torch_train.errors import CheckpointError
from ort_torch_train.graph.layout import GRAD_BUFFER_SUFFIX, declared_shape, load_model
from ort_torch_train.graph.roles import model_role

if TYPE_CHECKING:
    from ort_torch_train.state.training_state import TrainingState

Shape = list[int | str | None] | None


@dataclass
class ArtifactPaths:
    """The artifact files of one training setup (None where absent)."""

    training_model: Path | None = None
    eval_model: Path | None = None
    optimizer_model: Path | None = None
    checkpoint: Path | None = None

    def found(self) -> dict[str, str]:
        """Role -> path of each file present."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) is not None}

    def require(self, role: str, source: str) -> Path:
        """The path of ``role``, or a CliError naming the file expected in ``source``."""
        path = getattr(self, role)
        if path is None:
            raise CliError(f"{source}: no {ARTIFACT_FILE_NAMES[role]} found")
        return path


ARTIFACT_FILE_NAMES = {
    "training_model": "training_model.onnx",
    "eval_model": "eval_model.onnx",
    "optimizer_model": "optimizer_model.onnx",
    "checkpoint": "checkpoint",
}


def existing_file(path: str | Path, what: str) -> Path:
    """``path`` as a Path, or a CliError when it is missing or a directory."""
    path = Path(path)
    if not path.exists():
        raise CliError(f"{what} not found: {str(path)!r}")
    if path.is_dir():
        raise CliError(f"{what} {str(path)!r} is a directory, expected a file")
    return path


def find_artifacts(directory: str | Path) -> ArtifactPaths:
    """The standard artifact files (as ``generate_artifacts`` names them) inside ``directory``."""
    directory = Path(directory)
    if not directory.exists():
        raise CliError(f"artifacts folder not found: {str(directory)!r}")
    if not directory.is_dir():
        raise CliError(f"{str(directory)!r} is not a folder (expected the folder holding the artifacts)")
    paths = ArtifactPaths()
    for role, name in ARTIFACT_FILE_NAMES.items():
        candidates = [name] if role == "checkpoint" else [name, name.replace(".onnx", ".ort")]
        found = next((directory / candidate for candidate in candidates if (directory / candidate).is_file()), None)
        if found is not None:
            setattr(paths, role, found)
    if not paths.found():
        hint = f" (did you mean {str(directory / 'artifacts')!r}?)" if (directory / "artifacts").is_dir() else ""
        names = ", ".join(ARTIFACT_FILE_NAMES.values())
        raise CliError(f"{str(directory)!r} holds none of {names} (or the models' .ort forms){hint}")
    return paths


def classify_paths(paths: list[str]) -> ArtifactPaths:
    """Artifact files given one by one (or one folder): models (.onnx, .ort) by their graphs, others as checkpoints."""
    if len(paths) == 1 and Path(paths[0]).is_dir():
        return find_artifacts(paths[0])
    found = ArtifactPaths()
    for text in paths:
        if Path(text).is_dir():
            raise CliError(f"{text!r} is a folder: give one artifacts folder, or individual files")
        path = existing_file(text, "artifact file")
        is_model = path.suffix in (".onnx", ".ort")
        role = model_role(load_onnx(path, "ONNX model")) if is_model else "checkpoint"
        if getattr(found, role) is not None:
            raise CliError(
                f"two files given as the {role.replace('_', ' ')}: {str(getattr(found, role))!r} and {text!r}"
            )
        setattr(found, role, path)
    return found


def load_training_state(path: Path) -> TrainingState:
    """An ORT checkpoint, or a CliError naming the file when it is none."""
    from ort_torch_train.state.training_state import TrainingState  # torch: imported by the commands that train

    path = existing_file(path, "checkpoint")
    try:
        return TrainingState.load(path)
    except CheckpointError as error:
        raise CliError(f"{str(path)!r} is not a readable ORT checkpoint: {error}") from error


def load_trained_artifacts(
    source: str, checkpoint: str | Path | None, action: str
) -> tuple[onnx.ModelProto, onnx.ModelProto, Path, TrainingState]:
    """The training and eval models of the artifacts ``source``, the checkpoint's path (``checkpoint`` when
    given, else the artifacts') and its state; a CliError for a nominal checkpoint, which has no values to
    ``action`` ("evaluate", "export")."""
    paths = find_artifacts(source)
    training_model = load_onnx(paths.require("training_model", source), "training model")
    eval_model = load_onnx(paths.require("eval_model", source), "eval model")
    path = existing_file(checkpoint, "checkpoint") if checkpoint else paths.require("checkpoint", source)
    state = load_training_state(path)
    if state.is_nominal:
        raise CliError(f"{str(path)!r} is a nominal checkpoint (no parameter values): {action} a complete one")
    return training_model, eval_model, path, state


def load_checkpoint_summary(path: Path) -> CheckpointSummary:
    """What an ORT checkpoint holds (read without torch), or a CliError naming the file when it is none."""
    path = existing_file(path, "checkpoint")
    try:
        return summarize_checkpoint(path)
    except CheckpointError as error:
        raise CliError(f"{str(path)!r} is not a readable ORT checkpoint: {error}") from error


def load_onnx(path: Path, what: str) -> onnx.ModelProto:
    """An ONNX model, or a CliError when the file is no readable ONNX model."""
    path = existing_file(path, what)
    try:
        return load_model(path, what)
    except Exception as error:  # onnx raises DecodeError, ValueError, ...; all mean "not an ONNX model"
        raise CliError(f"{str(path)!r} is not a readable ONNX model ({str(error).splitlines()[0]})") from error


def trainable_names_of(training_model: onnx.ModelProto) -> list[str]:
    """The parameters a training model computes gradients for (those with an accumulation buffer)."""
    names = [value.name for value in training_model.graph.input]
    return [name for name in names if name + GRAD_BUFFER_SUFFIX in names]


def value_dtype(value: onnx.ValueInfoProto) -> str:
    """A value's element type as numpy/torch name it (float32, int64, ...), or its ONNX type text."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return onnx.helper.printable_type(value.type) or "unknown"
    code = value.type.tensor_type.elem_type
    return ELEM_DTYPES[code].name if code in ELEM_DTYPES else elem_type_name(code).lower()


def value_shape(value: onnx.ValueInfoProto) -> Shape:
    """Declared dims (int, symbolic name or None), or None when the rank is unknown."""
    if value.type.WhichOneof("value") != "tensor_type":
        return None
    dims = declared_shape(value)
    return None if dims is None else list(dims)


def shape_text(shape: Shape) -> str:
    """``[batch, 1, 12, 12]``; ``?`` for an unknown dim or rank."""
    if shape is None:
        return "?"
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def short_float(value: float) -> float:
    """The shortest decimal that reads back as the same float32 (0.8999999761 -> 0.9)."""
    return float(str(np.float32(value)))
