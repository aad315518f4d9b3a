"""One training engine configuration, validated once: ``EngineOptions``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ort_torch_train.distributed.adasum import check_gradient_combination
from ort_torch_train.distributed.data_parallel import require_process_group
from ort_torch_train.errors import DistributedError
from ort_torch_train.training.binding import parse_device
from ort_torch_train.training.compile.cache import CompileCacheSetting
from ort_torch_train.training.compile.settings import CompileSetting, compile_arguments
from ort_torch_train.training.dynamic_shapes import DynamicSetting, dynamic_setting
from ort_torch_train.training.package.packaged import package_folder
from ort_torch_train.training.precision import check_mixed_precision
from ort_torch_train.training.recompute import RecomputeSetting, recompute_segments
from ort_torch_train.training.recompute_patterns import RecomputePlan

Recompute = int | bool | RecomputePlan | None


@dataclass(frozen=True)
class EngineOptions:
    """How a TrainingEngine runs its steps; build it with ``EngineOptions.of``, which checks every field.

    Fields:
        device: where the parameters live and the steps run.
        compile_arguments: torch.compile's keyword arguments (None: eager).
        mixed_precision: "bf16" or "fp16" autocast with float32 master weights, or None.
        loss_scale: fp16's loss scale: 0 dynamic (GradScaler's semantics), > 0 that static scale.
        recompute: activations recomputed in backward: a segment count, True (about sqrt(op count)
            segments), a legacy session's ``RecomputePlan`` of patterns, or None.
        process_group: the data-parallel group whose ranks average gradients, or None (one process).
        compile_cache: where compiled steps are saved and loaded (``training/compile/cache.py``):
            None the default directory (or the one ``load_compile_cache`` chose), a path that
            directory, False none; the engine resolves it once, into the cache it holds.
        dynamic: which input axes a compiled step takes at any size (``training/dynamic_shapes.py``):
            True every axis the ONNX graph leaves symbolic, a dict those axes by input name, False none
            (each new input shape compiles a step of its own).
        gradient_combination: how the ranks' gradients combine: "average" or "adasum"
            (``distributed/adasum.py``).
        package: the folder of a package of steps compiled ahead of time (``training/package/``), which
            the train and eval steps run through instead of compiling, or None; ``compile="package:DIR"``.

    Valid combinations: every field with every other, except that ``loss_scale`` needs "fp16", a
    process group needs ``distributed``, "adasum" needs ``distributed`` and eager steps, and a package
    runs on the CPU in float32, one process, no recompute. Compiled with recompute, the train step is not one graph:
    the train forward compiles alone (torch.func's one-graph step refuses checkpoint's saved-tensor
    hooks), its backward runs through autograd and the optimizer update after it.
    """

    device: torch.device
    compile_arguments: Mapping[str, Any] | None
    mixed_precision: str | None
    loss_scale: float
    recompute: Recompute
    process_group: Any
    compile_cache: CompileCacheSetting = None
    dynamic: bool | Mapping[str, tuple[int, ...]] = True
    gradient_combination: str = "average"
    package: Path | None = None

    @classmethod
    def of(
        cls,
        *,
        device: str | torch.device = "cpu",
        compile: CompileSetting = False,
        mixed_precision: str | None = None,
        loss_scale: float = 0.0,
        recompute: RecomputeSetting | RecomputePlan = None,
        distributed: bool = False,
        process_group: Any = None,
        compile_cache: CompileCacheSetting = None,
        dynamic: DynamicSetting = True,
        gradient_combination: str = "average",
    ) -> EngineOptions:
        """Checked options from a face's arguments (``Module``'s names); raises naming the bad argument."""
        target = parse_device(device)
        package = package_folder(compile)
        arguments = None if package is not None else compile_arguments(compile)
        if package is not None and (target.type != "cpu" or mixed_precision or recompute or distributed):
            raise ValueError(
                f"compile={compile!r}: a package runs on the CPU in float32, in one process, without recompute; "
                f"got device={device!r}, mixed_precision={mixed_precision!r}, recompute={recompute!r}, "
                f"distributed={distributed!r}"
            )
        check_mixed_precision(mixed_precision)
        try:
            scale = float(loss_scale)
        except (TypeError, ValueError):
            raise ValueError(f"loss_scale: expected a number >= 0 (0: dynamic), got {loss_scale!r}") from None
        if not scale >= 0:
            raise ValueError(f"loss_scale: expected a number >= 0 (0: dynamic), got {loss_scale!r}")
        if scale != 0 and mixed_precision != "fp16":
            raise ValueError(f"loss_scale: {loss_scale!r} needs mixed_precision 'fp16'; got {mixed_precision!r}")
        plan: Recompute = recompute if isinstance(recompute, RecomputePlan) else recompute_segments(recompute)
        group = None
        if distributed:
            group = require_process_group(process_group, "Module(distributed=True)")
        elif process_group is not None:
            raise DistributedError("Module: process_group is given but distributed is False; pass distributed=True")
        combination = check_gradient_combination(gradient_combination)
        if combination == "adasum" and (group is None or arguments is not None):
            raise ValueError(
                "gradient_combination: 'adasum' needs distributed=True and eager steps (compile=False); got "
                f"distributed={distributed!r}, compile={compile!r}"
            )
        named = isinstance(compile_cache, (str, os.PathLike)) and bool(os.fspath(compile_cache))
        if not (compile_cache is None or compile_cache is False or named):
            raise ValueError(
                f"compile_cache: expected a directory, None (the default one) or False; got {compile_cache!r}"
            )
        return cls(
            target,
            arguments,
            mixed_precision,
            scale,
            plan or None,
            group,
            compile_cache,
            dynamic_setting(dynamic),
            combination,
            package,
        )

    @property
    def distributed(self) -> bool:
        """Whether gradients are averaged across the ranks of a process group."""
        return self.process_group is not None

    @property
    def compiles_whole_step(self) -> bool:
        """Whether a train step (forward, backward, and the update with ``train_and_update``) is one
        compiled graph; else only the forward graphs compile, if anything does."""
        return self.compile_arguments is not None and self.recompute is None

    @property
    def train_forward_compile_arguments(self) -> dict[str, Any] | None:
        """torch.compile's arguments for the train forward compiled alone (with recompute), else None.

        Inductor's C++ wrapper cannot generate checkpoint's RNG replay: it is off unless a mode is asked for.
        """
        if self.compile_arguments is None or self.recompute is None:
            return None
        arguments = dict(self.compile_arguments)
        if "mode" not in arguments:
            arguments["options"] = {"cpp_wrapper": False, **(arguments.get("options") or {})}
        return arguments
