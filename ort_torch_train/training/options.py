"""One training engine configuration, validated once: ``EngineOptions``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ort_torch_train.adapters.registry import OpLibrary
from ort_torch_train.distributed.adasum import check_gradient_combination
from ort_torch_train.distributed.data_parallel import require_process_group
from ort_torch_train.distributed.pipeline_plan import PipelineOptions
from ort_torch_train.errors import DistributedError
from ort_torch_train.training.binding import parse_device
from ort_torch_train.training.compile.cache import CompileCacheSetting
from ort_torch_train.training.compile.settings import CompileSetting, compile_arguments
from ort_torch_train.training.dynamic_shapes import DynamicSetting, dynamic_setting
from ort_torch_train.training.package.on_demand import ahead_of_time
from ort_torch_train.training.package.packaged import package_folder
from ort_torch_train.training.package.step_programs import ProgramsSource
from ort_torch_train.training.precision import check_mixed_precision
from ort_torch_train.training.recompute import RecomputeSetting, recompute_segments
from ort_torch_train.training.recompute_patterns import RecomputePlan

if TYPE_CHECKING:
    from ort_torch_train.distributed.tensor_parallel import TensorParallel

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
        pipeline: the train step run as a pipeline across the ranks of ``pipeline_group``
            (``distributed/pipeline.py``), or None.
        pipeline_group: the pipeline's process group (the default one unless ``process_group`` names one).
        custom_ops: the session's own operators (``adapters.OpLibrary``: a custom-op library registered
            through the C API), converted before the registry's, or None.
        tensor_parallel: the ``(dp, tp)`` mesh whose tp ranks share Megatron's weight pairs
            (``distributed/tensor_parallel.py``), or None; with it, ``process_group`` is the mesh's dp group.
        sharding: "zero2" or "zero3" (FSDP2, ``distributed/fully_sharded.py``; implies ``distributed``;
            ``recompute`` True recomputes each layer unit; compiled, each unit's stretch compiles on its own,
            its checkpoint inside), or None.
        programs: where the steps' programs compiled ahead of time come from (``training/package/``), which
            the train, eval and optimizer steps run through instead of the engine's own, or None:
            ``compile="package:DIR"`` a package's folder, ``compile="aot"`` programs compiled on demand into
            the compile cache ``compile_cache`` names.


    Valid combinations: every field with every other, except that ``loss_scale`` needs "fp16", a
    process group needs ``distributed`` or ``pipeline``, "adasum" needs ``distributed`` and eager steps,
    ``pipeline`` takes eager steps in float32 without recompute and without ``distributed``, ``sharding``
    takes averaged gradients and ``recompute`` None, True or a legacy session's ``RecomputePlan`` (not a
    segment count: segments would cross the layer units), and programs compiled ahead of time (a package,
    "aot") run on the CPU in float32, one process, no recompute. Compiled with recompute, the train step is not one graph:
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
    pipeline: PipelineOptions | None = None
    pipeline_group: Any = None
    custom_ops: OpLibrary | None = None
    tensor_parallel: TensorParallel | None = None
    sharding: str | None = None
    programs: ProgramsSource | None = None

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
        pipeline: PipelineOptions | None = None,
        custom_ops: OpLibrary | None = None,
        tensor_parallel_size: int = 1,
        sharding: str | None = None,
    ) -> EngineOptions:
        """Checked options from a face's arguments (``Module``'s names); raises naming the bad argument."""
        programs: ProgramsSource | None = package_folder(compile) or ahead_of_time(compile, compile_cache)
        arguments = None if programs is not None else compile_arguments(compile)
        several = distributed or sharding is not None or pipeline is not None or tensor_parallel_size != 1
        if programs is not None and (not _names_cpu(device) or mixed_precision or recompute or several):
            what = "programs compiled ahead of time run" if compile == "aot" else "a package runs"
            raise ValueError(
                f"compile={compile!r}: {what} on the CPU in float32, in one process, without recompute; "
                f"got device={device!r}, mixed_precision={mixed_precision!r}, recompute={recompute!r}, "
                f"distributed={distributed!r}, sharding={sharding!r}, pipeline={pipeline!r}, "
                f"tensor_parallel_size={tensor_parallel_size!r}"
            )
        target = parse_device(device)
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
        pipeline_group = _pipeline_group(pipeline, process_group, distributed, arguments, mixed_precision, recompute)
        group = None
        sharded = None
        if sharding is not None:  # FSDP2 and DTensor load Dynamo's shape machinery: imported when asked for
            from ort_torch_train.distributed.fully_sharded import check_sharding

            sharded = check_sharding(sharding)
        if sharded is not None:
            if pipeline is not None or tensor_parallel_size != 1:
                raise ValueError(
                    f"sharding: {sharded!r} with pipeline={pipeline!r}, tensor_parallel_size={tensor_parallel_size!r}: "
                    "sharded data parallelism does not compose with pipeline or tensor parallelism yet"
                )
            if gradient_combination != "average":
                raise ValueError(
                    f"sharding: {sharded!r} averages the gradients; got gradient_combination="
                    f"{gradient_combination!r} (docs/scaling.md, Sharded training)"
                )
            if plan and plan is not True and not isinstance(plan, RecomputePlan):  # a segment count
                raise ValueError(
                    f"sharding: {sharded!r} recomputes per layer unit: expected recompute=True (each unit's "
                    "activations recomputed in its backward), a legacy session's recompute settings or None; "
                    f"got {recompute!r}"
                )
            distributed = True
        if distributed:
            group = require_process_group(process_group, "Module(distributed=True)")
        elif process_group is not None and pipeline is None:
            raise DistributedError("Module: process_group is given but distributed is False; pass distributed=True")
        combination = check_gradient_combination(gradient_combination)
        tensor_parallel = None
        if tensor_parallel_size is not True and tensor_parallel_size != 1:  # DTensor: imported when asked for
            from ort_torch_train.distributed.tensor_parallel import TensorParallel, check_tensor_parallel_size

            check_tensor_parallel_size(tensor_parallel_size)
            if pipeline is not None:
                raise ValueError(
                    f"tensor_parallel_size={tensor_parallel_size} with pipeline={pipeline!r}: expected one of "
                    "tensor parallel and pipeline parallel; the two do not compose yet"
                )
            if process_group is not None or arguments is not None:
                raise ValueError(
                    f"tensor_parallel_size={tensor_parallel_size}: expected eager steps (compile=False) over the "
                    f"default process group (process_group=None); got compile={compile!r}, "
                    f"process_group={process_group!r}"
                )
            tensor_parallel = TensorParallel(tensor_parallel_size, distributed, target)
            group = tensor_parallel.data_parallel_group
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
        if custom_ops is not None and not isinstance(custom_ops, OpLibrary):
            raise TypeError(
                f"custom_ops: expected an ort_torch_train.adapters.OpLibrary or None, got {type(custom_ops).__name__}"
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
            pipeline,
            pipeline_group,
            custom_ops,
            tensor_parallel,
            sharded,
            programs,
        )

    @property
    def distributed(self) -> bool:
        """Whether gradients are averaged across the ranks of a process group."""
        return self.process_group is not None

    @property
    def compiles_whole_step(self) -> bool:
        """Whether a train step (forward, backward, and the update with ``train_and_update``) is one
        compiled graph; else only the forward graphs compile, if anything does."""
        return self.compile_arguments is not None and self.recompute is None and self.sharding is None

    @property
    def train_forward_compile_arguments(self) -> dict[str, Any] | None:
        """torch.compile's arguments for the train forward compiled alone (with recompute), else None.

        Inductor's C++ wrapper cannot generate checkpoint's RNG replay: it is off unless a mode or another
        backend (which takes no inductor options) is asked for.
        """
        if self.compile_arguments is None or self.recompute is None or self.sharding is not None:
            return None
        arguments = dict(self.compile_arguments)
        if "mode" not in arguments and arguments.get("backend", "inductor") == "inductor":
            arguments["options"] = {"cpp_wrapper": False, **(arguments.get("options") or {})}
        return arguments


def _names_cpu(device: str | torch.device) -> bool:
    """Whether ``device`` names the CPU (a malformed one too: ``parse_device`` reports it)."""
    try:
        return torch.device(device).type == "cpu"
    except (RuntimeError, TypeError):
        return True


def _pipeline_group(
    pipeline: PipelineOptions | None,
    process_group: Any,
    distributed: bool,
    compile_arguments: Mapping[str, Any] | None,
    mixed_precision: str | None,
    recompute: object,
) -> Any:
    """The process group a ``pipeline`` runs on (None without one); raises for options it does not take."""
    if pipeline is None:
        return None
    if not isinstance(pipeline, PipelineOptions):
        raise ValueError(
            f"pipeline: expected an ort_torch_train.distributed.pipeline_plan.PipelineOptions, got {type(pipeline).__name__}"
        )
    taken = {
        "distributed": distributed,
        "compile": compile_arguments is not None,
        "mixed_precision": mixed_precision is not None,
        "recompute": bool(recompute),
    }
    refused = [name for name, given in taken.items() if given]
    if refused:
        raise ValueError(f"pipeline: runs eager float32 steps without data parallelism or recompute; got {refused}")
    return require_process_group(process_group, "Module(pipeline=...)")
