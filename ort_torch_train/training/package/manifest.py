"""What a package of steps (``build.py``) was built from and holds: ``Manifest``, written as ``manifest.json``
beside the step programs and checked, as untrusted input, before any program loads.

A package serves only the artifacts, torch and CPU it was built for: ``check_environment`` and
``check_artifacts`` refuse any other, naming which differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import onnx
import torch

from ort_torch_train.errors import PackageError
from ort_torch_train.fileio import atomic_write_bytes, path_inside, read_regular_file
from ort_torch_train.torch_internals import cpu_features

FORMAT = "ort-torch-train-package/3"  # /2: the programs update their state in place; /3: a flat optimizer program
MANIFEST = "manifest.json"
MANIFEST_LIMIT = 16 * 1024 * 1024  # bytes read of a manifest at most
TRAINING, EVAL, OPTIMIZER = "training_model", "eval_model", "optimizer_model"


@dataclass(frozen=True)
class TensorEntry:
    """One input or parameter of a program: its name, dtype (torch's name) and shape, None for an axis of
    any size (a dynamic one)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]


@dataclass(frozen=True)
class Program:
    """One compiled program of the package: its folder (``file``; a package from before program folders names an
    archive file), its user inputs and its outputs' names."""

    file: str
    inputs: tuple[TensorEntry, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    """A package's record: what it was built from (``artifacts``: model role -> digest, ``torch``, ``machine``,
    ``cpu_capability``, ``cpu_features``), the parameters its programs take, and its ``train``, ``eval`` and ``optimizer``
    programs (the last two None where the artifacts have no such model). The optimizer program runs
    ``optimizer_algorithm`` on the trainable parameters and the ``moments`` of each."""

    artifacts: dict[str, str]
    torch: str
    machine: str
    cpu_capability: str
    cpu_features: tuple[str, ...]
    trainable: tuple[TensorEntry, ...]
    frozen: tuple[TensorEntry, ...]
    eval_parameters: tuple[str, ...]
    train: Program
    eval: Program | None
    optimizer: Program | None
    optimizer_algorithm: str | None
    moments: tuple[str, ...]

    def to_bytes(self) -> bytes:
        """The manifest as JSON."""
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=1, sort_keys=True).encode()

    def write(self, folder: str | os.PathLike) -> None:
        """Write ``manifest.json`` in ``folder``, atomically (the last file a build writes)."""
        atomic_write_bytes(path_inside(folder, MANIFEST, "package manifest"), self.to_bytes())

    @classmethod
    def read(cls, folder: str | os.PathLike) -> Manifest:
        """The manifest of the package in ``folder``; PackageError for a missing, malformed or foreign one."""
        path = Path(folder) / MANIFEST
        if not path.is_file():
            raise PackageError(
                f"package {os.fspath(folder)!r}: no {MANIFEST} (expected a folder written by "
                "`ort-torch-train package`, whose build completed)"
            )
        try:
            data = json.loads(bytes(read_regular_file(path, "package manifest", MANIFEST_LIMIT)))
            found = data.pop("format")
            if found != FORMAT:
                raise PackageError(
                    f"package {os.fspath(folder)!r} is of format {found!r}, this version reads {FORMAT!r}; rebuild "
                    "the package (`ort-torch-train package`)"
                )
            return cls(
                artifacts={str(k): _string(v) for k, v in dict(data["artifacts"]).items()},
                torch=_string(data["torch"]),
                machine=_string(data["machine"]),
                cpu_capability=_string(data["cpu_capability"]),
                cpu_features=tuple(_string(name) for name in data["cpu_features"]),
                trainable=tensor_entries(data["trainable"]),
                frozen=tensor_entries(data["frozen"]),
                eval_parameters=tuple(_string(name) for name in data["eval_parameters"]),
                train=_program(folder, data["train"]),
                eval=None if data["eval"] is None else _program(folder, data["eval"]),
                optimizer=None if data["optimizer"] is None else _program(folder, data["optimizer"]),
                optimizer_algorithm=None
                if data["optimizer_algorithm"] is None
                else _string(data["optimizer_algorithm"]),
                moments=tuple(_string(name) for name in data["moments"]),
            )
        except PackageError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise PackageError(f"package {os.fspath(folder)!r}: malformed {MANIFEST} ({error!r})") from None


def model_digest(model: onnx.ModelProto) -> str:
    """The sha256 of ``model``'s deterministic serialisation (a file's model and the same model loaded agree)."""
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


def environment() -> dict[str, str]:
    """This process's torch version, CPU architecture and the CPU capability torch's kernels use."""
    return {
        "torch": torch.__version__,
        "machine": platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def cpu_features_here() -> tuple[str, ...]:
    """The CPU features torch reports here (``torch_internals.cpu_features``)."""
    return tuple(cpu_features())


def check_environment(manifest: Manifest, folder: str | os.PathLike) -> None:
    """Refuse a package built with another torch or for another CPU (another architecture or capability, or
    features this one lacks), naming which."""
    here = environment()
    for key, what in (("torch", "torch version"), ("machine", "CPU architecture"), ("cpu_capability", "CPU")):
        built = getattr(manifest, key)
        if built != here[key]:
            raise PackageError(
                f"package {os.fspath(folder)!r} was built for another {what}: {built!r}, this process has "
                f"{here[key]!r}; build it again here (`ort-torch-train package`)"
            )
    missing = sorted(set(manifest.cpu_features) - set(cpu_features_here()))
    if missing:
        raise PackageError(
            f"package {os.fspath(folder)!r} was built for a CPU with features this CPU lacks: {missing}; build it "
            "again here (`ort-torch-train package`)"
        )


def check_artifacts(manifest: Manifest, folder: str | os.PathLike, models: dict[str, onnx.ModelProto | None]) -> None:
    """Refuse a package built from other artifacts than ``models`` (role -> model, None: not given), naming
    the model that differs."""
    for role, model in models.items():
        built = manifest.artifacts.get(role)
        given = None if model is None else model_digest(model)
        if given is not None and built != given:
            raise PackageError(
                f"package {os.fspath(folder)!r} was built from other artifacts: its {role} has digest "
                f"{built!r}, the one given {given!r}; build it again from these artifacts"
            )


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def tensor_entries(values: object) -> tuple[TensorEntry, ...]:
    """The entries of a JSON list of tensors (``asdict`` of each); TypeError or ValueError for a malformed one."""
    if not isinstance(values, list):
        raise TypeError(f"expected a list of tensors, got {values!r}")
    entries = []
    for value in values:
        shape = tuple(value["shape"])
        if not all(axis is None or (isinstance(axis, int) and axis >= 0) for axis in shape):
            raise ValueError(f"shape of {value['name']!r}: expected sizes >= 0 or null, got {list(shape)}")
        entries.append(TensorEntry(_string(value["name"]), _string(value["dtype"]), shape))
    return tuple(entries)


def _program(folder: str | os.PathLike, value: dict) -> Program:
    file = _string(value["file"])
    path = path_inside(folder, file, "package program")
    if not (path.is_dir() or path.is_file()):
        raise PackageError(f"package {os.fspath(folder)!r}: its program {file!r} is missing")
    return Program(file, tensor_entries(value["inputs"]), tuple(_string(name) for name in value["outputs"]))
